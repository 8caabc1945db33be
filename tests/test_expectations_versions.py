"""A declaration may hold for a range of releases only (`versions = ">=2.51,<2.53"`): the version that names the case's
runner decides, so a range run (`e2b-bench range`) judges each release by what is declared for it."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.expectations import DEFAULT, Expectations, ExpectationsError, in_range

FILE = """
[endpoint]
name = "ranged"

[cases."quickstart/py-e2b-*/py01_create"]
outcome = "fail"
reason = "the create route of these releases is missing"
versions = ">=2.51,<2.53"

[cases."quickstart/*/py01_create"]
outcome = "error"
reason = "any other release"
versions = "<2.0"
"""


@pytest.mark.parametrize(
    ("version", "outcome"),
    [("2.50.0", "pass"), ("2.51.0", "fail"), ("2.52.9", "fail"), ("2.53.0", "pass"), ("1.9.0", "error")],
)
def test_a_declaration_holds_only_for_the_releases_it_names(version: str, outcome: str) -> None:
    declared = Expectations.parse(FILE, Path("ranged.toml")).for_case(f"quickstart/py-e2b-{version}/py01_create")
    assert declared.outcome == outcome
    assert (declared is DEFAULT) == (outcome == "pass")


def test_a_runner_named_without_a_version_meets_no_ranged_declaration() -> None:
    declared = Expectations.parse(FILE, Path("ranged.toml")).for_case("quickstart/py-upstream/py01_create")
    assert declared is DEFAULT


@pytest.mark.parametrize("spec", ["2.26", ">=two", ">=2.26;<2.30", ""])
def test_a_range_that_is_not_one_is_refused_naming_the_case(spec: str) -> None:
    text = FILE.replace('">=2.51,<2.53"', f'"{spec}"')
    with pytest.raises(ExpectationsError, match=r'cases."quickstart/py-e2b-\*/py01_create".versions must be'):
        Expectations.parse(text, Path("ranged.toml"))


def test_in_range_compares_releases_as_numbers() -> None:
    assert in_range("2.10.0", ">2.9") and not in_range("2.9.1", ">=2.10")
    assert in_range("2.30", "==2.30.0") and not in_range("2.30.1", "!=2.30.1")
