"""The soak's judgements: what the embedded endpoint holds on the host before and after a run, whether its
memory stayed flat, and the admission that answers 429 rather than failing; then a short soak through the CLI."""

from __future__ import annotations

import asyncio
import html
import json
import math
import os
import statistics
import subprocess
import sys
from collections import Counter, deque
from pathlib import Path
from typing import Any

import pytest
from run_cli import e2b_bench, only_run_dir

from bench.localbox.admission import Admission, Refused
from bench.results import read_run, schema_errors
from bench.soak.census import Holdings, count, descendants, started_from
from bench.soak.memory import MAX_GROWTH, Sample, judge
from bench.soak.pace import CUT, FAILED, FLOOR, MADE, RAISE, STOPPED, WINDOW_S, Pacer, pace_figures, retry_figures

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


class Creates:
    """Creates through one admission, each holding its slot until `release` is set; `order` says which were made."""

    def __init__(self, admission: Admission) -> None:
        self.admission = admission
        self.release = asyncio.Event()
        self.order: list[str] = []

    async def create(self, name: str) -> None:
        async with self.admission.slot():
            self.order.append(f"{name} made")
            await self.release.wait()


def test_admission_makes_at_most_its_slots_at_once_queues_while_the_turn_is_near_and_refuses_the_next() -> None:
    async def scenario() -> tuple[list[str], Refused]:
        # Before any create has ended one is taken to last 1 s: the third's turn would come in 2 s, past 0.5 s.
        admission = Admission(at_once=1, queue_wait_s=0.5)
        creates = Creates(admission)

        first = asyncio.create_task(creates.create("first"))
        second = asyncio.create_task(creates.create("second"))
        while (admission.making, admission.waiting) != (1, 1):
            await asyncio.sleep(0)
        with pytest.raises(Refused) as refused:
            async with admission.slot():
                creates.order.append("third made")
        creates.release.set()
        await asyncio.gather(first, second)
        assert (admission.making, admission.waiting, admission.refused) == (0, 0, 1)
        return creates.order, refused.value

    order, refused = asyncio.run(scenario())

    assert order == ["first made", "second made"]
    assert refused.retry_after_s == 2
    assert f"retry after {refused.retry_after_s} s" in str(refused)


def test_a_create_whose_turn_does_not_come_within_the_hold_is_refused_and_its_place_is_not_lost() -> None:
    """The estimate said the turn was near (the queue took it), but the create ahead never ends: the waiting one is
    answered 429 after the hold instead of running into its client's request timeout, and nothing is made for it."""

    async def scenario() -> tuple[list[str], Refused, tuple[int, int, int]]:
        admission = Admission(at_once=1, queue_wait_s=1000.0, queue_hold_s=0.2)
        creates = Creates(admission)

        first = asyncio.create_task(creates.create("first"))
        while admission.making != 1:
            await asyncio.sleep(0)
        with pytest.raises(Refused) as refused:
            await creates.create("second")
        held = (admission.making, admission.waiting, admission.refused)
        creates.release.set()
        await first
        await creates.create("third")  # the slot the first held goes to the next create: the refused one took none
        return creates.order, refused.value, held

    order, refused, held = asyncio.run(scenario())

    assert order == ["first made", "third made"]
    assert held == (1, 0, 1)
    assert 1 <= refused.retry_after_s <= 30 and "0 more wait their turn" in str(refused)


# --- pace and retries ------------------------------------------------------------------------------


def test_a_pacer_starts_creates_at_the_asked_rate_and_none_inside_the_endpoints_backoff() -> None:
    pacer = Pacer(asked=2.0)
    assert pacer.wait_s(100.0) == 0
    pacer.started(100.0)
    assert pacer.wait_s(100.0) == 0.5 and pacer.wait_s(100.5) == 0

    pacer.refused(now=101.0, retry_after_s=7, sent_at=100.9)

    assert pacer.rate == 2.0 * CUT
    assert pacer.wait_s(101.0) == 7  # the backoff, longer than the pace
    assert pacer.wait_s(108.0) == 0
    pacer.started(108.0)
    assert pacer.wait_s(108.0) == pytest.approx(1 / (2.0 * CUT))


def test_refusals_of_creates_sent_before_the_backoff_ended_cut_the_rate_once() -> None:
    pacer = Pacer(asked=4.0)
    pacer.refused(now=10.0, retry_after_s=5, sent_at=9.5)
    pacer.refused(now=10.2, retry_after_s=6, sent_at=9.8)  # already on its way when the rate was cut
    assert (pacer.cuts, pacer.refusals, pacer.factor) == (1, 2, CUT)
    assert pacer.wait_s(10.2) == pytest.approx(6)  # the longest backoff holds

    pacer.refused(now=17.0, retry_after_s=2, sent_at=16.5)  # sent at the cut rate: that is still too high

    assert (pacer.cuts, pacer.factor, pacer.lowest) == (2, CUT * CUT, CUT * CUT)


