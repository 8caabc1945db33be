"""Preflight advice that is right (#27): each message is checked against what the pinned clients really do
with the bad value. The SDK or client runs with it first (and fails), then the advice must name the fix, and
the fixed value must work through the same client."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Mapping
from pathlib import Path

import httpx
import pytest
from loopback import closed_port
from run_cli import e2b_bench, only_run_dir

from bench.endpoints import PreflightError, preflight, resolve
from bench.localbox.server import LocalEndpoint
from bench.model.server import serving_model
from bench.results import read_run
from bench.runners.catalog import available_runners
from bench.selection import SelectionError, check_model

OTHER_FORMAT_KEY = "b3os_et_Zm9yIGEgdGhpcmQtcGFydHkgZW5kcG9pbnQ"  # a third-party endpoint's key shape
SDK_231 = "openai-agents-0.24.0"  # its venv pins e2b 2.31.0 and openai 3.57.0


def in_runner(runner: str, code: str, env: Mapping[str, str]) -> subprocess.CompletedProcess[str]:
    """`code` run by the pinned runner's own interpreter (built or reused from the cache)."""
    python = available_runners()[runner].prepare()
    base = {k: v for k, v in os.environ.items() if k in ("PATH", "HOME", "LANG", "TMPDIR")}
    return subprocess.run(
        [str(python), "-c", code], env={**base, **env}, capture_output=True, text=True, timeout=120, check=False
    )


LIST = "from e2b import Sandbox\ntry:\n    Sandbox.list().next_items()\nexcept Exception as exc:\n    print(exc)\n"


def test_a_trailing_v1_on_e2b_api_url_fails_the_sdk_and_the_advice_says_to_drop_it(endpoint: LocalEndpoint) -> None:
    with_v1 = {"E2B_API_KEY": endpoint.api_key, "E2B_API_URL": f"{endpoint.api_url}/v1"}
    sdk = in_runner("py-e2b-2.63.0", LIST, {**with_v1, "E2B_SANDBOX_URL": endpoint.api_url})
    fixed = in_runner("py-e2b-2.63.0", LIST, {**with_v1, "E2B_API_URL": endpoint.api_url})

    with pytest.raises(PreflightError) as advice:
        preflight(resolve("env", environ=with_v1), endpoint.api_key)

    # The SDK asked for /v1/v2/sandboxes: no such route (the embedded endpoint answers 501, as E2B's envd does).
    assert sdk.stdout.startswith("501: ") and "/v1/v2/sandboxes" in sdk.stdout, sdk
    assert fixed.stdout == "" and fixed.returncode == 0, fixed
    assert str(advice.value) == (
        f"{endpoint.api_url}/v1 has no sandbox list (HTTP 501): the SDKs add their own versioned paths "
        "(/v2/sandboxes), so drop the trailing /v1 from E2B_API_URL."
    )
    fixed_env = {"E2B_API_URL": endpoint.api_url, "E2B_SANDBOX_URL": endpoint.api_url}
    preflight(resolve("env", environ=fixed_env), endpoint.api_key)


def test_a_model_url_without_v1_fails_the_openai_client_and_the_advice_says_to_add_it() -> None:
    chat = (
        "import openai\ntry:\n"
        "    openai.OpenAI(base_url=BASE, api_key='k', max_retries=0).chat.completions.create(\n"
        "        model='m', messages=[{'role': 'user', 'content': 'hi'}])\n"
        "    print('answered')\n"
        "except openai.NotFoundError:\n    print('404')\n"
    )
    with serving_model() as model:
        root = model.endpoint.url
        without = in_runner(SDK_231, f"BASE = {root!r}\n{chat}", {})
        with_v1 = in_runner(SDK_231, f"BASE = {root + '/v1'!r}\n{chat}", {})
        with pytest.raises(SelectionError) as advice:
            check_model(root, "m", None)
        check_model(root + "/v1", "m", None)

    assert (without.stdout, with_v1.stdout) == ("404\n", "answered\n"), (without, with_v1)
    assert str(advice.value) == (
        f"--model-base-url {root} has no /models but {root}/v1 has: add /v1 (--model-base-url {root}/v1), "
        "OpenAI clients append /chat/completions to it as given"
    )


