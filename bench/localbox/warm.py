"""Warm pools: sandboxes of a template with a start command (the code interpreter), booted and started ahead.

E2B builds such a template with its server running and snapshots the VM, so every create resumes a sandbox
whose server (and its first kernel) is ready. The embedded endpoint has no memory snapshots; instead it keeps
sandboxes of the template prepared with their start command done (`codeinterp.start_warm`: the server listens
and its default kernel is ready), and a create of the template takes one and hands it the create's env vars
(`codeinterp.hand_over`): the first cell waits for nothing. A create that finds none ready takes one still
being prepared (it is ahead of any it could start), else makes its own as before.

A template's pool starts with its first create (`WARM_SIZE`) or when the server is told it will be used
(`Registry.keep_warm`: a run whose suites create from it); a settle may size it (`Registry.settle`). Pools
prepare one sandbox at a time (`WARM_PARALLEL`; more while a settle waits for them), at the lowest CPU weight
while a ready one waits and no settle or create waits for them, as the base pool does.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from .box import Box
from .codeinterp import Started

log = logging.getLogger("e2b-bench.localbox")

WARM_SIZE = 1  # sandboxes a template's pool keeps ready once the template has been used
WARM_PARALLEL = 1  # prepared at once: a server and its kernel take seconds of CPU each
WARM_SETTLE_PARALLEL = 2  # ... while a settle waits for them (nothing else is asked of the server then)


@dataclass
class Preparing:
    """A sandbox being prepared, and whether a create waits to take it."""

    box: Box
    claimed: bool = False
    taken: asyncio.Event = field(default_factory=asyncio.Event)  # set once a create waits: ready when it listens


class WarmPool:
    """One template's sandboxes prepared ahead with their start command done."""

    def __init__(
        self, template: str, prepare: Callable[[Box, asyncio.Event], Awaitable[Started]], new_box: Callable[[], Box],
        changed: Callable[[], None], end: Callable[[Started], None],
    ) -> None:  # fmt: skip
        self.template = template
        self._prepare = prepare  # boots the box and starts its server warm; kills the box on failure
        self._new_box = new_box
        self._changed = changed  # a settle hears that the pool's state changed
        self._end = end  # ends a sandbox the pool no longer keeps (in the background)
        self.size = 0  # kept ready from now on
        self.allowance: int | None = None  # at most this many prepared in all (a run's), else no limit
        self.made = 0
        self.ready: list[Started] = []
        self.preparing: dict[asyncio.Future[Started], Preparing] = {}
        self.settling = 0
        self.closing = False
        self.failed: BaseException | None = None  # the last preparation's failure: no more until sized again

    @property
    def idle(self) -> bool:
        return not self.preparing

    @property
    def settled(self) -> bool:
        return self.idle and self.wanted() <= 0

    def wanted(self) -> int:
        """How many more to start preparing now."""
        wanted = self.size - len(self.ready) - sum(not p.claimed for p in self.preparing.values())
        if self.allowance is not None:
            wanted = min(wanted, self.allowance - self.made)
        return max(wanted, 0)

    def resize(self, size: int, allowance: int | None = None) -> None:
        """Keep `size` ready from now on (`allowance`: at most that many more prepared); those ready beyond it are
        ended, and those being prepared beyond it stopped (each preparation kills its box)."""
        self.size, self.failed = max(size, 0), None
        if allowance is not None:
            self.allowance = self.made + allowance
        for started in self.ready[self.size :]:
            self._end(started)
        del self.ready[self.size :]
        unclaimed = [task for task, preparing in self.preparing.items() if not preparing.claimed]
        for task in unclaimed[max(self.size - len(self.ready), 0) :]:
            task.cancel()
        self.refill()

    def refill(self) -> None:
        if self.closing or self.failed is not None:
            return
        parallel = WARM_SETTLE_PARALLEL if self.settling else WARM_PARALLEL
        while self.wanted() > 0 and sum(not p.claimed for p in self.preparing.values()) < parallel:
            self.made += 1
            preparing = Preparing(self._new_box())
            task = asyncio.ensure_future(self._prepare(preparing.box, preparing.taken))
            self.preparing[task] = preparing
            task.add_done_callback(self._prepared)
        self.weigh()

    def _prepared(self, task: asyncio.Future[Started]) -> None:
        preparing = self.preparing.pop(task)
        if task.cancelled():
            pass
        elif (error := task.exception()) is not None:
            if not self.closing:
                self.failed = error
                log.error("could not prepare a %s sandbox in advance", self.template, exc_info=error)
        elif preparing.claimed:
            pass  # the create waiting for it has it
        elif len(self.ready) < self.size or self.closing:
            self.ready.append(task.result())  # a pool closing meanwhile ends it with the others
        else:  # resized meanwhile
            self._end(task.result())
        self.refill()
        self._changed()

    def weigh(self) -> None:
        """Preparations yield the CPU while a ready one waits and neither a settle nor a create waits for them."""
        lowest = bool(self.ready) and not self.settling
        for preparing in self.preparing.values():
            preparing.box.cgroup.background(lowest and not preparing.claimed)

    async def take(self) -> Started | None:
        """A ready sandbox, else one being prepared once it is ready; None when there is neither (or the one
        waited for failed): the create makes its own."""
        while self.ready:
            started = self.ready.pop(0)
            self.refill()
            if started.box.running and started.record.exit is None:
                started.box.cgroup.background(False)
                return started
            log.warning("a %s sandbox prepared in advance had stopped: ended", self.template)
            await started.box.kill()
        task = next((t for t, p in self.preparing.items() if not p.claimed), None)
        if task is None:
            return None
        self.preparing[task].claimed = True
        self.preparing[task].taken.set()  # ready for the create once its server listens: the kernel may follow
        self.refill()  # a claimed one is no longer the pool's: the next is started if it keeps more
        try:
            started = await asyncio.shield(task)
        except asyncio.CancelledError:  # the create's client left: the pool keeps what it was waiting for
            if task in self.preparing:
                self.preparing[task].claimed = False
            elif task.done() and not task.cancelled() and task.exception() is None and not self.closing:
                self.ready.append(task.result())
            self.weigh()
            raise
        except Exception:
            return None
        started.box.cgroup.background(False)
        return started

    async def close(self) -> None:
        """End every sandbox of the pool, ready or being prepared (a preparation cancelled kills its box)."""
        self.closing = True
        tasks = list(self.preparing)
        for task in tasks:
            task.cancel()
        with contextlib.suppress(Exception):
            await asyncio.gather(*tasks, return_exceptions=True)
        ready, self.ready = self.ready, []
        await asyncio.gather(*(started.box.kill() for started in ready), return_exceptions=True)
