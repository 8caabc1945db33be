"""`merge` of a sharded run's directories sums what the shards spent: sandbox-seconds by suite, money, and the
answers the wire proxies retried (#27)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from run_cli import e2b_bench, only_run_dir

from bench.remote.budget import merged_cost
from bench.results import read_run


def estimate(amount: float, currency: str = "USD") -> dict[str, object]:
    return {"amount": amount, "currency": currency, "vcpus": 2.0, "memory_gib": 0.5}


def test_money_is_summed_only_when_every_shard_priced_its_seconds_alike() -> None:
    one = {"sandbox_seconds": {"quickstart": 10.0}, "total_sandbox_seconds": 10.0, "estimate": estimate(0.25)}
    two = {"sandbox_seconds": {"probes": 4.0, "quickstart": 2.5}, "total_sandbox_seconds": 6.5,
           "estimate": estimate(0.125)}  # fmt: skip

    assert merged_cost([one, two]) == {
        "sandbox_seconds": {"probes": 4.0, "quickstart": 12.5},
        "total_sandbox_seconds": 16.5,
        "estimate": estimate(0.375),
    }
    assert merged_cost([one, {**two, "estimate": None}])["estimate"] is None  # one shard had no price
    assert merged_cost([one, {**two, "estimate": estimate(0.125, "EUR")}])["estimate"] is None


def test_merge_sums_the_shards_sandbox_seconds_and_retries(tmp_path: Path) -> None:
    shards = []
    for index in (1, 2):
        results = tmp_path / f"shard-{index}"
        # A fifth of control-plane requests answer 502/503: the proxies retry the creates and reads among them.
        e2b_bench("run", "quickstart", "--shard", f"{index}/2", "--quirk", "transient_5xx=0.2", "--no-report",
                  "--results-dir", str(results), timeout=900)  # fmt: skip
        shards.append(read_run(only_run_dir(results)))

    done = e2b_bench("merge", *(str(run.path) for run in shards), "--results-dir", str(tmp_path / "merged"))

    merged = read_run(only_run_dir(tmp_path / "merged"))
    assert merged.footer is not None, done.stderr
    footers = [run.footer for run in shards]
    assert all(f is not None and f["cost"]["total_sandbox_seconds"] > 0 for f in footers), footers
    cost = merged.footer["cost"]
    assert cost["total_sandbox_seconds"] == pytest.approx(sum(f["cost"]["total_sandbox_seconds"] for f in footers))
    assert cost["sandbox_seconds"] == {
        "quickstart": pytest.approx(sum(f["cost"]["sandbox_seconds"]["quickstart"] for f in footers))
    }
    # The merged wire logs, a second path: every retry the shards' proxies made is on some exchange's line.
    logs = (merged.path / "wire").glob("*.jsonl")
    lines = [json.loads(line) for log in logs for line in log.read_text().splitlines()]
    logged = [retry["status"] for line in lines for retry in line.get("retries") or []]
    assert logged, "no request was retried: the quirk did not reach the shards"
    assert merged.footer["retries"]["total"] == sum(f["retries"]["total"] for f in footers) == len(logged)
    assert merged.footer["retries"]["by_status"] == {str(s): logged.count(s) for s in sorted(set(logged))}
