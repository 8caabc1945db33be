"""Quirk profiles: named, documented deviations the embedded endpoint can be told to have.

`e2b` is faithful (no quirks). Every quirk can be switched alone, which is how the harness proves that
it detects each deviation.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace

from connectrpc.code import Code
from connectrpc.errors import ConnectError


class QuirkError(ValueError):
    """An unknown quirk or profile name, or a value of the wrong kind."""


@dataclass(frozen=True)
class Quirks:
    cwd_override: str | None = None  # the login profile cds here: every command runs in it
    session_leader: bool = False  # commands lead their own session, so `setsid` forks and returns
    end_on_exit: bool = False  # a command ends at process exit, not at output EOF
    refuse_stdin: bool = False
    refuse_pty: bool = False
    refuse_gzip_upload: bool = False
    refuse_signed_urls: bool = False
    watch_dir_404: bool = False
    metrics_404: bool = False
    template_build_501: bool = False
    refuse_create_options: frozenset[str] = field(default_factory=frozenset)
    token_prefix: str = ""
    sandbox_id_prefix: str = ""
    token_error: str = "invalid or missing access token"

    def check_start(self, request: object) -> None:
        if self.refuse_stdin and getattr(request, "stdin", False):
            raise ConnectError(Code.INVALID_ARGUMENT, "stdin is not supported: pass input in the command instead")
        if self.refuse_pty and getattr(request, "pty", None) is not None:
            raise ConnectError(Code.INVALID_ARGUMENT, "pty is not supported")

    def check_watch(self) -> None:
        if self.watch_dir_404:
            raise ConnectError(Code.NOT_FOUND, "watchDir is not supported")

    def command_cwd(self, cwd: str | None) -> str | None:
        return cwd or None

    def login_profile(self) -> tuple[str, ...]:
        return (f"cd {self.cwd_override}",) if self.cwd_override else ()

    def active(self) -> dict[str, object]:
        default = Quirks()
        return {
            f.name: getattr(self, f.name) for f in fields(self) if getattr(self, f.name) != getattr(default, f.name)
        }


PROFILES: dict[str, Quirks] = {"e2b": Quirks()}


def build(profile: str = "e2b", overrides: list[str] = ()) -> Quirks:  # type: ignore[assignment]
    """A profile plus `NAME[=VALUE]` overrides, as given to `e2b-bench serve --quirk`."""
    if profile not in PROFILES:
        raise QuirkError(f"unknown profile {profile!r}; known: {', '.join(sorted(PROFILES))}")
    quirks = PROFILES[profile]
    known = {f.name: f for f in fields(Quirks)}
    for item in overrides:
        name, _, value = item.partition("=")
        name = name.strip().replace("-", "_")
        if name not in known:
            raise QuirkError(f"unknown quirk {name!r}; known: {', '.join(sorted(known))}")
        current = getattr(Quirks(), name)
        if isinstance(current, bool):
            parsed: object = value.lower() not in ("0", "false", "no", "off") if value else True
        elif isinstance(current, frozenset):
            parsed = frozenset(v for v in value.split(",") if v)
        else:
            parsed = value or None
        quirks = replace(quirks, **{name: parsed})
    return quirks
