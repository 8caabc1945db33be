"""Coverage of the field-policy table by what a run's answers held (`coverage.json`'s `fields`).

Every field a run's traces show (each leaf of an answer, a stream's message or a probe, by its judgement name
`METHOD ROUTE PATH`) is judged by a rule of the policy table, or by what the reference traces show of it (`exact`
when they agree, else by shape). A field that no rule names and no reference trace holds is a gap: an endpoint may
give anything there unjudged. `second_path` counts the probes (bench/differential/probe.py) the run made.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from bench.paths import FIELD_POLICY_PATH, REFERENCE_TRACES_DIR

from .policy import PolicyError, load_rules, rule_for
from .reference import TRACES, read_lines

MAX_GAPS = 200


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
    run_dir: Path, root: Path = REFERENCE_TRACES_DIR, table: Path = FIELD_POLICY_PATH
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
    return {
        "fields": len(seen),
        "by_rule": len(by_rule),
        "by_reference": len((seen - by_rule) & referenced),
        "second_path": probes,
        "gaps": gaps[:MAX_GAPS],
        "gaps_total": len(gaps),
    }
