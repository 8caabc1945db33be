"""Quirk profiles: named, documented deviations the embedded endpoint can be told to have.

`e2b` is faithful (no quirks). Every quirk can be switched alone, which is how the harness proves that
it detects each deviation.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, fields, replace
from typing import Any

from connectrpc.code import Code
from connectrpc.errors import ConnectError

KILL_UNCONFIRMED_S = 30  # how long the kill_unconfirmed quirk still reports a killed sandbox running


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
    watch_dir_404: bool = False  # the watch RPCs answer HTTP 404 in E2B's REST error shape
    metrics_404: bool = False
    template_build_501: bool = False
    # Lifecycle options answered 400 `unsupported_option` naming the field (see OPTION_FIELDS).
    refuse_create_options: frozenset[str] = field(default_factory=frozenset)
    token_prefix: str = ""
    sandbox_id_prefix: str = ""
    token_error: str = "invalid or missing access token"
    # Fidelity deviations: each brings back one behaviour E2B does not have.
    dir_mode_go_bit: bool = False  # a directory's EntryInfo.mode carries Go's ModeDir bit (0o20000000000)
    remove_missing_404: bool = False  # files.remove of a missing path fails with not_found
    upload_no_metadata: bool = False  # POST /files answers without metadata and keeps the old metadata
    proc_size_zero: bool = False  # a file whose stat size is 0 (/proc) downloads empty
    kill_stream_clean_end: bool = False  # killing a sandbox ends its command streams with a clean end event
    # a sandbox that stops keeps its open connections: a command or watch stream ends with an envd `unavailable`
    # message instead of losing its connection (a pause leaves it open), so the SDKs do not say it was killed
    kill_stream_unavailable: bool = False
    kill_returns_early: bool = False  # commands.kill answers at once; the process is killed a moment later
    streams_outlive_clients: bool = False  # a stream whose client went away runs on until it ends
    signed_url_generic_error: bool = False  # a refused signed URL gets the generic token error
    metrics_ignore_window: bool = False  # metrics answer the current sample whatever start/end ask
    pause_keeps_memory: bool = False  # a pause with memory: false still keeps every process
    files_write_as_user: bool = False  # POST /files writes with the user's rights (403 under root's dirs)
    unknown_route_404: bool = False  # an unimplemented route answers a bare 404
    ignore_traffic_token: bool = False  # allowPublicTraffic: false is accepted and ignored (no trafficAccessToken)
    # fidelity: wake on traffic, host masking, watch events
    ignore_auto_resume: bool = False  # autoResume accepted and reported; traffic never wakes a paused sandbox
    ignore_mask_host: bool = False  # maskRequestHost accepted and ignored: the sandbox's servers see the caller's Host
    extra_write_event: bool = False  # an upload truncates after opening: a watcher sees one WRITE more than envd's
    # What the agent computer contract (the `computer` suite) needs, each broken alone.
    kill_leader_only: bool = False  # job control in every shell: a group cancellation ends only the leader
    kill_unconfirmed: bool = False  # a killed sandbox is still reported running by GET for KILL_UNCONFIRMED_S
    drop_mutation_answer: bool = False  # a rename (Filesystem/Move) is applied and its answer lost (unavailable)
    no_useradd: bool = False  # the template as the sandbox sees it has no useradd
    # fidelity: field table and second-path checks
    # What an endpoint reports, or how far an option reaches, differing from what is: each breaks one.
    wrong_cpu_count: bool = False  # GET and list report one vCPU more than the sandbox has
    stale_file_info: bool = False  # Stat answers a path's first answer again, whatever changed since
    sticky_cwd: bool = False  # a command without cwd runs in the cwd the sandbox's previous command was given, if any
    pty_strips_cr: bool = False  # a pty's output loses the CR of the terminal's CRLF line endings
    # fidelity: details no case asserts, each caught by the differential judgement (bench/differential/) alone
    coarse_times: bool = False  # precision: REST times (startedAt, endAt) in whole seconds, not milliseconds
    metrics_in_mib: bool = False  # units: metrics' memory and disk figures in MiB, not bytes
    timeout_keeps_endat: bool = False  # later-call value: after a set timeout a list still reports the old endAt
    root_home_of_user: bool = False  # user environment: a command run as root gets the default user's HOME
    upload_replaces_file: bool = False  # replaced-file metadata: an upload over a file makes a new one (mode, links)
    connect_sets_lifetime: bool = False  # lifetime after connect: connecting to a running sandbox leaves it 60 s
    # Wire mutations by name (bench/localbox/mutations.py): a middleware changes requests and responses.
    mutations: frozenset[str] = field(default_factory=frozenset)
    # Remote conditions: the N-th command stream of the server's life (0: every one) never ends.
    stream_stall: int | None = None
    # Remote conditions (bench/localbox/conditions.py): what a distant, shared endpoint does to a run.
    rate_limit: int = 0  # creates per second past which a create answers 429 with Retry-After; 0: none
    transient_5xx: float = 0.0  # the fraction of control-plane requests answered 502 or 503 (seeded)
    latency: int = 0  # ms every request waits before the endpoint sees it
    slow_create: tuple[int, int] = (0, 0)  # ms a create takes on top, `MS` or `MIN-MAX` (seeded)
    # "METHOD /route" (a `{name}` or `*` segment matches any one): every such request answers 503, as from a
    # gateway in front of an endpoint that lacks the route; not a moment, so a conformance failure
    unavailable_route: str | None = None
    # "METHOD /route": every such request answers 404, as an endpoint that lacks a route later SDK releases use
    # (`e2b-bench bisect` names the first release that meets it)
    missing_route: str | None = None
    # Hostile: what a misbehaving third-party endpoint does to a whole run (bench/localbox/hostile.py).
    envd_pool: int = 0  # per sandbox, at most N process streams (Start, Connect) served at once; the next waits
    pool_until_exit: bool = False  # with envd_pool: a slot is held until its command ends, even after its client left
    max_running: int = 0  # a create (or a resume) past N running sandboxes answers 429 "at most N sandboxes at once"
    deleted_502: bool = False  # every later request about a DELETEd sandbox answers 502 "sandbox not found"
    ignore_user: bool = False  # commands and file operations run as the default user whatever user they ask

    def check_start(self, request: object) -> None:
        if self.refuse_stdin and getattr(request, "stdin", False):
            raise ConnectError(Code.INVALID_ARGUMENT, "stdin is not supported: pass input in the command instead")
        if self.refuse_pty and getattr(request, "pty", None) is not None:
            raise ConnectError(Code.INVALID_ARGUMENT, "pty is not supported")

    def refused_option(self, call: str, body: dict) -> str | None:
        """The first option of a create/pause/connect body this endpoint refuses, by its wire name."""
        for option in sorted(self.refuse_create_options):
            found = OPTION_FIELDS[option](call, body)
            if found:
                return found
        return None

    def command_cwd(self, cwd: str | None, previous: str | None = None) -> str | None:
        """The cwd a command runs in: its own, else (`sticky_cwd`) the one the previous command was given."""
        return cwd or (previous if self.sticky_cwd else None)

    def user(self, asked: str, default: str) -> str:
        """The user a command or file operation runs as: the one it asks, or (`ignore_user`) the default."""
        return default if self.ignore_user else asked

    def cpu_count(self, real: int) -> int:
        return real + 1 if self.wrong_cpu_count else real

    def pty_output(self, data: bytes) -> bytes:
        return data.replace(b"\r\n", b"\n") if self.pty_strips_cr else data

    def login_profile(self) -> tuple[str, ...]:
        lines = (f"cd {self.cwd_override}",) if self.cwd_override else ()
        # Exported SHELLOPTS hands job control (monitor) down to every bash a command starts.
        return lines + (("set -m", "export SHELLOPTS") if self.kill_leader_only else ())

    def hidden_paths(self) -> tuple[str, ...]:
        """Files of the template removed from each sandbox's view of it (an overlay whiteout in that sandbox)."""
        return ("/usr/sbin/useradd",) if self.no_useradd else ()

    def active(self) -> dict[str, object]:
        default = Quirks()
        return {
            f.name: getattr(self, f.name) for f in fields(self) if getattr(self, f.name) != getattr(default, f.name)
        }


