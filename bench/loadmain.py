"""The entry point of `e2b-bench load`'s Locust processes: gevent patches all but threads, then Locust runs.

Locust patches its process with gevent in full when imported. Our users' SDK calls run on native threads
(gevent's thread pool: the SDK's HTTP client is native code), and the SDK guards what those threads share,
its connection pools, with `threading` locks. Patched, such a lock is a gevent lock: a thread without a hub
of its own that waits for it asks the hub of the thread holding it to hand it over, and once that thread is
back in the pool its hub no longer runs, so the waiter waits forever (an SDK create that never returned
under load, `hung:create`). Unpatched, `threading` stays the kernel's; Locust uses none of it, and its
greenlets, sockets and queues are gevent's as before. This module runs before anything imports Locust or
the SDK.
"""

from __future__ import annotations

import os

SKIP_LOCUST_PATCH = "LOCUST_SKIP_MONKEY_PATCH"  # Locust's switch to leave the patching to its caller


def patch() -> None:
    """Patch like Locust does, except `threading`: its locks must hold across native threads."""
    os.environ[SKIP_LOCUST_PATCH] = "1"
    from gevent import monkey  # type: ignore[import-untyped]

    monkey.patch_all(thread=False)


def main() -> None:
    patch()
    from locust.main import main as locust_main

    locust_main()


if __name__ == "__main__":
    main()
