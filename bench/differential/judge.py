"""A case's trace against its reference traces: the differences a client could see, each named by field.

Exchanges are paired by key (method and route): within a key, an exchange is paired with a reference exchange
whose request was the same, else with the one at the same place among that key's exchanges. An exchange of a key
the reference never made, or a reference exchange the case did not make, is no difference here (a case's own
assertions judge what it calls); a paired exchange is compared field by field (bench/differential/policy.py):
its status, each leaf of its JSON answer (a leaf E2B gives that is missing, or one E2B never gives, is a
difference), a stream's messages (their order, then each message's leaves: when the reference runs disagree on the
order, the messages are compared as one multiset of leaves), and a body's size and digest.
"""

from __future__ import annotations

import itertools
import json
import re
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from .policy import Rule, accepts, inferred, is_time, json_type, parse_time, rule_for, same

MAX_DIFFERENCES = 20
_OUTPUT = ("stdout", "stderr", "pty")
PROBE_SLACK_S = 5.0  # a probe's moments: off by its exchange's own time and this
SHOWN_CHARS = 120


@dataclass(frozen=True)
class Difference:
    field: str
    expected: Any
    got: Any
    why: str

    def text(self) -> str:
        return f"{self.field} expected {_shown(self.expected)} got {_shown(self.got)} ({self.why})"

    def as_dict(self) -> dict[str, Any]:
        return {"field": self.field, "expected": self.expected, "got": self.got, "why": self.why}


def _shown(value: Any) -> str:
    text = json.dumps(value, ensure_ascii=False) if not isinstance(value, str) or not value.startswith("<") else value
    return text if len(text) <= SHOWN_CHARS else text[: SHOWN_CHARS - 1] + "…"