def _create_member(name: str):
    return lambda call, body: name if call == "create" and body.get(name) not in (None, {}, []) else None


def _network(call: str, body: dict) -> str | None:
    extra = sorted(set(body.get("network") or {}) - {"allowOut", "denyOut"}) if call == "create" else []
    return f"network.{extra[0]}" if extra else None


def _memory_false(wanted: str, field_name: str):
    return lambda call, body: field_name if call == wanted and body.get(field_name.split(".")[-1]) is False else None


def _auto_resume(call: str, body: dict) -> str | None:
    enabled = (body.get("autoResume") or {}).get("enabled") if call == "create" else None
    return "lifecycle.autoResume" if enabled else None


# Refusable options: name -> how to find it in a request body ("create", "pause" or "connect").
OPTION_FIELDS = {
    "mcp": _create_member("mcp"),
    "volumeMounts": _create_member("volumeMounts"),
    "iam": _create_member("iam"),
    "network": _network,
    "autoResume": _auto_resume,
    "onTimeoutFilesystem": _memory_false("create", "autoPauseMemory"),
    "pauseWithoutMemory": _memory_false("pause", "memory"),
    "connectReboot": _memory_false("connect", "memory"),
}

# A third-party compatibility layer with every deviation documented for it.
B3OS_BETA = Quirks(
    cwd_override="/workspace",
    session_leader=True,
    end_on_exit=True,
    refuse_stdin=True,
    refuse_pty=True,
    refuse_gzip_upload=True,
    refuse_signed_urls=True,
    watch_dir_404=True,
    metrics_404=True,
    template_build_501=True,
    refuse_create_options=frozenset(OPTION_FIELDS),
    token_prefix="b3os_et_",
    sandbox_id_prefix="sbx-",
    token_error="envd_token_invalid: the access token is missing, wrong or expired",
)