def test_a_refusal_holds_the_rate_to_what_the_endpoint_made_in_the_window_before_it() -> None:
    pacer, window = Pacer(asked=2.0), int(WINDOW_S)
    pacer.started(0.0)
    for second in range(window + 10):  # one a second, where two were asked
        pacer.made(float(second), refusals=1)

    pacer.refused(now=window + 9.5, retry_after_s=1, sent_at=window + 9.0)

    assert pacer.rate == pytest.approx(1.0)  # not 2 * CUT: it made one a second in the window
    assert pacer.factor == pacer.lowest == pytest.approx(0.5)


def test_creates_made_without_a_refusal_raise_the_rate_back_to_the_asked_one_and_no_further() -> None:
    pacer = Pacer(asked=2.0)
    pacer.refused(now=1.0, retry_after_s=1, sent_at=1.0)
    pacer.made(2.0, refusals=1)  # made after a refusal: the rate stays cut
    assert pacer.factor == CUT

    for _ in range(round((1 - CUT) / RAISE) - 1):
        pacer.made(3.0, refusals=0)
    assert CUT < pacer.factor < 1
    pacer.made(4.0, refusals=0)
    pacer.made(4.0, refusals=0)

    assert pacer.factor == 1.0 and pacer.rate == 2.0 and pacer.lowest == CUT


def test_the_rate_is_never_cut_below_its_floor_and_without_a_pace_only_backoffs_hold_creates() -> None:
    pacer = Pacer(asked=2.0)
    for second in range(100):
        pacer.refused(now=float(second), retry_after_s=0.5, sent_at=float(second))
    assert pacer.factor == FLOOR and pacer.summary()["lowest_per_s"] == 2.0 * FLOOR

    unpaced = Pacer(asked=0.0)
    unpaced.started(5.0)
    assert unpaced.wait_s(5.0) == 0
    unpaced.refused(now=5.0, retry_after_s=3, sent_at=5.0)
    assert (unpaced.wait_s(6.0), unpaced.wait_s(8.0)) == (2, 0)


def test_a_refused_create_is_a_retry_when_made_after_the_backoff_and_a_failure_when_not() -> None:
    figures = retry_figures([[2, 3.5, MADE], [1, 1.0, MADE], [4, 300.5, FAILED], [1, 2.0, STOPPED]])

    assert figures == {"refusals": 8, "waited_s": 307.0, "retried": 2, "failed": 1, "stopped": 1}
    assert retry_figures([]) == {"refusals": 0, "waited_s": 0, "retried": 0, "failed": 0, "stopped": 0}
    with pytest.raises(ValueError, match="ended 'lost'"):
        retry_figures([[1, 1.0, "lost"]])


def test_the_runs_pace_sums_each_processs_share_and_divides_the_made_by_the_span() -> None:
    shares = [
        {"asked_per_s": 1.0, "lowest_per_s": 0.5625, "final_per_s": 0.9, "cuts": 2},
        {"asked_per_s": 1.0, "lowest_per_s": 0.75, "final_per_s": 1.0, "cuts": 1},
    ]

    pace = pace_figures(shares, made=300, span_s=200.0)

    assert pace == {"asked_per_s": 2.0, "lowest_per_s": 1.3125, "final_per_s": 1.9, "cuts": 3, "made_per_s": 1.5}
    assert pace_figures([], made=0, span_s=0)["made_per_s"] is None


class Endpoint:
    """A stand-in for an endpoint's admission, as `bench/localbox/admission.py` answers: creates are made one
    after another at `capacity(t)` per second; one whose turn would come more than `queue_s` later is refused,
    asking to retry after that wait (1-30 s)."""

    def __init__(self, capacity: Any, queue_s: float = 10.0) -> None:
        self.capacity, self.queue_s, self.free_at = capacity, queue_s, 0.0

    def offer(self, now: float) -> tuple[float | None, int]:
        """(when the create is made, None if refused; the Retry-After of a refusal)."""
        turn = max(now, self.free_at)
        if turn - now > self.queue_s:
            return None, min(max(math.ceil(turn - now), 1), 30)
        self.free_at = turn + 1 / self.capacity(now)
        return self.free_at, 0


def soak(asked: float, capacity: Any, duration_s: float = 600.0) -> tuple[Pacer, list[tuple[float, float, int]]]:
    """Sessions wanted at `asked` per second through a Pacer against `Endpoint(capacity)`, as the load users
    do: in line, a refused create first again. Out: the pacer and each create's (first sent, made, refusals)."""
    pacer, endpoint = Pacer(asked=asked), Endpoint(capacity)
    line: deque[int] = deque()
    first_sent: dict[int, float] = {}
    refusals: Counter[int] = Counter()
    making: list[tuple[float, int]] = []
    made: list[tuple[float, float, int]] = []
    wanted = int(duration_s * asked)
    for step in range(int(duration_s * 100) + 1):
        now = step / 100
        line.extend(range(len(first_sent) + len(line), min(wanted, int(now * asked) + 1)))
        while line and pacer.wait_s(now) == 0:
            create = line.popleft()
            pacer.started(now)
            first_sent.setdefault(create, now)
            done, retry_after = endpoint.offer(now)
            if done is None:
                refusals[create] += 1
                pacer.refused(now, retry_after, sent_at=now)
                line.appendleft(create)
            else:
                making.append((done, create))
        for done, create in [m for m in making if m[0] <= now]:
            making.remove((done, create))
            pacer.made(done, refusals[create])
            made.append((first_sent[create], done, refusals[create]))
    return pacer, made


