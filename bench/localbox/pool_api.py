"""The embedded endpoint's one route beyond E2B's API, `/e2b-bench/pool`: what a benchmark asks of it between measures.

`GET` answers the pool's state: the sandboxes it keeps prepared (`size`), those held beyond them for the next
creates (`reserved`), those kept beyond both because creates found it empty (`grown`: the pool grows with demand, up
to the server's growth cap, and shrinks back once no create has found it empty for a while), how many are prepared
now, whether nothing is prepared or torn down (`idle`), the creates so far taken from it or made on demand
(`served`), and per template with a start command how many of its sandboxes are kept ready with it done (`warm`,
warm.py). `POST {"reserve": N, "size": K, "within_s": S, "warm": {TEMPLATE: W}}` keeps K prepared from now on, its
growth dropped (K left out or null: the size the server was started with; 0: every create made on demand), and W of
TEMPLATE warm (left out: as they are), holds N more for the next N creates (more than the server can hold: as many
as it can), and answers the same once the server is settled, or after S seconds (at most `SETTLE_MAX_S`), with
`settled` and `waited_ms`: a measure that starts then competes with no refill or teardown. It sits behind the API
key like every REST route; no E2B client calls it.
"""

from __future__ import annotations

import math
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from .api import ApiError, json_body
from .codeinterp import WARM_STARTS
from .registry import POOL_MAX, SETTLE_MAX_S, WARM_MAX, Registry

PATH = "/e2b-bench/pool"


class PoolApi:
    def __init__(self, registry: Registry) -> None:
        self.registry = registry

    def routes(self) -> list[Route]:
        return [Route(PATH, self.state, methods=["GET"]), Route(PATH, self.settle, methods=["POST"])]

    def _state(self) -> dict[str, Any]:
        registry = self.registry
        return {
            "size": registry.pool_size,
            "reserved": registry.reserved,
            "grown": registry.grown,
            "prepared": registry.prepared,
            "spare_disks": registry.spare_disks,
            "idle": registry.idle,
            "served": {"prepared": registry.served.prepared, "on_demand": registry.served.on_demand},
            "warm": {t: {"size": w.size, "ready": len(w.ready)} for t, w in registry.warm.items()},
        }

    async def state(self, request: Request) -> Response:
        return JSONResponse(self._state())

    async def settle(self, request: Request) -> Response:
        body = await json_body(request)
        if unknown := sorted(set(body) - {"reserve", "size", "within_s", "warm"}):
            raise ApiError(400, f"the pool takes reserve, size, within_s and warm, not {', '.join(map(repr, unknown))}")
        warm = body.get("warm") or {}
        if not isinstance(warm, dict) or not all(t in WARM_STARTS for t in warm):
            raise ApiError(400, f"warm maps a template with a start command ({', '.join(WARM_STARTS)}) to a count")
        for template, count in warm.items():
            if type(count) is not int or not 0 <= count <= WARM_MAX:
                raise ApiError(400, f"warm {template} must be a whole number from 0 to {WARM_MAX}, not {count!r}")
        reserve, size, within_s = body.get("reserve", 0), body.get("size"), body.get("within_s", 0)
        for name, value in (("reserve", reserve), ("size", 0 if size is None else size)):
            if type(value) is not int or not 0 <= value <= POOL_MAX:
                raise ApiError(400, f"{name} must be a whole number of sandboxes from 0 to {POOL_MAX}, not {value!r}")
        if type(within_s) not in (int, float) or not math.isfinite(within_s) or not 0 <= within_s <= SETTLE_MAX_S:
            raise ApiError(400, f"within_s must be a number of seconds from 0 to {SETTLE_MAX_S:g}, not {within_s!r}")
        settled = await self.registry.settle(reserve, float(within_s), size, warm)
        return JSONResponse({**self._state(), "settled": settled.settled, "waited_ms": settled.waited_ms})
