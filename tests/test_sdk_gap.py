"""A step that uses an API the pinned SDK lacks is `skip` (reason sdk_gap), never a failure of the endpoint;
what an endpoint's answer breaks stays a failure."""

from __future__ import annotations

import sys
from pathlib import Path

import e2b
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "sandboxes" / "e2b" / "python"))
from driver import sdk_gap


def raised(action) -> BaseException:  # type: ignore[no-untyped-def]
    with pytest.raises(Exception) as caught:
        action()
    return caught.value


def test_a_method_the_sdk_class_lacks_is_a_gap() -> None:
    assert sdk_gap(raised(lambda: e2b.Sandbox.no_such_method)) == "Sandbox.no_such_method"


def test_a_name_the_package_does_not_export_is_a_gap() -> None:
    def missing() -> None:
        from e2b import NoSuchThing  # type: ignore[attr-defined]  # noqa: F401

    assert "cannot import name 'NoSuchThing'" in str(sdk_gap(raised(missing)))


def test_a_keyword_an_sdk_method_does_not_take_is_a_gap() -> None:
    refused = TypeError("Sandbox.pause() got an unexpected keyword argument 'mode'")

    assert sdk_gap(refused) == "Sandbox.pause(mode=...)"


@pytest.mark.parametrize(
    "exc",
    [
        AttributeError("'str' object has no attribute 'value'", name="value", obj="running"),  # an endpoint's value
        TypeError("fetch() got an unexpected keyword argument 'mode'"),  # not an SDK function
        e2b.SandboxException("boom"),
        ValueError("bad"),
    ],
)
def test_anything_else_stays_an_observed_failure(exc: BaseException) -> None:
    assert sdk_gap(exc) is None