def test_paced_by_the_endpoints_refusals_a_soak_asking_more_than_it_makes_keeps_every_wait_short() -> None:
    """The last full soak asked 2 sessions/s of a host that made 1.75/s: at a fixed rate the backlog grew
    until creates waited past 300 s. Paced, no create waits much longer than the endpoint's own queue."""
    pacer, made = soak(asked=2.0, capacity=lambda now: 1.75)

    assert pacer.cuts > 0 and pacer.lowest < 1.75 / 2.0
    assert max(done - sent for sent, done, _ in made) < 60
    late = [done for sent, done, _ in made if sent >= 300]
    assert len(late) / 300 > 0.85 * 1.75  # the second half still makes close to what the endpoint can


def test_paced_by_the_endpoints_refusals_a_soak_follows_a_capacity_that_drops_and_comes_back() -> None:
    pacer, made = soak(asked=3.0, capacity=lambda now: 1.0 if 200 <= now < 400 else 4.0)

    assert max(done - sent for sent, done, _ in made) < 60
    assert pacer.lowest * 3.0 <= 1.0
    after = [sent for sent, _, _ in made if 500 <= sent < 600]
    assert len(after) / 100 > 0.9 * 3.0  # back at the asked rate once the endpoint could make it again


def test_a_soak_the_endpoint_keeps_up_with_is_never_cut_and_starts_every_session_at_the_asked_rate() -> None:
    pacer, made = soak(asked=2.0, capacity=lambda now: 5.0)

    assert (pacer.cuts, pacer.refusals, pacer.factor) == (0, 0, 1.0)
    assert len(made) == pacer.starts == 1200 and all(refused == 0 for _, _, refused in made)


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
    # The pace asked is the run's rate; every sandbox the users made is in the endpoint's count of the run.
    assert document["pace"]["asked_per_s"] == 2.0 and document["refused"]["failed"] == 0
    assert document["sandboxes"]["created"] == document["operations"]["create"]["requests"]
    assert f"pace: 2.00 sessions/s asked, {document['pace']['made_per_s']:.2f} sandboxes/s made" in done.stdout
    assert done.returncode == 0, done.stdout[-3000:]


def test_a_soak_faster_than_the_endpoint_admits_is_paced_down_and_its_refused_creates_are_retries(
    tmp_path: Path,
) -> None:
    """The endpoint admits one create a second (429 past that, Retry-After 1 s) and the soak asks for three:
    the refusals cut the pace, every refused create is made after its backoff, and nothing fails."""
    done = e2b_bench(
        "load", "--soak", "--users", "4", "--rate", "3", "--duration", "20", "--idle-seconds", "0",
        "--pause-share", "0", "--quirk", "rate_limit=1", "--results-dir", str(tmp_path), timeout=400,
    )  # fmt: skip
    run_dir = only_run_dir(tmp_path)
    document: dict[str, Any] = json.loads((run_dir / "load.json").read_text())
    assert schema_errors("load", document) == []
    cases = {case.case: case for case in read_run(run_dir).cases}

    assert document["failures"] == {}, {name: c.error for name, c in cases.items() if c.error}
    refused, pace = document["refused"], document["pace"]
    assert refused["retried"] > 0 and refused["refusals"] >= refused["retried"]
    assert refused["failed"] == 0  # a create still refused when the users stopped is `stopped`, neither
    assert pace["asked_per_s"] == 3.0 and pace["cuts"] > 0 and pace["lowest_per_s"] < 3.0
    # Every create the users made is a sandbox the endpoint made and killed: the retries made no extra ones.
    sandboxes = document["sandboxes"]
    assert sandboxes["created"] == sandboxes["killed"] == document["operations"]["create"]["requests"] > 0
    assert sandboxes["count_start"] == sandboxes["count_end"] and sandboxes["leaked"] == []
    said = f"of the creates refused, {refused['retried']} were made after the backoff, 0 failed"
    paced = f"pace: 3.00 sessions/s asked, {pace['made_per_s']:.2f} sandboxes/s made; cut {pace['cuts']} times"
    assert said in done.stdout and paced in done.stdout
    report = html.unescape((run_dir / "report.html").read_text())
    assert said in report and paced in report
    assert done.returncode == 0, done.stdout[-3000:]
