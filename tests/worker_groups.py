"""Tests that share a module's fixture run on one test worker: spread over several (pytest-xdist's `-n`),
each worker would set the fixture up again, and some are whole `e2b-bench run`s or a wheel build.

A pytest plugin (tests/conftest.py takes its hook): it marks such tests `xdist_group(<module>)`, which
`--dist loadgroup` (what `./e2b-bench selftest` passes) keeps together. Other tests stay spread one by one.
"""

from __future__ import annotations

from collections.abc import Generator

import pytest

SHARED_SCOPES = frozenset({"module", "package", "class"})


@pytest.hookimpl(wrapper=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> Generator[None, None, None]:
    for item in items:
        info = getattr(item, "_fixtureinfo", None)
        if info is None or item.get_closest_marker("xdist_group") is not None:
            continue  # not a function, or grouped by its author
        defs = (d for name in info.names_closure for d in info.name2fixturedefs.get(name, ()))
        if any(d.scope in SHARED_SCOPES for d in defs):
            item.add_marker(pytest.mark.xdist_group(item.nodeid.split("::", 1)[0]))
    yield  # pytest-xdist's worker names each grouped test `<nodeid>@<group>`, which its scheduler reads
    if getattr(config.option, "loadgroup", False):
        for item in items:
            _name_group(item)


def _name_group(item: pytest.Item) -> None:
    """`<nodeid>@<group>` as pytest-xdist 3.8 means to name it: its rename writes a field pytest 9.2 no longer
    reads (the test would be scheduled alone, and the fixture set up on every worker)."""
    groups = sorted(
        {str(m.args[0] if m.args else m.kwargs.get("name", "default")) for m in item.iter_markers("xdist_group")}
    )
    suffix = "@" + "_".join(groups)
    if not groups or item.nodeid.endswith(suffix):
        return
    node_id = getattr(item, "_id", None)
    if node_id is not None:  # pytest >= 9.2: a structured id, its string form cached from the parsed text
        item._id = type(node_id).parse(item.nodeid + suffix)
