"""`bench.json`, the benchmark's own file: reading it back and the texts a reader sees of it.

Shared by the benchmark that writes it and the report that renders it.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from .results import validate

BENCH_JSON = "bench.json"
BENCH_SCHEMA = "e2b-bench/bench/1"
TRANSFER_KINDS = tuple(f"{way}{twin}" for way in ("upload", "download") for twin in ("", "_http", "_floor"))
PHASE_NAMES = {
    "create_ms": "create", "first_run_ms": "first command", "first_cell_ms": "first cell", "kill_ms": "kill",
    "first_byte_ms": "first byte",
}  # fmt: skip


def read_bench(run_dir: Path) -> dict[str, Any] | None:
    """The run's bench.json, validated; None when the run is not a benchmark."""
    path = run_dir / BENCH_JSON
    if not path.is_file():
        return None
    document = json.loads(path.read_text("utf-8"))
    validate("bench", document, where=str(path))
    return dict(document)


def ms(value: float | None) -> str:
    if value is None:
        return "—"
    return f"{value:.2f}" if value < 100 else f"{value:.0f}"


def comparison_text(doc: Mapping[str, Any]) -> str:
    """The ratio as a reader wants it: `12.3x spawn`, or for transfers the share of the disk copy rate."""
    if doc["ratio"] is None:
        return "—"
    names = " + ".join(doc["baseline"]["of"])
    if doc["kind"] in TRANSFER_KINDS:
        # rounded down, so that a share shown as 50% never sits next to a missed 50% target
        return f"{math.floor(100 / doc['ratio'])}% of {names} rate ({doc['rate_mb_s']:.0f} MB/s)"
    return f"{doc['ratio']:.1f}x {names}"


def phases_text(doc: Mapping[str, Any]) -> str:
    """Where a measure's time goes, as medians of its samples' parts: `create 80 ms · first command 40 ms`;
    a transfer's with its throughput; creates with how the embedded endpoint served them (`100 prepared, 0 on
    demand`). Empty when its samples have no parts."""
    phases = doc.get("phases") or {}
    shown = [f"{PHASE_NAMES.get(name, name.removesuffix('_ms'))} {ms(value)} ms" for name, value in phases.items()]
    if shown and doc["kind"] in TRANSFER_KINDS and doc.get("rate_mb_s"):
        shown.append(f"{doc['rate_mb_s']:.0f} MB/s")
    served = doc.get("served")
    if served and doc["kind"].startswith("tti"):
        shown.append(f"{served['prepared']} prepared, {served['on_demand']} on demand")
    return " · ".join(shown)


def pool_text(header: Mapping[str, Any]) -> str:
    """How the embedded endpoint was held for the measures (the header's `pool`); empty for another endpoint."""
    pool = header.get("pool")
    if pool is None:
        return ""
    text = f"the endpoint kept {pool['size']} sandboxes prepared, and each measure began once it held them, settled"
    if pool["burst"]:
        text += (
            f"; tti.burst began with {pool['burst']} more prepared, tti.burst_on_demand with none more (the rest made"
            " on demand, the pool growing as they found it empty)"
        )
    return text


def not_measured_text(doc: Mapping[str, Any]) -> str:
    """What a measure the wall-clock limit cut short is: not a miss, since its target was not judged."""
    return f"not measured (limit {doc['limit_s']:g} s)"


def target_text(doc: Mapping[str, Any]) -> str:
    target = doc["target"]
    if doc.get("limit_s") is not None:
        return not_measured_text(doc)
    if target is None:
        return ""
    return f"{'met' if target['met'] else 'MISSED'} ({target['text']})"
