"""Coverage of the field-policy table by what a run's answers held (`coverage.json`'s `fields`).

Every field a run's traces show (each leaf of an answer, a stream's message or a probe, by its judgement name
`METHOD ROUTE PATH`) is judged by a rule of the policy table, or by what the reference traces show of it (`exact`
when they agree, else by shape). A field that no rule names and no reference trace holds is a gap: an endpoint may
give anything there unjudged. `second_path` counts the probes (bench/differential/probe.py) the run made.

`spec` lists every answer field of E2B's definitions (sandboxes/e2b/answer-fields.toml, written from them by
tests/test_answer_fields.py), each with how it is judged: the policy of the rule that names it, `reference` (the
reference traces hold it: `exact` where they agree, else by shape), or a gap: `no policy` (this run saw it, no rule
or reference judges it) or `never seen` (neither). A field whose values are objects of free keys (metadata, a map of
env vars) counts as seen and judged by any of its members. `spec_gaps` counts the gaps.
"""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

from bench.paths import ANSWER_FIELDS_PATH, FIELD_POLICY_PATH, REFERENCE_TRACES_DIR

from .policy import PolicyError, Rule, load_rules, rule_for
from .reference import TRACES, read_lines

MAX_GAPS = 200
NO_POLICY = "no policy"
NEVER_SEEN = "never seen"
BY_REFERENCE = "reference"


def read_answer_fields(path: Path = ANSWER_FIELDS_PATH) -> list[str]:
    """The answer fields of E2B's definitions (`METHOD ROUTE PATH`); empty when the file is missing."""
    try:
        fields = tomllib.loads(path.read_text("utf-8")).get("fields", [])
    except (OSError, tomllib.TOMLDecodeError):
        return []
    return [str(field) for field in fields]


def spec_policies(fields: list[str], rules: list[Rule], seen: set[str], referenced: set[str]) -> dict[str, str]:
    """Each spec field's policy, `reference`, or its gap (`no policy`, `never seen`)."""
    found = {}
    for field in fields:
        members = {name for name in seen | referenced if name == field or name.startswith(f"{field}.")}
        policy = rule_for(field, rules) or next(
            (policy for name in sorted(members) if (policy := rule_for(name, rules))), None
        )
        if policy:
            found[field] = policy
        elif members & referenced:
            found[field] = BY_REFERENCE
        else:
            found[field] = NO_POLICY if members else NEVER_SEEN
    return found


def _names(exchange: dict[str, Any]) -> set[str]:
    key = str(exchange.get("key", ""))
    found = {f"{key} status"}
    for part, prefix in (("answer", key), ("probe", f"{key} probe")):
        body = exchange.get(part)
        if not isinstance(body, dict):
            continue
        leaves = [body.get("leaves") or {}, *(body.get("messages") or [])]
        for message in leaves:
            found.update(f"{prefix} {path}" for path in message if isinstance(message, dict))
        if "body" in body:
            found.update({f"{prefix} body.bytes", f"{prefix} body.sha256"})
    return found


def field_coverage(
    run_dir: Path,
    root: Path = REFERENCE_TRACES_DIR,
    table: Path = FIELD_POLICY_PATH,
    answers: Path = ANSWER_FIELDS_PATH,
) -> dict[str, Any] | None:
    """The fields the run's traces show, how many are judged, and the gaps (None: the run wrote no traces)."""
    paths = sorted((run_dir / TRACES).glob("*.jsonl"))
    if not paths:
        return None
    try:
        rules = load_rules(table)
    except PolicyError:
        rules = []
    seen: set[str] = set()
    referenced: set[str] = set()
    probes = 0
    for path in paths:
        suite, _, runner = path.stem.partition(".")
        for entry in read_lines(path):
            for exchange in entry.get("trace") or []:
                seen |= _names(exchange)
                probes += isinstance(exchange.get("probe"), dict)
        for entry in read_lines(root / suite / f"{runner}.jsonl"):
            for run in entry.get("runs") or []:
                for exchange in run:
                    referenced |= _names(exchange)
    by_rule = {name for name in seen if rule_for(name, rules) is not None}
    gaps = sorted(seen - by_rule - referenced)
    spec = spec_policies(read_answer_fields(answers), rules, seen, referenced)
    return {
        "fields": len(seen),
        "by_rule": len(by_rule),
        "by_reference": len((seen - by_rule) & referenced),
        "second_path": probes,
        "gaps": gaps[:MAX_GAPS],
        "gaps_total": len(gaps),
        "spec": spec,
        "spec_gaps": sum(policy in (NO_POLICY, NEVER_SEEN) for policy in spec.values()),
    }
