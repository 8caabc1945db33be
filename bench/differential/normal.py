"""Names a run made, wherever they appear: a trace with each of them inside a longer string as `{made}`.

Ids a run makes (a sandbox's, a context's, a watcher's, a snapshot's) and the random names its cases give what they
make (a folder `files-2cf044b0`, a staging file `.agent-stage-<uuid>`) show up inside other strings: a message
naming the sandbox, a hostname in `uname` output, a path in a listing, a digest of random content. Each run has its
own, so such a string differs from the reference's by the name alone: no difference from E2B. A string that is
wholly one such name is left as it is (its field's policy judges its shape, `id`), unless it is a UUID (whose shape
is fixed); inside a longer string each is replaced by `{made}`. A name is made by the run when it is
- the value (or a word of it) of a field named like an id (`sandboxID`, `watcherId`, `id`, `templateID`, ...):
  a word mixing letters and digits, or the whole value when it is one long word (a random id without a digit),
- a word of what a case sent (a request's leaves) of at least MIN_SENT characters with a digit in it (a random
  hex name may be all digits; a number a case sent is the same in both runs, so replacing it changes nothing),
- a UUID, or a word of at least MIN_RANDOM characters mixing letters and digits (a sandbox id, a digest).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

MADE = "{made}"
MIN_ID = 6  # a word of an id-named field's value
MIN_SENT = 8  # a word of what a case sent
MIN_RANDOM = 16  # a word anywhere
_WORD = re.compile(r"(?<![A-Za-z0-9])[A-Za-z0-9]+(?![A-Za-z0-9])")
_UUID = re.compile(r"(?<![0-9A-Fa-f])[0-9A-Fa-f]{8}(?:-[0-9A-Fa-f]{4}){3}-[0-9A-Fa-f]{12}(?![0-9A-Fa-f])")
# the end of a text the capture cut (bench/differential/capture.py `_text`): its digest is of the whole text
_CUT_DIGEST = re.compile(r"(…\[\d+ chars, sha256 )([0-9a-f]+)(\])$")


def _digit(word: str) -> bool:
    return any(c.isdigit() for c in word)


def _mixed(word: str) -> bool:
    return any(c.isdigit() for c in word) and any(c.isalpha() for c in word)


def _strings(value: Any) -> Iterable[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, list):
        for item in value:
            yield from _strings(item)


def _id_named(path: str) -> bool:
    name = path.rsplit(".", 1)[-1].removesuffix("[]")
    return name.lower().endswith("id")


def made_names(trace: list[dict[str, Any]]) -> set[str]:
    """The names `trace`'s run made (see the module's docstring)."""
    names: set[str] = set()
    for exchange in trace:
        for part in ("request", "answer", "probe"):
            body = exchange.get(part)
            if not isinstance(body, dict):
                continue
            for leaves in [body.get("leaves") or {}, *(body.get("messages") or [])]:
                if not isinstance(leaves, dict):
                    continue
                for path, value in leaves.items():
                    for text in _strings(value):
                        words = _WORD.findall(text)
                        if _id_named(path):
                            names.update(word for word in words if len(word) >= MIN_ID and _mixed(word))
                            if len(text) >= MIN_RANDOM and _WORD.fullmatch(text):
                                names.add(text)  # a whole random id may happen to hold no digit (1 in ~700)
                        if part == "request":  # a random name may be all digits (8 hex digits often are)
                            names.update(word for word in words if len(word) >= MIN_SENT and _digit(word))
    return names


def normalized(value: Any, names: set[str]) -> Any:
    """`value` (a trace, or any part of one) with every name of `names`, UUID and long random word inside a longer
    string as `{made}`."""
    if isinstance(value, str):
        return _text(value, names)
    if isinstance(value, list):
        return [normalized(item, names) for item in value]
    if isinstance(value, dict):
        return {key: normalized(item, names) for key, item in value.items()}
    return value


def _text(text: str, names: set[str]) -> str:
    if _UUID.fullmatch(text):
        return MADE  # a UUID: its shape is all there is to judge
    if text in names or _is_random(text):
        return text  # wholly a name: judged by its field's policy (`id`: its length and characters)
    cut = _CUT_DIGEST.search(text)
    head = text[: cut.start()] if cut else text
    shown = _UUID.sub(MADE, head)
    shown = _WORD.sub(lambda word: MADE if word[0] in names or _is_random(word[0]) else word[0], shown)
    if cut and shown != head:  # the digest is of the whole text, names and all
        return f"{shown}{cut[1]}{MADE}{cut[3]}"
    return shown + (text[cut.start() :] if cut else "")


def _is_random(word: str) -> bool:
    return len(word) >= MIN_RANDOM and _WORD.fullmatch(word) is not None and _mixed(word)


def made_neutral(trace: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """`trace` with the names its run made inside longer strings of its bodies as `{made}` (its keys and moments
    as they are)."""
    names = made_names(trace)
    parts = ("request", "answer", "probe")
    return [
        {key: normalized(value, names) if key in parts else value for key, value in exchange.items()}
        for exchange in trace
    ]