@dataclass
class Judge:
    rules: list[Rule]
    delta_s: float

    def differences(self, refs: list[list[dict[str, Any]]], trace: list[dict[str, Any]]) -> list[Difference]:
        """What `trace` shows that no reference run shows (at most MAX_DIFFERENCES)."""
        found: list[Difference] = []
        keyed = [_by_key(ref) for ref in refs]
        for key, exchanges in _by_key(trace).items():
            candidates = [ref.get(key, []) for ref in keyed]
            if not any(candidates):
                continue
            used: list[set[int]] = [set() for _ in candidates]
            for index, got in enumerate(exchanges):
                pairs = zip(candidates, used, strict=False)
                paired = [ex for ex in (_pair(got, index, cands, taken) for cands, taken in pairs) if ex is not None]
                if paired:
                    found.extend(self._exchange(key, paired, got))
                if len(found) >= MAX_DIFFERENCES:
                    return found[:MAX_DIFFERENCES]
        return found

    def _exchange(self, key: str, refs: list[dict[str, Any]], got: dict[str, Any]) -> list[Difference]:
        found = []
        why = self._value(f"{key} status", [ref.get("status") for ref in refs], got.get("status"), None, [])
        if why:
            found.append(Difference(f"{key} status", refs[0].get("status"), got.get("status"), why))
        at = parse_time(got.get("at", ""))
        for part in ("answer", "probe"):
            having = [ref for ref in refs if isinstance(ref.get(part), dict)]
            answers: list[dict[str, Any]] = [ref[part] for ref in having]
            mine = got.get(part)
            if not answers or not isinstance(mine, dict):
                continue
            prefix = key if part == "answer" else f"{key} probe"
            judge = self
            if part == "probe":  # looked at right after the call: a moment it set is off by the exchange's time only
                took = (_ms(got) + max(_ms(ref) for ref in having)) / 1000
                judge = Judge(self.rules, min(self.delta_s, PROBE_SLACK_S + took))
            found.extend(judge._answer(prefix, answers, mine, at, [parse_time(ref.get("at", "")) for ref in having]))
        return found

    def _answer(self, key: str, refs: list[dict[str, Any]], got: dict[str, Any], at: datetime | None,
                ref_ats: list[datetime | None]) -> list[Difference]:  # fmt: skip
        if any(message == {"cut": True} for answer in (got, *refs) for message in answer.get("messages") or []):
            return []  # a stream too long to keep whole (bench/differential/capture.py): not judged
        if ("messages" in got and any("body" in ref for ref in refs)) or ("body" in got and any(
                "messages" in ref for ref in refs)):  # fmt: skip
            return []  # a stream kept whole in one run and too long in another: its size is timing
        if "leaves" in got and all("leaves" in ref for ref in refs):
            return self._leaves(key, [ref["leaves"] for ref in refs], got["leaves"], at, ref_ats)
        if "messages" in got and all("messages" in ref for ref in refs):
            return self._messages(key, [ref["messages"] for ref in refs], got["messages"], at, ref_ats)
        if "body" in got and all("body" in ref for ref in refs):
            found = []
            for name in ("bytes", "sha256"):
                field = f"{key} body.{name}"
                values = [ref["body"].get(name) for ref in refs]
                why = self._value(field, values, got["body"].get(name), None, [])
                if why:
                    found.append(Difference(field, values[0], got["body"].get(name), why))
            return found
        expected = "/".join(sorted({next(iter(ref), "nothing") for ref in refs}))
        return [Difference(f"{key} answer", f"<{expected}>", f"<{next(iter(got), 'nothing')}>", "another kind of body")]

    def _messages(self, key: str, refs: list[list[dict[str, Any]]], got: list[dict[str, Any]], at: datetime | None,
                  ref_ats: list[datetime | None]) -> list[Difference]:  # fmt: skip
        field = f"{key} messages"
        policy = rule_for(field, self.rules)
        got = self._kept(key, got)
        refs = [self._kept(key, ref) for ref in refs]
        if any(_cut(messages) for messages in (got, *refs)):
            return []  # a stream cut short (a kill, a timeout, an error): what it carried by then is timing
        shapes = [[_shape(message) for message in ref] for ref in refs]
        mine = [_shape(message) for message in got]
        ordered = policy not in ("unordered", "set")
        if ordered and all(shape == shapes[0] for shape in shapes) and mine != shapes[0]:
            # the messages that are not output come in E2B's order; output of stdout and stderr interleaves
            # as E2B's did, give or take what a busy host joins (at least half as many turns between them)
            others = [[shape for shape in shapes_ if not _output(shape)] for shapes_ in (shapes[0], mine)]
            turns = [_turns(shapes_) for shapes_ in (shapes[0], mine)]
            if set(mine) == set(shapes[0]) and (others[0] != others[1] or turns[1] * 2 < turns[0]):
                return [Difference(field, _order(shapes[0]), _order(mine), "the messages arrive in another order")]
        return self._leaves(key, [_pooled(ref) for ref in refs], _pooled(got), at, ref_ats, pooled=True)

    def _kept(self, key: str, messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
        kept = []
        for message in messages:
            left = {path: value for path, value in message.items() if rule_for(f"{key} {path}", self.rules) != "ignore"}
            if left:
                kept.append(left)
        return kept

    def _leaves(self, key: str, refs: list[dict[str, Any]], got: dict[str, Any], at: datetime | None,
                ref_ats: list[datetime | None], pooled: bool = False) -> list[Difference]:  # fmt: skip
        found = []
        for path in sorted(set(got).union(*refs)):
            field = f"{key} {path}"
            policy = rule_for(field, self.rules)
            if policy == "ignore":
                continue
            if policy == "items" and (path not in got or not any(path in ref for ref in refs)):
                continue  # a list's items are whatever else runs: which fields they have is theirs
            values = [ref[path] for ref in refs if path in ref]
            ats = [ref_at for ref, ref_at in zip(refs, ref_ats, strict=False) if path in ref]
            if path not in got:
                if len(values) == len(refs) and not all(_empty(value) for value in values):
                    found.append(Difference(field, values[0], "<missing>", "a field E2B gives is missing"))
                continue
            if not values:
                if not _empty(got[path]):
                    found.append(Difference(field, "<absent>", got[path], "a field E2B never gives"))
                continue
            if pooled and not policy and len(values) < len(refs):
                continue  # present in some reference runs only: its messages came in another order
            why = self._value(field, values, got[path], at, ats, policy, pooled)
            if why:
                found.append(Difference(field, values[0], got[path], why))
        return found

    def _value(self, field: str, refs: list[Any], got: Any, at: datetime | None, ref_ats: list[datetime | None],
               policy: str | None = None, pooled: bool = False) -> str | None:  # fmt: skip
        policy = policy or rule_for(field, self.rules)
        if policy == "ignore":
            return None
        if isinstance(got, list) or any(isinstance(ref, list) for ref in refs):
            why = self._array(refs, got, at, ref_ats, policy, pooled)
        else:
            if policy is None:  # a time is judged as one (offset, precision) even when the reference runs agree on it
                varies = not all(same(ref, refs[0]) for ref in refs)
                policy = inferred(refs) if varies or all(is_time(ref) for ref in refs) else "exact"
            why = accepts(policy, refs, got, at, ref_ats, self.delta_s)
        if why and field.rsplit(".", 1)[-1] in _OUTPUT and _lines(got) in [_lines(ref) for ref in refs]:
            return None  # a command's lines in another order (a directory's entries come in the filesystem's order)
        if why and field.endswith("message") and _digitless(got) in [_digitless(ref) for ref in refs]:
            return None  # an error's words with other numbers in them (a pid, a port, a size): the same words
        return why

    def _array(self, refs: list[Any], got: Any, at: datetime | None, ref_ats: list[datetime | None],
               policy: str | None, pooled: bool) -> str | None:  # fmt: skip
        if not isinstance(got, list) or not all(isinstance(ref, list) for ref in refs):
            return f"a {json_type(got)} where E2B gives a {json_type(refs[0])}"
        if policy == "set":
            distinct = {json.dumps(item, sort_keys=True) for item in got}
            sets = [{json.dumps(item, sort_keys=True) for item in ref} for ref in refs]
            return None if distinct in sets else "other values than E2B gives"
        if policy == "items":
            return self._each_item("type", refs, ref_ats, got, at)
        ordered = [_sorted(ref) for ref in refs]
        mine = _sorted(got)
        stable = all(len(ref) == len(ordered[0]) and all(map(same, ref, ordered[0])) for ref in ordered)
        if policy in (None, "exact", "unordered") and stable:
            if len(mine) == len(ordered[0]) and all(map(same, mine, ordered[0])):
                return None
            if len(mine) != len(ordered[0]):
                return f"{len(mine)} item(s) where E2B gives {len(ordered[0])}"
            if policy is not None or not all(is_time(item) for item in mine):
                return "other items"
        lengths = {len(ref) for ref in refs}
        if len(lengths) == 1 and len(mine) not in lengths and policy != "type" and not pooled:
            return f"{len(mine)} item(s) where E2B gives {lengths.pop()}"
        return self._each_item(policy if policy not in (None, "exact", "unordered") else None, refs, ref_ats, mine, at)

    def _each_item(
        self, policy: str | None, refs: list[Any], ref_ats: list[datetime | None], got: list[Any], at: datetime | None
    ) -> str | None:
        """Each distinct item of `got` judged by `policy` (None: the one E2B's items show, `type` when they are all
        one value) against the distinct items of every reference run."""
        pool = [(item, ref_at) for ref, ref_at in zip(refs, ref_ats, strict=False) for item in ref]
        if not pool:
            return None
        if policy is None:
            values = [item for item, _ in pool]
            policy = inferred(values) if len({json.dumps(item, sort_keys=True) for item in values}) > 1 else "type"
        kept = _distinct(pool, POOL_KEPT)
        items, item_ats = [item for item, _ in kept], [item_at for _, item_at in kept]
        for item, _ in _distinct([(item, None) for item in got], MINE_KEPT):
            why = accepts(policy, items, item, at, item_ats, self.delta_s)
            if why:
                return f"an item: {why}"
        return None


# An array's items are judged as distinct values, each against at most POOL_KEPT distinct items of E2B's: a watch's
# thousands of events are a few values many times, and each item against each of E2B's would hold the run's
# threads for minutes (every other runner waiting on the same interpreter).
POOL_KEPT = 64
MINE_KEPT = 256


def _distinct(pairs: list[tuple[Any, Any]], limit: int) -> list[tuple[Any, Any]]:
    """The first `limit` pairs whose first values are distinct (as JSON)."""
    seen: set[str] = set()
    kept: list[tuple[Any, Any]] = []
    for pair in pairs:
        key = json.dumps(pair[0], sort_keys=True)
        if key not in seen:
            seen.add(key)
            kept.append(pair)
            if len(kept) == limit:
                break
    return kept


def _digitless(value: Any) -> Any:
    return re.sub(r"\d+", "#", value) if isinstance(value, str) else value


def _lines(value: Any) -> list[str] | None:
    values = value if isinstance(value, list) else [value]
    if not all(isinstance(item, str) for item in values):
        return None
    return sorted(line for item in values for line in item.splitlines())


def _ms(exchange: dict[str, Any]) -> float:
    value = exchange.get("ms")
    return float(value) if isinstance(value, int | float) else 0.0


def _empty(value: Any) -> bool:
    return value is None or value == "" or value == [] or value == {}


def _sorted(values: list[Any]) -> list[Any]:
    return sorted(values, key=lambda value: (json_type(value), json.dumps(value, sort_keys=True)))


def _output(shape: str) -> bool:
    return "," not in shape and shape.rsplit(".", 1)[-1] in _OUTPUT


def _turns(shapes: list[str]) -> int:
    """How many times a stream's output turns from one of stdout/stderr/pty to another."""
    kinds = [shape for shape in shapes if _output(shape)]
    return sum(1 for a, b in itertools.pairwise(kinds) if a != b)


def _cut(messages: list[dict[str, Any]]) -> bool:
    """A stream that ended with an error, or without its end-of-stream trailer."""
    if not messages or not messages[-1].get("end"):
        return True
    return any(path.startswith("error") for path in messages[-1])


def _shape(message: dict[str, Any]) -> str:
    return ",".join(sorted(message))


def _order(shapes: list[str]) -> str:
    """A stream's messages in order, each by the last names of its leaves (`[pid, stdout, stderr, exitCode]`)."""
    names = ["+".join(path.rsplit(".", 1)[-1] for path in shape.split(",") if path) for shape in shapes]
    return "[" + ", ".join(names) + "]"


def _pooled(messages: list[dict[str, Any]]) -> dict[str, Any]:
    """A stream's messages as one set of leaves: each path's values in a list, output texts joined."""
    pooled: dict[str, list[Any]] = {}
    for message in messages:
        for path, value in message.items():
            pooled.setdefault(path, []).extend(value if isinstance(value, list) else [value])
    return {
        path: ["".join(values)] if path.rsplit(".", 1)[-1] in _OUTPUT and all(
            isinstance(value, str) for value in values) else values
        for path, values in pooled.items()
    }  # fmt: skip


def _request(exchange: dict[str, Any]) -> str:
    return json.dumps(exchange.get("request"), sort_keys=True)


def _pair(got: dict[str, Any], index: int, candidates: list[dict[str, Any]], taken: set[int]) -> dict[str, Any] | None:
    """The reference exchange `got` is compared with: the first untaken one with the same request, else the one at
    its place, else the first untaken."""
    free = [i for i in range(len(candidates)) if i not in taken]
    if not free:
        return None
    request = _request(got)
    chosen = next((i for i in free if _request(candidates[i]) == request), None)
    if chosen is None:
        chosen = index if index in free else free[0]
    taken.add(chosen)
    return candidates[chosen]


def _by_key(trace: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    keyed: dict[str, list[dict[str, Any]]] = {}
    for exchange in trace:
        keyed.setdefault(str(exchange.get("key")), []).append(exchange)
    return keyed
