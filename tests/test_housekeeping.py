"""The end-of-run sweep against a loopback API whose list filter returns other runs' sandboxes too."""

from __future__ import annotations

from loopback import serving
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from bench.housekeeping import RUN_METADATA_KEY, Sweep, leak_record, sweep

RUN = "20261130T000000Z-quickstart-local"
TAGS = {"mine": RUN, "theirs": "another-run", "created-here": "not-shown", "gone": None}


def api(deleted: list[str]) -> Starlette:
    """Lists every sandbox whatever the filter; `get` tells the truth; DELETE of `mine` answers 500 once."""

    async def listing(request: Request) -> Response:
        assert request.query_params["metadata"] == f"{RUN_METADATA_KEY}={RUN}"
        return JSONResponse([{"sandboxID": sandbox_id} for sandbox_id in TAGS])

    async def get(request: Request) -> Response:
        tag = TAGS[request.path_params["id"]]
        if tag is None:
            return JSONResponse({"code": 404, "message": "not found"}, status_code=404)
        return JSONResponse({"sandboxID": request.path_params["id"], "metadata": {RUN_METADATA_KEY: tag}})

    async def delete(request: Request) -> Response:
        deleted.append(request.path_params["id"])
        return Response(status_code=204 if request.path_params["id"] != "mine" else 500)

    return Starlette(
        routes=[
            Route("/v2/sandboxes", listing),
            Route("/sandboxes/{id}", get, methods=["GET"]),
            Route("/sandboxes/{id}", delete, methods=["DELETE"]),
        ]
    )


def test_only_this_runs_sandboxes_are_deleted_and_a_leaky_list_filter_is_recorded() -> None:
    deleted: list[str] = []
    with serving(api(deleted)) as url:
        found = sweep(url, "key", RUN, own={"created-here"})

    assert deleted == ["mine", "created-here"]
    assert found == Sweep(
        survivors=["mine", "created-here"], deletes={"mine": 500, "created-here": 204}, foreign=["theirs", "gone"]
    )
    record = leak_record(found, None)
    assert (record.outcome, record.conformant) == ("error", False)
    assert record.error == (
        "2 sandbox(es) of this run were still alive at the end: mine, created-here; "
        "deleting them failed: mine (HTTP 500); "
        f"the list filter metadata={RUN_METADATA_KEY}=<run id> returned 2 sandbox(es) of other runs, left alone: "
        "theirs, gone"
    )
    assert record.details == found.__dict__


def test_foreign_sandboxes_alone_make_the_leak_check_a_deviation_not_an_error() -> None:
    record = leak_record(Sweep(foreign=["theirs"]), None)

    assert (record.outcome, record.expected, record.conformant) == ("deviation", "pass", False)
    assert record.details == {"survivors": [], "foreign": ["theirs"]}


def test_a_clean_end_is_a_pass() -> None:
    record = leak_record(Sweep(), None)

    assert (record.outcome, record.conformant, record.error, record.details) == ("pass", True, None, {"survivors": []})
