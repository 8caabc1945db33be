"""The soak's judgements: what the embedded endpoint holds on the host before and after a run, whether its
memory stayed flat, and the admission that answers 429 rather than failing; then a short soak through the CLI."""

from __future__ import annotations

import asyncio
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from run_cli import e2b_bench, only_run_dir

from bench.localbox.admission import Admission, Refused
from bench.results import read_run, schema_errors
from bench.soak.census import Holdings, count, descendants, started_from
from bench.soak.memory import MAX_GROWTH, Sample, judge

# --- memory --------------------------------------------------------------------------------------


def samples(levels: list[tuple[float, int]]) -> list[Sample]:
    """Samples at (seconds, MiB of the server's own processes); the whole tree is twice that."""
    return [Sample(at, mib << 20, 2 * mib << 20, 10) for at, mib in levels]


def test_memory_that_grows_more_than_a_tenth_after_the_first_minute_is_not_flat() -> None:
    # A ramp in the first minute, then 100 MiB, creeping to 115 MiB by the end of ten minutes.
    levels = [(t, 50 + t) for t in range(0, 60, 2)] + [(t, 100 + 15 * (t - 60) // 540) for t in range(60, 602, 2)]

    judged = judge(samples(levels), start=0, end_at=600)

    assert (judged["warm_up_s"], judged["window_s"]) == (60, 20)
    assert judged["after_warm_up_mib"] == statistics.median(m for t, m in levels if 40 <= t <= 60)
    assert judged["end_mib"] == statistics.median(m for t, m in levels if 580 <= t <= 600)
    assert judged["growth"] > MAX_GROWTH and judged["flat"] is False
    assert "grew" in judged["why"] and f"{judged['end_mib']} MiB" in judged["why"]


def test_memory_that_ramps_in_the_first_minute_and_then_holds_is_flat() -> None:
    # The first minute's ramp is not growth; one busy moment at the end does not move the median.
    levels = [(t, 50 + t) for t in range(0, 60, 2)] + [(t, 105) for t in range(60, 602, 2)]
    levels[-2] = (598, 400)

    judged = judge(samples(levels), start=0, end_at=600)

    assert judged["flat"] is True and judged["why"] is None
    assert judged["growth"] == round(105 / statistics.median(m for t, m in levels if 40 <= t <= 60) - 1, 4)
    assert (judged["max_mib"], judged["tree_max_mib"]) == (400, 800)


def test_without_samples_in_its_windows_memory_is_not_judged() -> None:
    judged = judge(samples([(1, 100), (2, 100)]), start=0, end_at=600)

    assert (judged["flat"], judged["growth"]) == (None, None)
    assert "no sample" in judged["why"]


def test_a_load_too_short_to_judge_reports_its_growth_without_a_verdict() -> None:
    judged = judge(samples([(t / 4, 100 + t) for t in range(40)]), start=0, end_at=10)

    assert judged["growth"] > MAX_GROWTH and judged["flat"] is None
    assert "too short to judge" in judged["why"]


# --- what the endpoint holds on the host -----------------------------------------------------------


def test_the_census_counts_the_processes_below_a_server_and_leaves_out_pruned_subtrees(tmp_path: Path) -> None:
    sleeper = [sys.executable, "-c", "import time; time.sleep(60)"]
    before = count(os.getpid(), tmp_path)
    child = subprocess.Popen(sleeper)
    client = subprocess.Popen([*sleeper, "a-load-client"])
    try:
        during = count(os.getpid(), tmp_path, started_from("a-load-client"))
        seen = descendants(os.getpid(), started_from("a-load-client"))
    finally:
        for process in (child, client):
            process.kill()
            process.wait()

    assert child.pid in seen and client.pid not in seen
    assert during.more_than(before) == {"processes": 1}
    assert count(os.getpid(), tmp_path).more_than(before) == {}
    assert (during.mounts, during.loop_devices, during.cgroups) == (0, 0, 0)  # nothing under an empty directory


def test_holdings_say_what_they_hold_more_of() -> None:
    before = Holdings(processes=10, netns=4, mounts=4, loop_devices=4, cgroups=8)
    after = Holdings(processes=12, netns=4, mounts=5, loop_devices=3, cgroups=8)

    assert after.more_than(before) == {"processes": 2, "mounts": 1}
    assert before.more_than(before) == {}


# --- admission -----------------------------------------------------------------------------------


REFUSAL_SCRIPT = """
import sys
from bench.loadmain import patch
patch()
from e2b import RateLimitException
from bench.loadusers import retry_after
print(retry_after(RateLimitException(sys.argv[1])), retry_after(RateLimitException("rate limit exceeded")))
"""


def test_the_users_wait_what_a_refusal_asks_for_and_a_second_when_it_does_not_say() -> None:
    """The SDK keeps only a 429's message: the users read the Retry-After the endpoint put in it."""
    refusal = Refused(making=4, waiting=4, retry_after_s=7)

    done = subprocess.run(
        [sys.executable, "-c", REFUSAL_SCRIPT, str(refusal)], capture_output=True, text=True, timeout=60, check=True
    )

    assert done.stdout.split() == ["7.0", "1.0"]


def test_admission_makes_at_most_its_slots_at_once_queues_while_the_turn_is_near_and_refuses_the_next() -> None:
    async def scenario() -> tuple[list[str], Refused]:
        # Before any create has ended one is taken to last 1 s: the third's turn would come in 2 s, past 0.5 s.
        admission = Admission(at_once=1, queue_wait_s=0.5)
        release = asyncio.Event()
        order: list[str] = []

        async def create(name: str) -> None:
            async with admission.slot():
                order.append(f"{name} made")
                await release.wait()

        first = asyncio.create_task(create("first"))
        second = asyncio.create_task(create("second"))
        while (admission.making, admission.waiting) != (1, 1):
            await asyncio.sleep(0)
        with pytest.raises(Refused) as refused:
            async with admission.slot():
                order.append("third made")
        release.set()
        await asyncio.gather(first, second)
        assert (admission.making, admission.waiting, admission.refused) == (0, 0, 1)
        return order, refused.value

    order, refused = asyncio.run(scenario())

    assert order == ["first made", "second made"]
    assert refused.retry_after_s == 2
    assert f"retry after {refused.retry_after_s} s" in str(refused)


# --- through the CLI -----------------------------------------------------------------------------


def test_a_short_soak_on_the_embedded_endpoint_fails_nothing_leaks_nothing_and_judges_memory(tmp_path: Path) -> None:
    done = e2b_bench(
        "load", "--soak", "--users", "3", "--rate", "2", "--duration", "24", "--idle-seconds", "0",
        "--pause-share", "0.5", "--no-report", "--results-dir", str(tmp_path), timeout=400,
    )  # fmt: skip
    run_dir = only_run_dir(tmp_path)
    document: dict[str, Any] = json.loads((run_dir / "load.json").read_text())
    assert schema_errors("load", document) == []
    cases = {case.case: case for case in read_run(run_dir).cases}

    assert document["failures"] == {}, {name: c.error for name, c in cases.items() if c.error}
    assert all(f["requests"] > 0 and f["failures"] == 0 for f in document["operations"].values())
    host = document["host"]
    assert host["before"] == host["after"] and host["leaked"] == {}
    assert host["before"]["processes"] > 0 and host["before"]["cgroups"] > 0  # the pool's sandboxes are seen
    assert cases["host_leaks"].conformant
    # The judgement is the samples': its levels are the medians of its windows of the timeline.
    memory = document["memory"]
    assert memory["samples"] == len(memory["timeline"]) > 0
    warm, window, duration = memory["warm_up_s"], memory["window_s"], memory["load_s"]
    settled = statistics.median(mib for at, mib, _, _ in memory["timeline"] if warm - window <= at <= warm)
    end = statistics.median(mib for at, mib, _, _ in memory["timeline"] if duration - window <= at <= duration)
    assert (memory["after_warm_up_mib"], memory["end_mib"]) == (
        pytest.approx(settled, abs=0.1),
        pytest.approx(end, abs=0.1),
    )
    assert memory["growth"] == pytest.approx(end / settled - 1, abs=0.01)
    assert cases["memory_flat"].conformant == memory["flat"] == (memory["growth"] <= MAX_GROWTH)
    assert all(tree >= server for _, server, tree, _ in memory["timeline"])
    assert "endpoint on the host (before -> after)" in done.stdout and "endpoint memory" in done.stdout
    assert done.returncode == 0, done.stdout[-3000:]
