"""What a conformance run targets, checked before anything starts: the endpoint (under its quirk
profile), the quirks of the embedded endpoint, the declarations it is judged by, and the runners.

Shared by the CLI (which reports a problem as one sentence and exit 2 before pytest starts) and the
pytest plugin (which raises it as a usage error when pytest is run directly).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

import httpx

from .endpoints import Endpoint, EndpointError, resolve
from .expectations import Expectations, ExpectationsError
from .runners.catalog import Runner, available_runners, default_runners

if TYPE_CHECKING:
    from .localbox.quirks import Quirks


class SelectionError(Exception):
    """The run cannot target what was asked; the message says what to change."""


@dataclass(frozen=True)
class Selection:
    endpoint: Endpoint
    quirks: Quirks | None  # for the embedded endpoint only
    expectations: Expectations
    runners: list[Runner]


def select(
    endpoint: str,
    *,
    profile: str = "e2b",
    quirks: Sequence[str] = (),
    expectations: str | Path | None = None,
    runners: Sequence[str] = (),
    matrix: bool = False,
) -> Selection:
    """Resolve and check everything a run needs to know before it starts; raises `SelectionError`."""
    from .localbox.quirks import QuirkError, build

    try:
        chosen = resolve(endpoint)
        chosen = chosen.provider.with_profile(chosen, profile, list(quirks))
        if expectations:
            chosen = dataclasses.replace(chosen, expectations=Path(expectations).resolve())
        built = build(profile, list(quirks)) if chosen.provider.quirks else None
        declared = Expectations.load(chosen.expectations)
    except (EndpointError, QuirkError) as exc:
        raise SelectionError(str(exc)) from None
    except ExpectationsError as exc:
        raise SelectionError(f"{exc}: give a valid declarations file with --expectations") from None
    return Selection(chosen, built, declared, select_runners(runners, matrix))


def select_runners(names: Sequence[str], matrix: bool = False) -> list[Runner]:
    known = available_runners()
    if matrix:
        return list(known.values())
    if not names:
        return default_runners()
    known = {**known, **versioned_runners(names, known)}  # `BASE@VERSION`: any release as a runner
    unknown = [name for name in names if name not in known]
    if unknown:
        raise SelectionError(
            f"unknown runner {unknown[0]!r}: choose from {', '.join(sorted(known))} (see `e2b-bench runners`)"
        )
    return [known[name] for name in names]


def versioned_runners(names: Sequence[str], known: dict[str, Runner]) -> dict[str, Runner]:
    """The runners `BASE@VERSION` names make (bench/runners/versioned.py), under the names they were given."""
    from .runners.envs import RunnerEnvError
    from .runners.versioned import SEPARATOR, versioned

    specs = {name: runner.spec for name, runner in known.items()}
    try:
        return {name: Runner(versioned(name, specs)) for name in names if SEPARATOR in name}
    except RunnerEnvError as exc:
        raise SelectionError(str(exc)) from None


def runners_named(patterns: Sequence[str]) -> list[str]:
    """The runners a `--case` selection needs when no `--runner` is given: the default ones, plus any other
    pin a pattern names (`quickstart/py-e2b-2.45.1/*`), so a case id alone re-runs a case of a matrix run."""
    if not patterns:
        return []
    defaults = [runner.name for runner in default_runners()]
    named = [name for name in available_runners() if name not in defaults and any(name in p for p in patterns)]
    return [*defaults, *named] if named else []


MODEL_PROBE_TIMEOUT_S = 10.0


def check_model(
    base_url: str | None, model: str | None, key_env: str | None, environ: Mapping[str, str] = os.environ
) -> None:
    """The real-model flags, checked before a run spends anything on frameworks; raises `SelectionError`.

    The base URL must answer HTTP at all (any status: a model server may want a key for `/models`), the model
    must be named and the key variable, when named, must be set."""
    if not base_url:
        if model is not None or key_env is not None:  # given, even empty: it would be ignored silently
            flag = "--model" if model is not None else "--model-key-env"
            raise SelectionError(f"{flag} applies to a real model only: give --model-base-url too, or drop {flag}")
        return
    parsed = urlsplit(base_url)
    if parsed.scheme not in ("http", "https") or not parsed.netloc:
        raise SelectionError(f"--model-base-url {base_url!r} is not an http(s) URL: give e.g. http://127.0.0.1:8000/v1")
    if not (model or "").strip():
        raise SelectionError("--model is empty: name the model the server should use (e.g. --model gpt-4o-mini)")
    if key_env and not environ.get(key_env):
        raise SelectionError(
            f"the variable {key_env} named by --model-key-env is not set: export it with the model's key "
            "(the harness reads the key from it and never writes it anywhere)"
        )
    base = base_url.rstrip("/")
    try:
        listing = httpx.get(base + "/models", timeout=MODEL_PROBE_TIMEOUT_S)
        # OpenAI clients append /chat/completions to the base URL as given: a server under /v1 needs it there.
        missing = listing.status_code == 404 and not base.endswith("/v1")
        if missing and httpx.get(base + "/v1/models", timeout=MODEL_PROBE_TIMEOUT_S).status_code != 404:
            raise SelectionError(
                f"--model-base-url {base_url} has no /models but {base}/v1 has: add /v1 "
                f"(--model-base-url {base}/v1), OpenAI clients append /chat/completions to it as given"
            )
    except httpx.HTTPError as exc:
        raise SelectionError(
            f"the model at --model-base-url {base_url} is unreachable ({type(exc).__name__}: {exc}): "
            "check the URL and that the server is running"
        ) from None
