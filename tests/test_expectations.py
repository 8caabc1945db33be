from pathlib import Path
from typing import Any

import pytest

from bench.expectations import DEFAULT, Declaration, Expectations, ExpectationsError, Judgement, judge

REPO = Path(__file__).resolve().parents[1]

B3OS = """
[endpoint]
name = "b3os-beta"
description = "staging"

[cases."quickstart/*"]
outcome = "deviation"
reason = "everything differs a little"

[cases."quickstart/*/py06_*"]
outcome = "refused"
reason = "volumeMounts unsupported"
status = 400
code = "unsupported_option"
message = "volumeMounts"

[cases."quickstart/py-e2b-2.63.0/py06_volumes"]
outcome = "pass"

[cases."quickstart/*/py07_a"]
outcome = "skip"
reason = "first of equal length"

[cases."quickstart/*/py07_?"]
outcome = "fail"
reason = "second of equal length"
"""


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "b3os-beta.toml"
    path.write_text(text)
    return path


@pytest.fixture
def b3os(tmp_path: Path) -> Expectations:
    return Expectations.load(write(tmp_path, B3OS))


@pytest.mark.parametrize(
    ("case_id", "outcome"),
    [
        ("quickstart/py-e2b-2.63.0/py06_volumes", "pass"),  # exact id wins
        ("quickstart/js-e2b-2.51.0/py06_volumes", "refused"),  # longer pattern wins
        ("quickstart/py-e2b-2.63.0/py01_create", "deviation"),
        ("quickstart/py-e2b-2.63.0/py07_a", "skip"),  # equal length: first in file
        ("quickstart/py-e2b-2.63.0/py07_b", "fail"),
        ("envd/py-e2b-2.63.0/probe", "pass"),  # no match
    ],
)
def test_for_case_precedence(b3os: Expectations, case_id: str, outcome: str) -> None:
    assert b3os.for_case(case_id).outcome == outcome


def test_load_reads_the_refusal_fields(b3os: Expectations) -> None:
    assert b3os.for_case("quickstart/x/py06_volumes") == Declaration(
        outcome="refused",
        reason="volumeMounts unsupported",
        status=400,
        code="unsupported_option",
        message="volumeMounts",
    )


def test_load_none_expects_every_case_to_pass() -> None:
    assert Expectations.load(None).for_case("quickstart/py-e2b-2.63.0/py01_create") == DEFAULT


def test_shipped_local_declares_only_what_the_endpoint_lacks() -> None:
    local = Expectations.load(REPO / "expectations" / "local.toml")

    assert local.name == "local"
    assert {case: d.outcome for case, d in local.cases.items()} == {
        "probes/*/pr11_template_build": "refused",  # only the `base` template exists
        "refusals/*/rf13_template_build": "refused",
        # options it does not provide, refused 501 naming the member (sandboxes/e2b/fields.toml)
        "refusals/*/rf01_create_mcp": "refused",
        "refusals/*/rf03_create_volume_mounts": "refused",
        "refusals/*/rf04_create_iam": "refused",
        "refusals/*/rf17_create_network_transform_rules": "refused",
        "refusals/*/rf18_create_egress_proxy": "refused",
        "refusals/*/rf19_update_network_transform_rules": "refused",
        "refusals/*/rf20_update_egress_proxy": "refused",
        # E2B's own tests it does not pass yet (docs/suites.md, "E2B's own tests")
        "upstream/py-upstream/tests/*/sandbox_*/test_create.py::test_mcp_gateway_start_failure_kills_created_sandbox": (
            "fail"
        ),
        "upstream/js-upstream/tests/sandbox/create.test.ts > MCP gateway start failure kills the created "
        "sandbox": "fail",
    }
    assert local.for_case("quickstart/py-e2b-2.63.0/py01_create").outcome == "pass"