def test_a_key_of_another_format_is_refused_by_e2b_231_only_and_the_advice_names_the_switch(
    endpoint: LocalEndpoint, tmp_path: Path
) -> None:
    env = {"E2B_API_KEY": OTHER_FORMAT_KEY, "E2B_API_URL": endpoint.api_url, "E2B_SANDBOX_URL": endpoint.api_url}
    old = in_runner(SDK_231, LIST, env)
    old_switched_off = in_runner(SDK_231, LIST, {**env, "E2B_VALIDATE_API_KEY": "false"})
    new = in_runner("py-e2b-2.63.0", LIST, env)
    pins = {SDK_231: "2.31.0", "py-e2b-2.63.0": "2.63.0"}

    with pytest.raises(PreflightError) as advice:
        preflight(resolve("env", environ=env), OTHER_FORMAT_KEY, python_sdks=pins, environ={})
    with pytest.raises(PreflightError) as switched_off:
        preflight(
            resolve("env", environ=env), OTHER_FORMAT_KEY, python_sdks=pins, environ={"E2B_VALIDATE_API_KEY": "false"}
        )

    assert "Invalid API key format" in old.stdout, old
    # Without the check, or with the newer SDK, the key reaches the endpoint, which refuses it (401).
    assert "Invalid API key format" not in old_switched_off.stdout and "401" in old_switched_off.stdout
    assert "Invalid API key format" not in new.stdout and "401" in new.stdout
    assert str(advice.value) == (
        f"the key in E2B_API_KEY is not of the form e2b_<hex>, which {SDK_231} refuse before sending it "
        "('Invalid API key format'): export E2B_VALIDATE_API_KEY=false (those SDKs read it) or leave those "
        "runners out with --runner."
    )
    assert str(switched_off.value).startswith("authentication failed")  # the key itself, judged by the endpoint
    preflight(resolve("env", environ=env), endpoint.api_key, python_sdks=pins, environ={})


def sandboxes_tagged_preflight(endpoint: LocalEndpoint) -> list[dict]:
    """The endpoint's own list (a second path): sandboxes the preflight made that are still there."""
    with httpx.Client(base_url=endpoint.api_url, headers={"X-API-KEY": endpoint.api_key}, timeout=30) as api:
        listed = api.get("/v2/sandboxes", params={"metadata": "e2b-bench=preflight"})
    assert listed.status_code == 200, listed.text
    return listed.json()


def test_a_wrong_e2b_sandbox_url_fails_the_sdk_and_the_preflight_names_it_in_one_sentence(
    endpoint: LocalEndpoint,
) -> None:
    wrong = f"http://127.0.0.1:{closed_port()}"
    env = {"E2B_API_KEY": endpoint.api_key, "E2B_API_URL": endpoint.api_url, "E2B_SANDBOX_URL": wrong}
    run = "from e2b import Sandbox\nwith Sandbox.create(timeout=30) as s:\n    print(s.commands.run('echo hi').stdout)"
    sdk = in_runner("py-e2b-2.63.0", run, env)  # the SDK creates through the API, then cannot reach envd
    fixed = in_runner("py-e2b-2.63.0", run, {**env, "E2B_SANDBOX_URL": endpoint.api_url})

    with pytest.raises(PreflightError) as advice:
        preflight(resolve("env", environ=env), endpoint.api_key)

    assert sdk.returncode != 0 and "hi" not in sdk.stdout, sdk
    assert fixed.stdout.split() == ["hi"], fixed
    assert str(advice.value) == (
        f"E2B_SANDBOX_URL {wrong} is unreachable: connection refused; point it at the endpoint's sandbox (envd) URL."
    )
    preflight(resolve("env", environ={**env, "E2B_SANDBOX_URL": endpoint.api_url}), endpoint.api_key)
    assert sandboxes_tagged_preflight(endpoint) == []  # its own sandbox was killed, whatever it found


def test_a_run_with_a_wrong_e2b_sandbox_url_exits_2_with_the_sentence_and_runs_nothing(
    served: dict[str, str], endpoint: LocalEndpoint, tmp_path: Path
) -> None:
    wrong = f"http://127.0.0.1:{closed_port()}"

    done = e2b_bench("run", "sandboxes/e2b/test_quickstart.py", "--runner", "py-e2b-2.63.0", "--no-report",
                     "--results-dir", str(tmp_path), env={**served, "E2B_SANDBOX_URL": wrong})  # fmt: skip

    output = done.stdout + done.stderr
    assert done.returncode == 2, output[-3000:]
    assert f"E2B_SANDBOX_URL {wrong} is unreachable: connection refused" in output
    run = read_run(only_run_dir(tmp_path))
    assert run.cases == [] and run.footer is not None and run.footer["exit_code"] == 2
    assert sandboxes_tagged_preflight(endpoint) == []