# A faithful endpoint seen from afar: 50 ms away, creates of 1-2 s, a rare 502/503 and a 429 past a burst of
# creates. Conformance verdicts under it are those of `e2b`: only the wall clock differs.
REMOTE_E2B = Quirks(rate_limit=4, transient_5xx=0.01, latency=50, slow_create=(1000, 2000))

# A misbehaving third-party endpoint: commands served by a small pool whose slots commands left running keep (a
# few such block the rest), a cap on running sandboxes, a deterministic 502 after a delete, `user` ignored, output
# delivered in one chunk at a command's end, and process streams that end without Connect's end-of-stream frame.
HOSTILE = Quirks(
    envd_pool=2,
    pool_until_exit=True,
    max_running=40,
    deleted_502=True,
    ignore_user=True,
    mutations=frozenset({"output_held", "stream_no_end_frame"}),
)

PROFILES: dict[str, Quirks] = {
    "e2b": Quirks(),
    "b3os-beta": B3OS_BETA,
    "remote-e2b": REMOTE_E2B,
    "hostile": HOSTILE,
}


def _number(name: str, value: str, current: int | float | tuple[int, int]) -> object:
    """`value` read as `current`'s kind: a count, a fraction in [0, 1], or milliseconds `MS` / `MIN-MAX`."""
    low, _, high = value.partition("-")
    try:
        if isinstance(current, tuple):
            span = (int(low), int(high or low))
            if 0 <= span[0] <= span[1]:
                return span
        elif isinstance(current, float):
            fraction = float(value)
            if 0 <= fraction <= 1:
                return fraction
        elif int(value) >= 0:
            return int(value)
    except ValueError:
        pass
    wanted = {tuple: "milliseconds MS or MIN-MAX", float: "a fraction from 0 to 1"}.get(type(current), "a count >= 0")
    raise QuirkError(f"quirk {name} takes {wanted}, not {value!r}")


COUNTS = frozenset({"stream_stall"})  # quirks whose value is a whole number; given bare, 0 (every one)


ROUTES = frozenset({"unavailable_route", "missing_route"})  # quirks whose value is "METHOD /route"


def _route(name: str, value: str) -> str:
    method, _, route = value.strip().partition(" ")
    if not method.isalpha() or not route.strip().startswith("/"):
        raise QuirkError(f"quirk {name} takes a METHOD and a /route, e.g. 'POST /sandboxes/{{sandboxID}}/pause', "
                         f"not {value!r}")  # fmt: skip
    return f"{method.upper()} {route.strip()}"


def _count(name: str, value: str) -> int:
    if not value:
        return 0
    if not value.isdigit():
        raise QuirkError(f"quirk {name} takes a whole number (or none, for every one), not {value!r}")
    return int(value)


def build(profile: str = "e2b", overrides: Sequence[str] = ()) -> Quirks:
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
        parsed: object
        if name in COUNTS:
            parsed = _count(name, value)
        elif isinstance(current, bool):
            parsed = value.lower() not in ("0", "false", "no", "off") if value else True
        elif isinstance(current, frozenset):
            parsed = frozenset(v for v in value.split(",") if v)
        elif isinstance(current, int | float | tuple):
            parsed = _number(name, value, current)
        elif name in ROUTES:
            parsed = _route(name, value)
        else:
            parsed = value or None
        # The field is named at run time, so its type is the default's (checked above), not a static one.
        change: dict[str, Any] = {name: parsed}
        quirks = replace(quirks, **change)
    return quirks