def test_for_endpoint_without_a_file_declares_nothing(tmp_path: Path) -> None:
    assert Expectations.for_endpoint("nowhere", tmp_path) == Expectations(name="nowhere")


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('[endpoint]\nname = "x"\ncolour = "red"\n', "unknown key endpoint.colour"),
        ('[endpoint]\nname = "x"\n[other]\n', "unknown key other"),
        (
            '[endpoint]\nname = "x"\n[cases."a/*"]\noutcome = "refused"\nreason = "r"\nstatuscode = 400\n',
            'unknown key cases."a/\\*".statuscode',
        ),
        ('[endpoint]\nname = "x"\n[cases."a"]\noutcome = "broken"\n', "outcome must be one of"),
        ('[endpoint]\nname = "x"\n[cases."a"]\noutcome = "fail"\n', "reason is required"),
        (
            '[endpoint]\nname = "x"\n[cases."a"]\noutcome = "fail"\nreason = "r"\nstatus = 500\n',
            "only applies",
        ),
        (
            '[endpoint]\nname = "x"\n[cases."a"]\noutcome = "refused"\nreason = "r"\nstatus = "400"\n',
            "integer",
        ),
        ('[cases."a"]\noutcome = "pass"\n', r"\[endpoint\] with a string `name` is required"),
        ("[endpoint\n", "Expected"),
    ],
)
def test_invalid_files_name_file_and_key(tmp_path: Path, text: str, message: str) -> None:
    path = write(tmp_path, text)

    with pytest.raises(ExpectationsError, match=rf"^{tmp_path}/b3os-beta.toml: .*{message}"):
        Expectations.load(path)


REFUSED = Declaration("refused", "no volumes", status=400, code="unsupported_option", message="volumeMounts")
REFUSAL_SEEN = {"status_code": 400, "error_code": "unsupported_option"}


@pytest.mark.parametrize(
    ("observed", "details", "error", "declared", "judgement"),
    [
        ("pass", {}, None, DEFAULT, Judgement("pass", "pass", True, None)),
        ("fail", {}, "boom", DEFAULT, Judgement("fail", "pass", False, "declared pass; observed fail")),
        (
            "error",
            {},
            "no route",
            DEFAULT,
            Judgement("error", "pass", False, "declared pass; observed error"),
        ),
        (
            "refused",
            REFUSAL_SEEN,
            "volumeMounts is not supported",
            REFUSED,
            Judgement("refused", "refused", True, "no volumes"),
        ),
        (
            "refused",
            {"status_code": 501, "error_code": "unsupported_option"},
            "volumeMounts is not supported",
            REFUSED,
            Judgement("deviation", "refused", False, "refused differently: status 501 (declared 400)"),
        ),
        (
            "refused",
            {"status_code": 400, "error_code": "bad_request"},
            "volumeMounts",
            REFUSED,
            Judgement(
                "deviation",
                "refused",
                False,
                "refused differently: code 'bad_request' (declared 'unsupported_option')",
            ),
        ),
        (
            "refused",
            REFUSAL_SEEN,
            "something else",
            REFUSED,
            Judgement("deviation", "refused", False, "refused differently: message lacks 'volumeMounts'"),
        ),
        (
            "refused",
            {**REFUSAL_SEEN, "message": "field volumeMounts rejected"},
            None,
            REFUSED,
            Judgement("refused", "refused", True, "no volumes"),
        ),
        (
            "refused",
            {"status_code": 418},
            "teapot",
            Declaration("refused", "any refusal"),
            Judgement("refused", "refused", True, "any refusal"),
        ),
        (
            "pass",
            {},
            None,
            REFUSED,
            Judgement("pass", "refused", False, "declared refused but passed: stale declaration?"),
        ),
        (
            "pass",
            {},
            None,
            Declaration("deviation", "cwd differs"),
            Judgement("pass", "deviation", False, "declared deviation but passed: stale declaration?"),
        ),
        (
            "pass",
            {},
            None,
            Declaration("fail", "known bug"),
            Judgement("pass", "fail", False, "declared fail but passed: stale declaration?"),
        ),
        ("fail", {}, "bug", Declaration("fail", "known bug"), Judgement("fail", "fail", True, "known bug")),
        (
            "deviation",
            {"cwd": "/workspace"},
            None,
            Declaration("deviation", "cwd differs"),
            Judgement("deviation", "deviation", True, "cwd differs"),
        ),
        (
            "fail",
            {},
            "x",
            Declaration("deviation", "cwd differs"),
            Judgement("fail", "deviation", False, "declared deviation: cwd differs; observed fail"),
        ),
        ("skip", {}, "no node", DEFAULT, Judgement("skip", "pass", False, "declared pass; observed skip")),
        (
            "skip",
            {},
            "no node",
            Declaration("skip", "not offered"),
            Judgement("skip", "skip", True, "not offered"),
        ),
        (
            "skip",
            {},
            "not in this SDK: volumes need e2b >= 2.60",
            REFUSED,
            Judgement("skip", "refused", True, "not in this SDK: volumes need e2b >= 2.60"),
        ),
        (
            "skip",
            {"reason": "not in this SDK (2.31.0)"},
            None,
            DEFAULT,
            Judgement("skip", "pass", True, "not in this SDK (2.31.0)"),
        ),
    ],
)
def test_judge(
    observed: Any, details: dict[str, Any], error: str | None, declared: Declaration, judgement: Judgement
) -> None:
    assert judge(observed, details, error, declared) == judgement


