"""Sandboxes as the control plane sees them: ids, tokens, metadata, lifetimes, pause and resume."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import logging
import os
import secrets
import signal
import string
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .box import (
    ID_BASE,
    ID_RANGES,
    SLIRP4NETNS,
    Box,
    BoxSettings,
    Limits,
    Zygote,
    cgroup_roots,
    guard_uplinks,
    private_dir,
    release_uplink,
    remove_tree,
)
from .codeinterp import START_COMMANDS, WARM_STARTS, Started, hand_over
from .disk import Disks, Spares, end_spares, unmount_under
from .inflight import InFlight
from .network import EgressRules, Ingress
from .quirks import Quirks
from .template import TemplateError, ensure_template
from .warm import WARM_SIZE, WarmPool

if TYPE_CHECKING:
    from .watch import Watcher

log = logging.getLogger("e2b-bench.localbox")

ENVD_VERSION = "0.6.4"
TOKEN_GRACE_S = 60.0
CPU_COUNT = 2
MEMORY_MB = 512
DISK_SIZE_MB = 2048
CLIENT_ID = "e2b-bench"
ID_ALPHABET = string.ascii_lowercase + string.digits


def utc(ts: float, timespec: str = "milliseconds") -> str:
    return datetime.fromtimestamp(ts, UTC).isoformat(timespec=timespec).replace("+00:00", "Z")


@dataclass
class Sandbox:
    id: str
    template_id: str
    alias: str | None
    box: Box
    quirks: Quirks
    metadata: dict[str, str]
    env_vars: dict[str, str]
    internet: bool
    auto_pause: bool
    auto_resume: bool
    started_at: float
    end_at: float
    state: str = "running"
    tokens: dict[str, float | None] = field(default_factory=dict)  # sha256 -> expiry (None: current)
    watchers: dict[str, Watcher] = field(default_factory=dict)
    paused_at: float | None = None
    pause_memory: bool = True  # autoPauseMemory: false makes a timeout pause filesystem-only
    egress: EgressRules = field(default_factory=EgressRules)  # as created or last set by a network update
    reported_end_at: float | None = None  # the timeout_keeps_endat quirk: the endAt a list reports instead
    ingress: Ingress = field(default_factory=Ingress)  # who may reach its ports (create's allowPublicTraffic)
    kept_root: Path | None = None  # a filesystem-only pause's root changes, until resume boots on them
    timeout_s: int = 0  # the lifetime create asked for: a wake on traffic (autoResume) starts it again
    last_cwd: str | None = None  # the cwd the previous command was given, if any (the `sticky_cwd` quirk reads it)
    stat_answers: dict[str, Any] = field(default_factory=dict)  # path -> first Stat answer (`stale_file_info`)
    stream_pool: asyncio.Semaphore | None = None  # its process streams served at once (the `envd_pool` quirk)
    # Raw tokens live in memory only, as in envd: signed URLs are computed from them.
    _raw_tokens: dict[str, str] = field(default_factory=dict, repr=False)
    in_flight: InFlight = field(init=False, repr=False)  # its envd requests and port connections under way

    def __post_init__(self) -> None:
        self.in_flight = InFlight(self.id)

    def stopped(self) -> None:
        """It stopped (killed, paused, timed out, died): what it was answering loses its connection, as on E2B;
        under the `kill_stream_unavailable` and `kill_stream_clean_end` quirks each stream ends with an envd message
        instead (or, paused, not at all)."""
        if not (self.quirks.kill_stream_unavailable or self.quirks.kill_stream_clean_end):
            self.in_flight.cut()

    def mint_token(self) -> str:
        """A fresh envd access token; the previous ones keep working for the grace period only."""
        now = time.time()
        for digest, expiry in self.tokens.items():
            if expiry is None:
                self.tokens[digest] = now + TOKEN_GRACE_S
        token = self.quirks.token_prefix + secrets.token_urlsafe(32)
        digest = hashlib.sha256(token.encode()).hexdigest()
        self.tokens[digest] = None
        self._raw_tokens[digest] = token
        return token

    def live_tokens(self) -> list[str]:
        now = time.time()
        return [self._raw_tokens[d] for d, expiry in self.tokens.items() if (expiry is None or expiry > now)]

    def token_valid(self, token: str | None) -> bool:
        if not token:
            return False
        digest = hashlib.sha256(token.encode()).hexdigest()
        now = time.time()
        return any(
            hmac.compare_digest(digest, known) and (expiry is None or expiry > now)
            for known, expiry in self.tokens.items()
        )

    def summary(self) -> dict[str, Any]:
        """The `Sandbox` / `SandboxDetail` / `ListedSandbox` members shared by every answer."""
        return {
            "templateID": self.template_id,
            "alias": self.alias,
            "sandboxID": self.id,
            "clientID": CLIENT_ID,
            "envdVersion": ENVD_VERSION,
            "domain": None,
        }


POOL_SIZE = 4  # sandboxes kept prepared by default (`serve --pool N`, `bench --pool N` keep N)
POOL_MAX = ID_RANGES // 4  # a pool takes a uid range per sandbox: room is left for the sandboxes it serves
# A create that finds the pool empty makes room for the next ones: the pool keeps one more prepared (and prepares
# that many more at once), up to POOL_GROWTH_MAX beyond its size; once no create has found it empty for
# POOL_SHRINK_S, it keeps its size again and ends what it prepared beyond it. An idle grown pool costs no CPU
# (its sandboxes wait with nothing running but their agent) and at most POOL_GROWTH_MAX sandboxes' memory.
POOL_GROWTH_MAX = 4 * (os.cpu_count() or 1)  # twice the creates the host makes at once (admission.py)
POOL_SHRINK_S = 30.0
SETTLE_MAX_S = 600.0  # the longest a settle waits, whatever it is asked
WARM_MAX = 16  # sandboxes kept warm per template at most (each holds a server and a kernel: ~100 MiB)


@dataclass
class Served:
    """The creates so far: taken from the pool (prepared ahead) or made as they were asked for."""

    prepared: int = 0
    on_demand: int = 0


@dataclass(frozen=True)
class Settled:
    """How a settle ended: whether the server was settled, and after how long."""

    settled: bool
    waited_ms: float


@dataclass(frozen=True)
class LocalboxConfig:
    state_dir: Path
    template_root: Path
    api_key: str
    quirks: Quirks = field(default_factory=Quirks)
    pool_size: int = POOL_SIZE
    # At most this many sandboxes prepared ahead over the server's life (None: no limit): a run that will make
    # only a few does not pay for a pool it never takes from; beyond it, creates make their own.
    pool_total: int | None = None
    cache_dir: Path | None = None  # where templates other than base are built when first asked for
    disk_size_mb: int = DISK_SIZE_MB  # every sandbox's disk, as advertised and enforced
    growth_max: int = POOL_GROWTH_MAX  # the pool's growth with demand: at most this many beyond its size


POOL_PARALLEL = 2  # sandboxes prepared at once for the pool
# ... while a settle waits for them: nothing else is asked of the server then, and a preparation spends much of its
# time waiting (the fork-server, mounts, the agent's first answer), so two per CPU keep the CPUs busy.
SETTLE_PARALLEL = 2 * (os.cpu_count() or 1)
# Empty disks kept mounted ahead of creates (disk.py's `Spares`): as many as creates make at once (the setup
# threads), so a create or a pool's preparation takes one instead of waiting on the host's disk for its own.
SPARE_DISKS = 4


class Registry:
    """Every sandbox of one server, and the tasks that end them on time."""

    def __init__(self, config: LocalboxConfig) -> None:
        self.config = config
        self.sandboxes: dict[str, Sandbox] = {}
        self.boxes_dir = config.state_dir / "boxes"
        self._pool: list[Box] = []
        self._preparing: set[Box] = set()  # being prepared for the pool
        self.pool_full = threading.Event()  # the pool holds pool_size prepared sandboxes (waited on from any thread)
        self._pool_task: asyncio.Task | None = None
        self._pool_made = 0  # sandboxes prepared for the pool so far (counted against `pool_total`)
        self._size: int | None = None  # the pool's size until the next settle (None: pool_size)
        self._reserved = 0  # prepared beyond that for the next creates that take from the pool (`settle`)
        self._grown = 0  # kept beyond both for the creates that found the pool empty (`_grow`)
        self._grown_at = 0.0  # when a create last found the pool empty (the event loop's clock)
        self.shrink_after_s = POOL_SHRINK_S  # the growth is dropped this long after that (read at each look)
        self._allowance = config.pool_total  # pool_total and what was reserved beyond it
        self.served = Served()
        self._changed = asyncio.Event()  # set as a pool fill or a background teardown ends (`settle` waits on it)
        self._settling = 0  # settles waiting: the preparations they wait for are what is asked of the server now
        self._reaper: asyncio.Task | None = None
        self._closing = False
        self._tasks: set[asyncio.Future] = set()
        self._waking: dict[str, asyncio.Future[None]] = {}
        self.zygote: Zygote | None = None
        self.disks: Disks | None = None
        self._spares_task: asyncio.Future | None = None
        self._spares_thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="e2b-bench-spares")
        self.template_roots: dict[str, Path] = {"base": config.template_root}
        self.warm: dict[str, WarmPool] = {}  # template -> its sandboxes prepared with their start command done
        self._loop: asyncio.AbstractEventLoop | None = None

    @property
    def quirks(self) -> Quirks:
        return self.config.quirks

    @property
    def idle(self) -> bool:
        """Nothing is being prepared for the pool, made for the spare disks or torn down in the background: what
        the server holds on the host stays as it is until the next request (read from any thread)."""
        pool = self._pool_task
        return (pool is None or pool.done()) and not self._tasks and all(w.idle for w in list(self.warm.values()))

    async def start(self) -> None:
        private_dir(self.config.state_dir)
        private_dir(self.boxes_dir)
        loop = self._loop = asyncio.get_running_loop()
        if SLIRP4NETNS is None:
            log.warning("e2b-bench: slirp4netns is not installed, so sandboxes have no outbound network")
        else:
            await loop.run_in_executor(None, guard_uplinks)
        if os.environ.get("E2B_BENCH_NO_ZYGOTE") != "1":
            self.zygote = Zygote.start()
        await loop.run_in_executor(None, cleanup_stale, self.boxes_dir)
        self.disks = await loop.run_in_executor(None, Disks.prepare, self.config.disk_size_mb)
        if self.disks is not None and self.config.pool_total is None:  # a run of N sandboxes: its pool alone
            self.disks.keep_spares(self.boxes_dir, self._spares_wanted())
            self._refill_spares()
        self._reaper = asyncio.create_task(self._reap_expired())
        self._refill_pool()

    # --- boxes --------------------------------------------------------------------------------
    def _settings(self, internet: bool) -> BoxSettings:
        q = self.quirks
        return BoxSettings(
            internet=internet,
            session_leader=q.session_leader,
            end_on_exit=q.end_on_exit,
            profile_lines=q.login_profile(),
            hidden_paths=q.hidden_paths(),
            upload_truncates_first=q.extra_write_event,
            root_home_of_user=q.root_home_of_user,
            limits=Limits(memory_mb=MEMORY_MB, cpu_count=CPU_COUNT, disk_mb=self.config.disk_size_mb),
        )

    def _box(self, internet: bool, sandbox_id: str, layers: str | None = None) -> Box:
        root = Path(layers) if layers else self.config.template_root  # layers: "upper copy:...:template"
        return Box(sandbox_id, root, self.boxes_dir, self._settings(internet), self.zygote, self.disks)

    async def _new_box(self, internet: bool, sandbox_id: str, layers: str | None = None) -> Box:
        return await self._boot_box(self._box(internet, sandbox_id, layers))

    async def _boot_box(self, box: Box, warm_up: bool = False) -> Box:
        try:
            await box.start(hostname=box.name)  # which, failed or cancelled, leaves nothing behind
        finally:
            self._refill_spares()  # for the disk it took
        try:
            await box.new_boot_id()
            if warm_up:
                await box.warm_up()
        except BaseException:  # failed, or cancelled by a server shutting down: no sandbox is left running
            await box.kill()
            raise
        return box

    @property
    def pool_size(self) -> int:
        """Sandboxes the pool keeps prepared now: its configured size, unless the last settle said otherwise."""
        return self.config.pool_size if self._size is None else self._size

    def _pool_target(self) -> int:
        return self.pool_size + self._reserved + self._grown

    @property
    def grown(self) -> int:
        """Sandboxes the pool keeps beyond its size and reserve because creates found it empty (`_grow`)."""
        return self._grown

    def _grow(self) -> None:
        """A create found the pool empty: keep one more prepared for the next creates (a burst's later ones, or
        the next burst's), at most `growth_max` beyond the pool's size. Not for a pool of none (every create made
        on demand, as asked) nor for a run of this server, which says how many it needs (`pool_total`)."""
        if self.pool_size <= 0 or self._allowance is not None or self._closing:
            return
        room = POOL_MAX - self.pool_size - self._reserved  # the uid ranges a pool may take
        self._grown = max(0, min(self._grown + 1, self.config.growth_max, room))
        self._grown_at = asyncio.get_running_loop().time()

    def _shrink_when_idle(self) -> None:
        """Once no create has found the pool empty for `shrink_after_s` (the reaper looks), keep its size and
        reserve again: what it prepared beyond them is ended, the newest first."""
        if not self._grown or asyncio.get_running_loop().time() - self._grown_at < self.shrink_after_s:
            return
        self._grown = 0
        self._end_beyond_target()

    def _end_beyond_target(self) -> None:
        while len(self._pool) > self._pool_target():  # the newest go: the oldest have waited longest to serve
            self._background(asyncio.ensure_future(self._pool.pop().kill()))

    def _pool_wanted(self) -> int:
        """How many more sandboxes the pool should prepare now."""
        wanted = self._pool_target() - len(self._pool)
        if self._allowance is not None:
            wanted = min(wanted, self._allowance - self._pool_made)
        return max(wanted, 0)

    def _refill_pool(self) -> None:
        if self._closing or self._pool_wanted() <= 0:
            if self.config.pool_size <= 0:
                self.pool_full.set()
            return
        if self._pool_task is None or self._pool_task.done():
            self._pool_task = asyncio.create_task(self._fill_pool())
            self._pool_task.add_done_callback(lambda _: self._changed.set())

    def _spares_wanted(self) -> int:
        """Spare disks kept now: none while the pool keeps none (every create made on demand, disk and all)."""
        return SPARE_DISKS if self.pool_size > 0 else 0

    @property
    def _spares(self) -> Spares | None:
        return self.disks.spares if self.disks is not None else None

    @property
    def spare_disks(self) -> int:
        """Empty disks mounted and ready for the next creates."""
        spares = self._spares
        return 0 if spares is None else spares.ready

    def _refill_spares(self) -> None:
        """Make spare disks for those taken, on a thread of their own, in the background (`idle` waits for it)."""
        spares = self._spares
        if self._closing or spares is None or spares.wanted <= 0:
            return
        if self._spares_task is not None and not self._spares_task.done():
            return
        self._spares_task = asyncio.get_running_loop().run_in_executor(self._spares_thread, spares.fill)
        self._spares_task.add_done_callback(self._spares_filled)
        self._background(self._spares_task)

    def _spares_filled(self, task: asyncio.Future) -> None:
        if task.cancelled() or task.exception() is None or self.disks is None:
            return
        log.warning("e2b-bench: no spare disks are kept from now on (creates make their own): %s", task.exception())
        spares, self.disks.spares = self.disks.spares, None
        if spares is not None:
            self._background(asyncio.get_running_loop().run_in_executor(None, spares.close))

    def _background(self, task: asyncio.Future) -> None:
        """Work that goes on after its request (a teardown, spare disks made): `idle` waits for it, and a settle
        hears when it ends."""
        self._tasks.add(task)

        def ended(done: asyncio.Future) -> None:
            self._tasks.discard(done)
            self._changed.set()

        task.add_done_callback(ended)

    @property
    def prepared(self) -> int:
        """Sandboxes prepared and waiting in the pool."""
        return len(self._pool)

    @property
    def reserved(self) -> int:
        """Sandboxes held prepared beyond the usual pool for the next creates (`settle`)."""
        return self._reserved

    @property
    def settled(self) -> bool:
        """Nothing is prepared or torn down, and the pool holds what it keeps (read from any thread)."""
        return self.idle and self._pool_wanted() <= 0 and all(w.settled for w in list(self.warm.values()))

    async def settle(
        self, reserve: int, within_s: float, size: int | None = None, warm: dict[str, int] | None = None
    ) -> Settled:
        """Keep `size` sandboxes prepared from now on (None: the configured pool_size; 0: every create made on
        demand), hold `reserve` more for the next creates that take from the pool (what is prepared beyond both,
        e.g. left by a burst cut short, is ended), and wait, at most `within_s`, until the server is settled: a
        measure that starts then competes with no preparation or teardown, and finds the pool as asked. Not settled
        in time, or a preparation failed: `settled` is False. `warm`: templates whose sandboxes are kept ready with
        their start command done (warm.py), and how many of each, from now on."""
        loop = asyncio.get_running_loop()
        started = loop.time()
        deadline = started + min(max(within_s, 0.0), SETTLE_MAX_S)
        self._size = None if size is None else max(0, min(size, POOL_MAX))
        reserve = max(0, min(reserve, POOL_MAX - self.pool_size))
        if self._allowance is not None:
            self._allowance += max(0, reserve - self._reserved)
        self._reserved = reserve
        self._grown = 0  # the pool as asked, not as the creates before grew it
        self._end_beyond_target()
        spares = self._spares
        if spares is not None and (extra := spares.resize(self._spares_wanted())):
            self._background(loop.run_in_executor(None, end_spares, extra))
        for template, count in (warm or {}).items():
            await self._keep_warm(template, count)
        self._settling += 1
        for pool in self.warm.values():
            pool.settling += 1
        self._weigh_preparing()
        try:
            self._refill_pool()
            self._refill_spares()
            for pool in self.warm.values():
                pool.refill()
            while not self.settled and not self.idle:  # idle and not settled: a preparation failed
                self._changed.clear()
                remaining = deadline - loop.time()
                if remaining <= 0:
                    break
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._changed.wait(), remaining)
        finally:
            self._settling -= 1
            for pool in self.warm.values():
                pool.settling -= 1
                pool.weigh()
            self._weigh_preparing()
        return Settled(self.settled, round((loop.time() - started) * 1000, 3))

    async def _fill_pool(self) -> None:
        """Prepare sandboxes, POOL_PARALLEL at a time (one at a time falls behind creates in a tight loop), or
        SETTLE_PARALLEL while a settle waits for them."""
        while not self._closing and self._pool_wanted() > 0:
            # While creates find the pool empty, as many as found it so are prepared at once (up to SETTLE_PARALLEL).
            parallel = SETTLE_PARALLEL if self._settling else max(POOL_PARALLEL, min(self._grown, SETTLE_PARALLEL))
            wanted = min(parallel, self._pool_wanted())
            self._pool_made += wanted
            preparing = [asyncio.ensure_future(self._prepare_box()) for _ in range(wanted)]
            try:
                await asyncio.gather(*preparing, return_exceptions=True)
            finally:  # cancelled (a shutdown) too, once all have ended: what is pooled, the shutdown ends
                ended = [p for p in preparing if p.done() and not p.cancelled()]
                self._pool.extend(p.result() for p in ended if p.exception() is None)
                self._weigh_preparing()
            if not self._closing:  # the growth dropped (or a settle) meanwhile: not kept beyond what is asked
                self._end_beyond_target()
            failed = [p.exception() for p in ended if p.exception() is not None]
            if failed:
                log.error("could not prepare a sandbox in advance", exc_info=failed[0])
                return
        if len(self._pool) >= self.config.pool_size:
            self.pool_full.set()

    async def _prepare_box(self) -> Box:
        box = self._box(internet=True, sandbox_id=self.new_id())
        self._preparing.add(box)
        self._weigh_preparing()
        try:
            await self._boot_box(box, warm_up=True)
        finally:
            self._preparing.discard(box)
        return box

    def _weigh_preparing(self) -> None:
        """Sandboxes being prepared yield the CPU (the lowest weight) while a prepared one waits in the pool:
        then the next create does not need them, and they never slow a sandbox serving requests. With the
        pool empty the next create needs one of them (or makes its own, at the usual weight), so they get
        the usual weight: at the lowest, demand above what idle CPU prepares would leave every create
        making its own, and a starved preparation holding a kernel lock (mounts, cgroups, namespaces)
        would stall the creates that need that lock. While a settle waits for them, they are what is asked
        of the server: the usual weight too (at the lowest, anything else on the host starves them)."""
        for box in self._preparing:
            box.cgroup.background(bool(self._pool) and not self._settling)

    async def _take_box(self, internet: bool, sandbox_id: str | None, layers: str | None = None) -> Box:
        """A prepared box (its id already its hostname) when one fits, else a new one."""
        while internet and sandbox_id is None and layers is None and self._pool:
            box = self._pool.pop(0)
            self._reserved = max(self._reserved - 1, 0)
            self.pool_full.clear()
            self._weigh_preparing()
            if box.running:
                box.cgroup.background(False)
                self.served.prepared += 1
                self._refill_pool()
                return box
        if internet and sandbox_id is None and layers is None:  # one the pool could have served
            self._grow()
            self._refill_pool()  # prepared alongside this create's own, for the next creates
        box = await self._new_box(internet, sandbox_id or self.new_id(), layers)
        self.served.on_demand += 1
        self._refill_pool()
        return box

    async def template_root(self, template_id: str) -> Path:
        """A built-in template's root, built first (in a thread: minutes when cold) if this is its first use."""
        if template_id not in self.template_roots:
            loop = asyncio.get_running_loop()
            root = await loop.run_in_executor(None, ensure_template, self.config.cache_dir, template_id)
            self.template_roots[template_id] = root
        return self.template_roots[template_id]

    # --- warm pools (warm.py) ------------------------------------------------------------------
    def _warm_pool(self, template: str) -> WarmPool | None:
        """The template's warm pool, made (empty) on first ask; None for a template without a start command or not
        yet built."""
        if template not in WARM_STARTS or template not in self.template_roots:
            return None
        pool = self.warm.get(template)
        if pool is None:
            root = str(self.template_roots[template])
            pool = self.warm[template] = WarmPool(
                template,
                lambda box, taken: self._prepare_warm(template, box, taken),
                lambda: self._box(internet=True, sandbox_id=self.new_id(), layers=root),
                self._changed.set,
                lambda started: self._background(asyncio.ensure_future(started.box.kill())),
            )
        return pool

    async def _prepare_warm(self, template: str, box: Box, taken: asyncio.Event) -> Started:
        await self._boot_box(box, warm_up=True)
        try:
            return await WARM_STARTS[template](box, taken)
        except BaseException:
            await box.kill()
            raise

    async def _keep_warm(self, template: str, count: int, run: bool = False) -> None:
        """Keep `count` sandboxes of `template` ready with their start command done (`run`: and prepare no more than
        that for a run of this server, which knows how many it will create)."""
        if self._closing or template not in WARM_STARTS or (count == 0 and template not in self.warm):
            return
        try:
            await self.template_root(template)
        except TemplateError as exc:
            log.warning("e2b-bench: no %s sandbox is prepared ahead: %s", template, exc)
            return
        pool = self._warm_pool(template)
        if pool is None:
            return
        run = run or self.config.pool_total is not None
        pool.resize(count, allowance=count if run else None)

    def keep_warm(self, templates: dict[str, int]) -> None:
        """From any thread: the work ahead will create about `count` sandboxes of each template (a run's suites
        say so): prepare them warm now, once each template is built."""
        loop = self._loop
        if loop is None or loop.is_closed():
            return

        def start() -> None:
            for template, count in templates.items():
                self._background(asyncio.ensure_future(self._keep_warm(template, count, run=True)))

        with contextlib.suppress(RuntimeError):  # the server stopped meanwhile: nothing to prepare for
            loop.call_soon_threadsafe(start)

    def _warm_template(self, layers: str | None) -> str | None:
        """The template a create boots on when it is one of those with a warm pool (not a snapshot of one)."""
        return next((t for t, root in self.template_roots.items() if layers == str(root) and t in WARM_STARTS), None)

    async def _take_warm(self, template: str, internet: bool, sandbox_id: str | None) -> Started | None:
        pool = self._warm_pool(template)
        if pool is None or not internet or sandbox_id is not None:
            return None
        started = await pool.take()
        if started is not None:
            self.served.prepared += 1
        return started

    def _used(self, template: str | None) -> None:
        """A create of `template` ended: from now on its pool keeps WARM_SIZE ready (unless sized already)."""
        if not template or self._closing or self.config.pool_total is not None:  # a run says what it needs
            return
        pool = self._warm_pool(template)
        if pool is not None and pool.size == 0 and pool.allowance is None:
            pool.resize(WARM_SIZE)

    async def _boot(self, box: Box, env_vars: dict[str, str]) -> None:
        """Run the start command of the template the box's lowest layer is (none for base); on failure the
        box is killed."""
        lowest = Path(str(box.template_root).split(":")[-1])
        template = next((t for t, root in self.template_roots.items() if root == lowest), None)
        start = START_COMMANDS.get(template or "")
        if start is None:
            return
        try:
            await start(box, env_vars)
        except BaseException:
            await box.kill()
            raise

    # --- lifecycle ----------------------------------------------------------------------------
    def new_id(self) -> str:
        return self.quirks.sandbox_id_prefix + "".join(secrets.choice(ID_ALPHABET) for _ in range(20))

    async def create(
        self,
        *,
        template_id: str,
        alias: str | None,
        timeout_s: int,
        metadata: dict[str, str],
        env_vars: dict[str, str],
        internet: bool,
        auto_pause: bool,
        auto_resume: bool,
        sandbox_id: str | None = None,
        layers: str | None = None,
        egress: EgressRules | None = None,
        ingress: Ingress | None = None,
    ) -> tuple[Sandbox, str]:
        template = self._warm_template(layers)
        warm = await self._take_warm(template, internet, sandbox_id) if template else None
        box = warm.box if warm is not None else await self._take_box(internet, sandbox_id, layers)
        if egress is not None and not egress.unrestricted:
            try:
                await box.apply_egress(egress)
            except BaseException:
                await box.kill()
                raise
        if warm is None:
            await self._boot(box, env_vars)
        else:
            try:
                await hand_over(warm, env_vars)
            except BaseException:
                await box.kill()
                raise
        self._used(template)
        sandbox_id = box.name
        now = time.time()
        sandbox = Sandbox(
            id=sandbox_id,
            template_id=template_id,
            alias=alias,
            box=box,
            quirks=self.quirks,
            metadata=metadata,
            env_vars=env_vars,
            internet=internet,
            auto_pause=auto_pause,
            auto_resume=auto_resume,
            started_at=now,
            end_at=now + timeout_s,
            egress=egress or EgressRules(),
            ingress=ingress or Ingress(),
            timeout_s=timeout_s,
        )
        box.on_exit = lambda: self._box_exited(sandbox)
        self.sandboxes[sandbox_id] = sandbox
        return sandbox, sandbox.mint_token()

    def _box_exited(self, sandbox: Sandbox) -> None:
        if not self._closing and self.sandboxes.get(sandbox.id) is sandbox:
            self.sandboxes.pop(sandbox.id, None)
            sandbox.stopped()
            self._background(asyncio.ensure_future(sandbox.box.kill()))

    def get(self, sandbox_id: str) -> Sandbox | None:
        return self.sandboxes.get(sandbox_id)

    async def kill(self, sandbox_id: str) -> bool:
        sandbox = self.sandboxes.pop(sandbox_id, None)
        if sandbox is None:
            return False
        sandbox.stopped()  # before its processes end: their streams are cut, never ended
        for watcher in list(sandbox.watchers.values()):
            await watcher.close()
        if sandbox.kept_root is not None:  # paused without memory: only its root's changes are left
            kept, sandbox.kept_root = sandbox.kept_root, None
            await asyncio.get_running_loop().run_in_executor(None, remove_tree, kept)
            if sandbox.box.kept_ids is not None:
                sandbox.box.kept_ids.release()
        removal = await sandbox.box.kill(wait_for_files=False)
        if removal is not None:
            self._background(removal)
        return True

    async def pause(self, sandbox: Sandbox, memory: bool = True) -> None:
        sandbox.stopped()
        if memory or self.quirks.pause_keeps_memory:
            await sandbox.box.freeze()
        else:
            sandbox.kept_root = await sandbox.box.power_off()
        sandbox.state = "paused"
        sandbox.paused_at = time.time()

    async def resume(self, sandbox: Sandbox, timeout_s: int, reboot: bool = False) -> None:
        if reboot and sandbox.kept_root is None and not self.quirks.pause_keeps_memory:
            sandbox.kept_root = await sandbox.box.power_off()  # the memory kept by the pause is let go
        if sandbox.kept_root is not None:
            old = sandbox.box
            box = Box(old.name, old.template_root, self.boxes_dir, old.settings, self.zygote, old.disks)
            box.ids, old.kept_ids = old.kept_ids, None  # the kept files are owned by the old box's id range
            await box.power_on(sandbox.id, sandbox.kept_root)
            box.on_exit = lambda: self._box_exited(sandbox)
            sandbox.box, sandbox.kept_root = box, None
            if not sandbox.egress.unrestricted:  # a cold boot is a new network namespace
                await box.apply_egress(sandbox.egress)
            await self._boot(box, sandbox.env_vars)
        else:
            await sandbox.box.thaw()
        sandbox.state = "running"
        sandbox.paused_at = None
        sandbox.end_at = time.time() + timeout_s

    async def wake(self, sandbox: Sandbox) -> bool:
        """Traffic reached `sandbox`: resume it if it is paused and created with autoResume (one resume however
        many requests wait on it); returns whether it runs. A filesystem-only pause is not woken (E2B's SDK:
        such a sandbox is resumed by connect), nor is any sandbox under the ignore_auto_resume quirk."""
        if sandbox.state == "running":
            return True
        if not sandbox.auto_resume or sandbox.kept_root is not None or self.quirks.ignore_auto_resume:
            return False
        waking = self._waking.get(sandbox.id)
        if waking is None:
            waking = asyncio.ensure_future(self._wake(sandbox))
            self._waking[sandbox.id] = waking
            waking.add_done_callback(lambda _: self._waking.pop(sandbox.id, None))
        await asyncio.shield(waking)  # a request whose client leaves does not stop the resume others wait on
        return sandbox.state == "running"

    async def _wake(self, sandbox: Sandbox) -> None:
        if sandbox.state == "paused" and self.sandboxes.get(sandbox.id) is sandbox:
            await self.resume(sandbox, sandbox.timeout_s)

    async def set_egress(self, sandbox: Sandbox, rules: EgressRules) -> None:
        """Replace a running sandbox's egress rules (rules that restrict nothing clear its filter)."""
        if not (rules.unrestricted and sandbox.egress.unrestricted):
            await sandbox.box.apply_egress(rules)
        sandbox.egress = rules

    async def _reap_expired(self) -> None:
        while True:
            await asyncio.sleep(0.2)
            self._shrink_when_idle()
            now = time.time()
            for sandbox in list(self.sandboxes.values()):
                if sandbox.state != "running" or sandbox.end_at > now:
                    continue
                try:
                    if sandbox.auto_pause:
                        await self.pause(sandbox, memory=sandbox.pause_memory)
                    else:
                        await self.kill(sandbox.id)
                except Exception:
                    log.exception("ending sandbox %s at its timeout failed", sandbox.id)

    async def shutdown(self) -> None:
        self._closing = True
        for task in (self._reaper, self._pool_task):
            if task:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task
        await asyncio.gather(*(pool.close() for pool in self.warm.values()), return_exceptions=True)
        boxes = [s.box for s in self.sandboxes.values()] + self._pool
        self.sandboxes.clear()
        self._pool.clear()
        spares = self._spares
        if spares is not None:  # a fill under way ends with the spare it is making
            self._background(asyncio.get_running_loop().run_in_executor(None, spares.close))
        await asyncio.gather(*(box.kill() for box in boxes), *self._tasks, return_exceptions=True)
        self._spares_thread.shutdown(wait=False)
        if self.zygote is not None:
            self.zygote.close()
        remove_server_cgroups(self.config.state_dir.name)
        unmount_under(self.config.state_dir)  # any disk a failed removal left mounted
        remove_tree(self.config.state_dir)


def cleanup_stale(boxes_dir: Path) -> list[str]:
    """Kill and remove what a server that crashed left behind in this state directory; returns what is left."""
    left = []
    for box_dir in boxes_dir.iterdir() if boxes_dir.exists() else []:
        pid_file = box_dir / "pid"
        with contextlib.suppress(OSError, ValueError):
            pid = int(pid_file.read_text())
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
            if b"agent.py" in cmdline:
                _kill_tree(pid)
        with contextlib.suppress(OSError):
            if (gid := box_dir.stat().st_gid) >= ID_BASE:  # the sandbox's root gid, its uplink's
                release_uplink(gid)
        for root in cgroup_roots():
            for suffix in ("", ".uplink"):  # the sandbox's, and its uplink's
                _remove_cgroup(root / boxes_dir.parent.name / f"{box_dir.name}{suffix}")
        left += unmount_under(box_dir)  # its disk: unmounted, the loop device frees itself
        if not remove_tree(box_dir):
            left.append(str(box_dir))
    remove_server_cgroups(boxes_dir.parent.name)
    return left


ORPHAN_AGE_S = 600.0  # a dead server's empty cgroup this old is nobody's (never one a server just made)


def remove_orphan_cgroups(min_age_s: float = ORPHAN_AGE_S) -> list[Path]:
    """Remove the empty cgroups of servers that are gone (their pid is not running), made `min_age_s` ago or
    more: `cleanup_stale` finds a dead server's cgroups through its state directory, and a server killed
    outright with its state in a temporary directory left them to no one. Only empty ones, and no process
    is ever killed (a server in another pid namespace of this host may share these hierarchies). Returns
    those removed."""
    removed, now = [], time.time()
    for root in cgroup_roots():
        for server in root.glob("server-*") if root.is_dir() else []:
            pid = server.name.split("-")[1]
            if not pid.isdigit() or Path(f"/proc/{pid}").exists():
                continue
            with contextlib.suppress(OSError):
                if now - server.stat().st_mtime < min_age_s:
                    continue
                for group in [*server.iterdir(), server]:
                    if group.is_dir():
                        with contextlib.suppress(OSError):
                            group.rmdir()  # refused (EBUSY) while a process is in it
                            removed.append(group)
    return removed


def _remove_cgroup(path: Path) -> None:
    if not path.exists():
        return
    for name, thawed in (("freezer.state", "THAWED"), ("cgroup.freeze", "0")):
        with contextlib.suppress(OSError):
            if (path / name).exists():
                (path / name).write_text(thawed)
    with contextlib.suppress(OSError):
        for proc in (path / "cgroup.procs").read_text().split():
            with contextlib.suppress(ProcessLookupError, ValueError):
                os.kill(int(proc), signal.SIGKILL)
    for _ in range(50):
        try:
            path.rmdir()
            return
        except OSError:
            time.sleep(0.02)


def remove_server_cgroups(server: str) -> None:
    for root in cgroup_roots():
        with contextlib.suppress(OSError):
            (root / server).rmdir()


def _kill_tree(pid: int) -> None:
    with contextlib.suppress(OSError):
        children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
        for child in children:
            with contextlib.suppress(ProcessLookupError, ValueError):
                os.kill(int(child), signal.SIGKILL)
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)