MATCHED = Declaration("fail", "cwd is /workspace", match=r"cwd \S+ is /workspace")


@pytest.mark.parametrize(
    ("observed", "details", "error", "judgement"),
    [
        ("fail", {}, "cwd /tmp is /workspace", Judgement("fail", "fail", True, "cwd is /workspace")),
        # searched in the details too (as JSON)
        ("fail", {"seen": "cwd /tmp is /workspace"}, "AssertionError", Judgement("fail", "fail", True, MATCHED.reason)),
        (
            "fail",
            {},
            "SandboxException: 502 Bad Gateway",
            Judgement(
                "deviation",
                "fail",
                False,
                "declared fail (match 'cwd \\\\S+ is /workspace'), observed a different failure: "
                "SandboxException: 502 Bad Gateway",
            ),
        ),
        (
            "error",
            {},
            "cwd /tmp is /workspace",
            Judgement("error", "fail", False, "declared fail: cwd is /workspace; observed error"),
        ),
        ("pass", {}, None, Judgement("pass", "fail", False, "declared fail but passed: stale declaration?")),
    ],
)
def test_match_pins_the_symptom_of_a_declared_failure(
    observed: str, details: dict[str, Any], error: str | None, judgement: Judgement
) -> None:
    assert judge(observed, details, error, MATCHED) == judgement  # type: ignore[arg-type]


def test_a_refusal_that_matches_its_fields_but_not_its_match_is_a_deviation() -> None:
    declared = Declaration("refused", "no stdin", status=400, match="stdin is not supported")

    judged = judge("refused", {"status_code": 400}, "pty is not supported", declared)

    assert (judged.outcome, judged.conformant) == ("deviation", False)
    assert (
        judged.note
        == "declared refused (match 'stdin is not supported'), observed a different failure: pty is not supported"
    )


@pytest.mark.parametrize(
    ("table", "message"),
    [
        ('outcome = "pass"\nmatch = "x"\n', "match only applies to outcome fail, deviation, error, refused"),
        ('outcome = "skip"\nreason = "r"\nmatch = "x"\n', "match only applies"),
        ('outcome = "fail"\nreason = "r"\nmatch = "(unclosed"\n', "match is not a regular expression"),
        ('outcome = "fail"\nreason = "r"\nmatch = 3\n', "match must be a string"),
    ],
)
def test_a_bad_match_is_refused_naming_file_and_key(tmp_path: Path, table: str, message: str) -> None:
    path = write(tmp_path, f'[endpoint]\nname = "x"\n[cases."a"]\n{table}')

    with pytest.raises(ExpectationsError, match=rf'^{tmp_path}/b3os-beta.toml: cases."a".{message}'):
        Expectations.load(path)
