"""envd probes, refusal cases and token rules, through the unmodified Python SDK (and plain HTTP where the
rule is about the wire itself).

Probes record what the endpoint really does (`details.observed`, next to `details.e2b`: what E2B does) and
end as `pass` (as E2B), `deviation` (observed differs) or `refused` (the call was refused: status, code
and message recorded). Refusal cases pass when the option works and are `refused` when the endpoint
refuses it; declarations say which an endpoint is documented to do.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import sys
import time
from typing import Any

import httpx
from driver import Context, Deviation, Observed, Refused, excerpt, expect, main, rest, step

SUITES = {"probes", "refusals", "tokens"}
ERROR_CODES = re.compile(r"\b(unsupported_option|not_implemented|envd_token_invalid|invalid_argument)\b")


# --- helpers ------------------------------------------------------------------------------------


def sandbox(ctx: Context) -> Any:
    """One shared sandbox for the probes that only observe."""
    if ctx.sandbox is None:
        ctx.sandbox = ctx.new_sandbox(timeout=ctx.shared_timeout_s)
        ctx.sandbox_id = ctx.sandbox.sandbox_id
        ctx.shared_created(ctx.sandbox_id)
        ctx.watch(ctx.sandbox_id, lambda: ctx.sandbox, lambda: forget_sandbox(ctx))
    return ctx.sandbox


def forget_sandbox(ctx: Context) -> None:
    """The shared sandbox is dropped (replaced): the next probe that needs one makes it."""
    ctx.sandbox = ctx.sandbox_id = None


REFUSALS = {"InvalidArgumentException", "NotFoundException", "FileNotFoundException", "SandboxNotFoundException"}


def refused(exc: BaseException, what: str) -> BaseException:
    """A refusal when the SDK says the endpoint refused; any other exception stays a failure."""
    if type(exc).__name__ not in REFUSALS and getattr(exc, "status_code", None) is None:
        return exc
    message = str(exc)
    status = getattr(exc, "status_code", None)
    code = None
    if type(exc).__name__ == "InvalidArgumentException":
        code, status = "invalid_argument", status or 400
    if match := ERROR_CODES.search(message):
        code = match.group(1)
    return Refused(
        f"{what}: {type(exc).__name__}: {message}",
        status_code=status,
        error_code=code,
        message=excerpt(message),
        exception=type(exc).__name__,
    )


def observe(obs: Observed, observed: Any, e2b: Any) -> None:
    obs["observed"] = observed
    obs["e2b"] = e2b
    if observed != e2b:
        raise Deviation(f"observed {json.dumps(observed)}, E2B: {json.dumps(e2b)}")


def envd_url(sandbox_id: str) -> str:
    if os.environ.get("E2B_SANDBOX_URL"):
        return os.environ["E2B_SANDBOX_URL"].rstrip("/")
    return f"https://49983-{sandbox_id}.{os.environ.get('E2B_DOMAIN', 'e2b.app')}"


def raw_create(ctx: Context, client: httpx.Client, **body: Any) -> httpx.Response:
    response = client.post(
        "/v2/sandboxes", json={"templateID": ctx.template or "base", "timeout": 60, "metadata": ctx.metadata, **body}
    )
    if response.status_code == 201:
        ctx.created.append(response.json()["sandboxID"])
    return response


def http_refusal(response: httpx.Response, what: str) -> Refused:
    try:
        body = response.json()
    except ValueError:
        body = {"raw": response.text[:300]}
    message = str(body.get("message", body)) if isinstance(body, dict) else str(body)
    code = body.get("error_code") or body.get("code") if isinstance(body, dict) else None
    if isinstance(code, int):
        code = ERROR_CODES.search(message).group(1) if ERROR_CODES.search(message) else None
    return Refused(
        f"{what}: HTTP {response.status_code}: {message}",
        status_code=response.status_code,
        error_code=code,
        message=excerpt(message),
        body=body,
    )


# --- probes -------------------------------------------------------------------------------------


@step("pr01_default_cwd")
def default_cwd(ctx: Context, obs: Observed) -> None:
    sbx = sandbox(ctx)
    observe(
        obs,
        {
            "default": sbx.commands.run("pwd").stdout.strip(),
            "cwd=/tmp": sbx.commands.run("pwd", cwd="/tmp").stdout.strip(),
        },
        {"default": "/home/user", "cwd=/tmp": "/tmp"},
    )


@step("pr02_login_profile")
def login_profile(ctx: Context, obs: Observed) -> None:
    sbx = sandbox(ctx)
    script = 'shopt -q login_shell && echo login || echo non-login; echo "$0"; pwd; echo "$HOME"; whoami'
    lines = sbx.commands.run(script, cwd="/usr").stdout.split("\n")[:5]
    obs["path"] = sbx.commands.run("echo $PATH").stdout.strip()
    observe(obs, lines, ["login", "/bin/bash", "/usr", "/home/user", "user"])


@step("pr03_setsid")
def setsid_behaviour(ctx: Context, obs: Observed) -> None:
    from e2b import CommandExitException

    sbx = sandbox(ctx)
    seen = {}
    for name, command in (
        ("exec setsid", "exec setsid bash -c 'sleep 1; echo late; exit 5'"),
        ("setsid -w", "setsid -w bash -c 'sleep 0.3; echo waited; exit 6'"),
    ):
        try:
            result = sbx.commands.run(command)
            seen[name] = {"exit_code": result.exit_code, "stdout": result.stdout}
        except CommandExitException as exc:
            seen[name] = {"exit_code": exc.exit_code, "stdout": exc.stdout}
    observe(
        obs,
        seen,
        {"exec setsid": {"exit_code": 5, "stdout": "late\n"}, "setsid -w": {"exit_code": 6, "stdout": "waited\n"}},
    )


@step("pr04_exit_codes")
def exit_codes(ctx: Context, obs: Observed) -> None:
    from e2b import CommandExitException

    sbx = sandbox(ctx)
    seen = {}
    for name, command in (("exit 5", "exit 5"), ("self SIGKILL", "kill -9 $$"), ("missing binary", "no-such-cmd")):
        try:
            result = sbx.commands.run(command)
            seen[name] = [result.exit_code, result.error]
        except CommandExitException as exc:
            seen[name] = [exc.exit_code, exc.error]
    observe(
        obs,
        seen,
        {
            "exit 5": [5, "exit status 5"],
            "self SIGKILL": [-1, "signal: killed"],
            "missing binary": [127, "exit status 127"],
        },
    )


@step("pr05_stdin")
def stdin(ctx: Context, obs: Observed) -> None:
    sbx = sandbox(ctx)
    try:
        handle = sbx.commands.run("read line; echo got:$line", background=True, stdin=True)
        sbx.commands.send_stdin(handle.pid, "ping\n")
        result = handle.wait()
    except Exception as exc:
        raise refused(exc, "commands.run(stdin=True)") from None
    closed = sbx.commands.run("cat; echo eof", stdin=False)
    observe(obs, [result.stdout, closed.stdout], ["got:ping\n", "eof\n"])


@step("pr06_pty")
def pty(ctx: Context, obs: Observed) -> None:
    from e2b import CommandExitException, PtySize

    sbx = sandbox(ctx)
    output = bytearray()
    try:
        terminal = sbx.pty.create(PtySize(rows=24, cols=80))
    except Exception as exc:
        raise refused(exc, "pty.create") from None
    sbx.pty.send_stdin(terminal.pid, b"echo pty-$((40+2)); exit 3\n")
    try:
        terminal.wait(on_pty=output.extend)
        exit_code = 0
    except CommandExitException as exc:
        exit_code = exc.exit_code
    text = output.decode(errors="replace")
    observe(obs, {"echoed": "pty-42" in text, "exit_code": exit_code}, {"echoed": True, "exit_code": 3})


@step("pr07_gzip")
def gzip_files(ctx: Context, obs: Observed) -> None:
    sbx = sandbox(ctx)
    data = os.urandom(4096) + b"e2b" * 2000
    try:
        sbx.files.write("/tmp/gzip.bin", data, gzip=True)
    except Exception as exc:
        raise refused(exc, "files.write(gzip=True)") from None
    back = sbx.files.read("/tmp/gzip.bin", format="bytes", gzip=True)
    observe(obs, {"round_trip": back == data}, {"round_trip": True})


@step("pr08_signed_urls")
def signed_urls(ctx: Context, obs: Observed) -> None:
    sbx = sandbox(ctx)
    upload = httpx.post(sbx.upload_url("/home/user/signed.txt"), files={"file": ("signed.txt", b"signed")})
    if upload.status_code != 200:
        raise http_refusal(upload, "upload_url")
    download = httpx.get(sbx.download_url("/home/user/signed.txt", use_signature_expiration=120))
    if download.status_code != 200:
        raise http_refusal(download, "download_url")
    observe(obs, download.content.decode(errors="replace"), "signed")


@step("pr09_watch_dir")
def watch_dir(ctx: Context, obs: Observed) -> None:
    sbx = sandbox(ctx)
    sbx.files.make_dir("/home/user/watched")
    try:
        handle = sbx.files.watch_dir("/home/user/watched")
    except Exception as exc:
        raise refused(exc, "files.watch_dir") from None
    try:
        sbx.files.write("/home/user/watched/new.txt", "x")
        time.sleep(0.5)
        events = handle.get_new_events()
    finally:
        handle.stop()
    observe(obs, ("new.txt", "CREATE") in {(e.name, e.type.name) for e in events}, True)


@step("pr10_metrics")
def metrics(ctx: Context, obs: Observed) -> None:
    sbx = sandbox(ctx)
    try:
        samples = sbx.get_metrics()
    except Exception as exc:
        raise refused(exc, "get_metrics") from None
    obs["samples"] = [str(s) for s in samples[:2]]
    observe(obs, bool(samples) and samples[-1].mem_total > 0, True)


@step("pr11_template_build")
def template_build(ctx: Context, obs: Observed) -> None:
    with rest() as client:
        response = client.post("/v3/templates", json={"name": f"e2b-bench-{ctx.run_id[-8:]}", "cpuCount": 1})
    if response.status_code >= 400:
        raise http_refusal(response, "POST /v3/templates")
    obs["status_code"] = response.status_code


@step("pr12_relative_paths")
def relative_paths(ctx: Context, obs: Observed) -> None:
    sbx = sandbox(ctx)
    info = sbx.files.write("relative-probe.txt", "rel")
    seen = sbx.commands.run("cat relative-probe.txt 2>/dev/null || echo missing").stdout
    observe(
        obs,
        {"written_to": info.path, "command_sees": seen},
        {"written_to": "/home/user/relative-probe.txt", "command_sees": "rel"},
    )


@step("pr13_large_output")
def large_output(ctx: Context, obs: Observed) -> None:
    result = sandbox(ctx).commands.run("head -c 2500000 /dev/zero | tr '\\0' 'x'; echo")
    observe(obs, len(result.stdout), 2_500_001)


@step("pr14_binary_round_trip")
def binary_round_trip(ctx: Context, obs: Observed) -> None:
    sbx = sandbox(ctx)
    data = os.urandom(20 << 20)
    sbx.files.write("/tmp/blob.bin", data)
    inside = sbx.commands.run("sha256sum /tmp/blob.bin").stdout.split()[0]
    back = hashlib.sha256(sbx.files.read("/tmp/blob.bin", format="bytes")).hexdigest()
    expected = hashlib.sha256(data).hexdigest()
    observe(obs, {"inside": inside == expected, "read_back": back == expected}, {"inside": True, "read_back": True})


@step("pr15_kill_reaches_grandchildren")
def kill_grandchildren(ctx: Context, obs: Observed) -> None:
    from e2b import CommandExitException

    sbx = sandbox(ctx)
    pidfile = f"/tmp/grandchild-{time.time_ns()}"
    handle = sbx.commands.run(f"sleep 300 >/dev/null 2>&1 & echo $! > {pidfile}; wait", background=True)
    # The grandchild runs once its pid is written (a fixed wait lost that race on a busy host).
    sbx.commands.run(f"timeout 30 sh -c 'until [ -s {pidfile} ]; do sleep 0.05; done'")
    sbx.commands.kill(handle.pid)
    with contextlib.suppress(CommandExitException):
        handle.wait()
    alive = sbx.commands.run(f"kill -0 $(cat {pidfile}) 2>/dev/null && echo alive || echo gone").stdout.strip()
    sbx.commands.run(f"kill -9 $(cat {pidfile}) 2>/dev/null; true")
    # envd signals the command's own process only: its children are left running.
    observe(obs, alive, "alive")


@step("pr16_output_after_exit")
def output_after_exit(ctx: Context, obs: Observed) -> None:
    # The child writes a second after the command's process exits: an endpoint that ends a command at its exit
    # has ended it by then even on a loaded host (after 0.4 s, a starved one delivered the line 1 run in 4).
    result = sandbox(ctx).commands.run("(sleep 1; echo late) & echo early")
    # envd ends a command when its output closes, not when its own process exits.
    observe(obs, result.stdout, "early\nlate\n")


# HUP, INT, QUIT and TERM by their bit in /proc/<pid>/status masks: a process envd (a Go program) starts
# finds them at their defaults.
STOP_SIGNALS = {"HUP": 0, "INT": 1, "QUIT": 2, "TERM": 14}


@step("pr17_signal_dispositions")
def signal_dispositions(ctx: Context, obs: Observed) -> None:
    sbx = sandbox(ctx)
    lines = sbx.commands.run("grep -E '^Sig(Ign|Blk):' /proc/self/status").stdout.splitlines()
    status = dict(line.split(":\t", 1) for line in lines)
    obs["sig_ign"], obs["sig_blk"] = status.get("SigIgn"), status.get("SigBlk")
    ignored = int(status.get("SigIgn", "0"), 16)
    seen = {
        "ignored": [name for name, bit in STOP_SIGNALS.items() if ignored >> bit & 1],
        "blocked": status.get("SigBlk"),
        "kill -TERM of a child": sbx.commands.run("sleep 30 & kill -TERM $!; wait $!; echo $?").stdout.strip(),
    }
    # A command ignores and blocks nothing a user would send it: `kill -TERM` ends a child with 128 + 15.
    observe(obs, seen, {"ignored": [], "blocked": "0000000000000000", "kill -TERM of a child": "143"})


# --- refusal cases ------------------------------------------------------------------------------

TRANSFORM_RULES = {"example.com": [{"transform": {"headers": {"X-E2b-Bench": "1"}}}]}
EGRESS_PROXY = {"address": "127.0.0.1:3128", "username": "e2b-bench", "password": "e2b-bench-placeholder"}
CREATE_OPTIONS = {
    "rf01_create_mcp": {"mcp": {"exa": {"apiKey": "e2b-bench-placeholder"}}},
    "rf03_create_volume_mounts": {"volumeMounts": [{"name": "e2b-bench-volume", "path": "/mnt/data"}]},
    "rf04_create_iam": {"iam": {"tokens": {"bench": {"audience": "e2b-bench", "tokenType": "jwt"}}}},
    "rf05_create_network_rules": {"network": {"allowOut": ["1.1.1.1"], "allowPublicTraffic": False}},
    "rf06_create_on_timeout_filesystem": {"autoPause": True, "autoPauseMemory": False},
    # fidelity: field table and second-path checks
    "rf17_create_network_transform_rules": {"network": {"rules": TRANSFORM_RULES}},
    "rf18_create_egress_proxy": {"network": {"egressProxy": EGRESS_PROXY}},
}
# Network update options, each alone: they pass when the endpoint applies them.
UPDATE_OPTIONS = {
    "rf19_update_network_transform_rules": {"rules": TRANSFORM_RULES},
    "rf20_update_egress_proxy": {"egressProxy": EGRESS_PROXY},
}


def _create_option(step_id: str):
    def run(ctx: Context, obs: Observed) -> None:
        body = CREATE_OPTIONS[step_id]
        obs["body"] = body
        with rest() as client:
            response = raw_create(ctx, client, **body)
        if response.status_code != 201:
            raise http_refusal(response, f"create with {', '.join(body)}")

    return run


for _step_id in CREATE_OPTIONS:
    step(_step_id)(_create_option(_step_id))


@step("rf02_create_auto_resume")
def create_auto_resume(ctx: Context, obs: Observed) -> None:
    """Accepted, and reported as the sandbox's lifecycle (its effect, a wake on traffic, is a behaviours case)."""
    body = {"autoPause": True, "autoResume": {"enabled": True}}
    obs["body"] = body
    with rest() as client:
        response = raw_create(ctx, client, **body)
        if response.status_code != 201:
            raise http_refusal(response, "create with autoPause, autoResume")
        detail = client.get(f"/sandboxes/{response.json()['sandboxID']}")
    obs["lifecycle"] = lifecycle = detail.json().get("lifecycle") if detail.status_code == 200 else detail.status_code
    wanted = {"autoResume": True, "onTimeout": "pause"}
    expect(lifecycle == wanted, f"GET /sandboxes/{{id}} reports lifecycle {lifecycle!r}, expected {wanted!r}")


def _update_option(step_id: str):
    def run(ctx: Context, obs: Observed) -> None:
        body = UPDATE_OPTIONS[step_id]
        obs["body"] = body
        with rest() as client:
            made = raw_create(ctx, client)
            expect(made.status_code == 201, f"create answered {made.status_code}")
            response = client.put(f"/sandboxes/{made.json()['sandboxID']}/network", json=body)
        if response.status_code != 204:
            raise http_refusal(response, f"PUT /sandboxes/{{id}}/network with {', '.join(body)}")

    return run


for _step_id in UPDATE_OPTIONS:
    step(_step_id)(_update_option(_step_id))


@step("rf16_create_private_traffic")
def create_private_traffic(ctx: Context, obs: Observed) -> None:
    body = {"network": {"allowPublicTraffic": False}}
    obs["body"] = body
    with rest() as client:
        response = raw_create(ctx, client, **body)
    if response.status_code != 201:
        raise http_refusal(response, "create with network.allowPublicTraffic false")
    token = response.json().get("trafficAccessToken")
    obs["has_traffic_token"] = bool(token)  # the token itself is a secret: only whether it came
    expect(isinstance(token, str) and bool(token), "allowPublicTraffic: false was accepted with no trafficAccessToken")


@step("rf07_pause_without_memory")
def pause_without_memory(ctx: Context, obs: Observed) -> None:
    sbx = ctx.new_sandbox()
    with rest() as client:
        response = client.post(f"/sandboxes/{sbx.sandbox_id}/pause", json={"memory": False})
    if response.status_code != 204:
        raise http_refusal(response, "pause with memory=false")


@step("rf08_connect_on_resume_reboot")
def connect_reboot(ctx: Context, obs: Observed) -> None:
    sbx = ctx.new_sandbox()
    with rest() as client:
        client.post(f"/sandboxes/{sbx.sandbox_id}/pause", json={})
        response = client.post(f"/v2/sandboxes/{sbx.sandbox_id}/connect", json={"timeout": 60, "memory": False})
    if response.status_code not in (200, 201):
        raise http_refusal(response, "connect with memory=false")


@step("rf09_unknown_body_member_ignored")
def unknown_member(ctx: Context, obs: Observed) -> None:
    with rest() as client:
        response = raw_create(ctx, client, e2bBenchUnknownMember={"nested": [1, 2]})
    obs["status_code"] = response.status_code
    expect(response.status_code == 201, f"create with an unknown member answered {response.status_code}")


def _envd_refusal(rpc: str, body: dict[str, Any], streaming: bool):
    def run(ctx: Context, obs: Observed) -> None:
        with rest() as client:
            made = raw_create(ctx, client)
        expect(made.status_code == 201, f"create answered {made.status_code}")
        sandbox_id, token = made.json()["sandboxID"], made.json().get("envdAccessToken")
        payload = json.dumps(body).encode()
        headers = {"E2b-Sandbox-Id": sandbox_id, "Connect-Protocol-Version": "1"}
        if token:
            headers["X-Access-Token"] = token
        if streaming:
            headers["Content-Type"] = "application/connect+json"
            payload = b"\0" + len(payload).to_bytes(4, "big") + payload
        else:
            headers["Content-Type"] = "application/json"
        with httpx.stream("POST", f"{envd_url(sandbox_id)}{rpc}", content=payload, headers=headers, timeout=30) as r:
            first = next(r.iter_raw(), b"")
            status = r.status_code
        obs["status_code"] = status
        if streaming and status == 200 and first[:1] == b"\2":
            end = json.loads(first[5:]).get("error", {})
            raise Refused(
                f"{rpc}: {end.get('code')}: {end.get('message')}",
                status_code=200,
                error_code=end.get("code"),
                message=end.get("message"),
            )
        if status != 200:
            try:
                error = json.loads(first)
            except ValueError:
                error = {"message": first[:200].decode(errors="replace")}
            code = error.get("code")
            raise Refused(
                f"{rpc}: HTTP {status}: {error.get('message')}",
                status_code=status,
                error_code=code if isinstance(code, str) else None,
                message=error.get("message"),
            )

    return run


ENVD_REFUSALS = {
    "rf10_envd_stdin": (
        "/process.Process/Start",
        {"process": {"cmd": "/bin/bash", "args": ["-l", "-c", "cat"]}, "stdin": True},
        True,
    ),
    "rf11_envd_pty": (
        "/process.Process/Start",
        {"process": {"cmd": "/bin/bash", "args": ["-i", "-l"]}, "pty": {"size": {"cols": 80, "rows": 24}}},
        True,
    ),
    "rf14_envd_watch_dir": ("/filesystem.Filesystem/CreateWatcher", {"path": "/home/user"}, False),
}
for _step_id, (_rpc, _body, _streaming) in ENVD_REFUSALS.items():
    step(_step_id)(_envd_refusal(_rpc, _body, _streaming))


@step("rf12_gzip_upload")
def gzip_upload(ctx: Context, obs: Observed) -> None:
    import gzip as gz

    with rest() as client:
        made = raw_create(ctx, client)
    sandbox_id, token = made.json()["sandboxID"], made.json().get("envdAccessToken") or ""
    response = httpx.post(
        f"{envd_url(sandbox_id)}/files",
        params={"path": "/tmp/gz.txt"},
        content=gz.compress(b"compressed"),
        headers={
            "E2b-Sandbox-Id": sandbox_id,
            "X-Access-Token": token,
            "Content-Type": "application/octet-stream",
            "Content-Encoding": "gzip",
        },
    )
    if response.status_code != 200:
        raise http_refusal(response, "POST /files with Content-Encoding: gzip")


@step("rf13_template_build")
def template_build_refusal(ctx: Context, obs: Observed) -> None:
    template_build(ctx, obs)


@step("rf15_get_metrics")
def get_metrics_refusal(ctx: Context, obs: Observed) -> None:
    with rest() as client:
        made = raw_create(ctx, client)
        response = client.get(f"/sandboxes/{made.json()['sandboxID']}/metrics")
    if response.status_code != 200:
        raise http_refusal(response, "GET /sandboxes/{id}/metrics")
    obs["samples"] = len(response.json())


# --- token rules --------------------------------------------------------------------------------


@step("tk01_list_and_get_hide_the_token")
def token_hidden(ctx: Context, obs: Observed) -> None:
    with rest() as client:
        made = raw_create(ctx, client)
        sandbox_id = made.json()["sandboxID"]
        detail = client.get(f"/sandboxes/{sandbox_id}").text
        listed = client.get("/v2/sandboxes").text
    leaks = [name for name, body in (("get", detail), ("list", listed)) if "envdAccessToken" in body]
    obs["token_shape"] = re.sub(r"[A-Za-z0-9_-]", "x", made.json().get("envdAccessToken") or "")[:80]
    obs["token_prefix"] = (re.match(r"^([a-z0-9]+_)+", made.json().get("envdAccessToken") or "") or [""])[0]
    expect(not leaks, f"envdAccessToken returned by {', '.join(leaks)}")


@step("tk02_every_refused_token_gets_the_same_401")
def same_401(ctx: Context, obs: Observed) -> None:
    with rest() as client:
        made = raw_create(ctx, client).json()
        sandbox_id, token = made["sandboxID"], made["envdAccessToken"]
        url = f"{envd_url(sandbox_id)}/filesystem.Filesystem/Stat"

        def stat(headers: dict[str, str]) -> tuple[int, str]:
            response = httpx.post(url, json={"path": "/tmp"}, headers={"Content-Type": "application/json", **headers})
            return response.status_code, response.text

        answers = {
            "good": stat({"E2b-Sandbox-Id": sandbox_id, "X-Access-Token": token}),
            "missing": stat({"E2b-Sandbox-Id": sandbox_id}),
            "wrong": stat({"E2b-Sandbox-Id": sandbox_id, "X-Access-Token": token[:-4] + "AAAA"}),
        }
        client.delete(f"/sandboxes/{sandbox_id}")
        answers["killed"] = stat({"E2b-Sandbox-Id": sandbox_id, "X-Access-Token": token})
    obs["answers"] = {k: [status, excerpt(body)] for k, (status, body) in answers.items()}
    refusals = {answers[k] for k in ("missing", "wrong", "killed")}
    expect(answers["good"][0] == 200, f"a valid token got {answers['good'][0]}")
    expect(len(refusals) == 1, f"refusals differ: {sorted(refusals)}")
    expect(next(iter(refusals))[0] == 401, f"refused with {next(iter(refusals))[0]}, not 401")


@step("tk03_connect_rotates_the_token")
def rotation(ctx: Context, obs: Observed) -> None:
    with rest() as client:
        made = raw_create(ctx, client).json()
        sandbox_id, first = made["sandboxID"], made["envdAccessToken"]
        second = client.post(f"/v2/sandboxes/{sandbox_id}/connect", json={"timeout": 60}).json()["envdAccessToken"]
    url = f"{envd_url(sandbox_id)}/filesystem.Filesystem/Stat"
    statuses = [
        httpx.post(url, json={"path": "/tmp"}, headers={"E2b-Sandbox-Id": sandbox_id, "X-Access-Token": t}).status_code
        for t in (first, second)
    ]
    obs["statuses"] = statuses
    expect(second != first, "connect returned the same token")
    expect(statuses == [200, 200], f"old and new token answered {statuses}, expected both 200 within 60 s")
    ctx.state["rotated"] = (sandbox_id, first)


@step("tk04_rotated_out_token_expires_after_60s")
def rotated_out(ctx: Context, obs: Observed) -> None:
    sandbox_id, first = ctx.state["rotated"]
    time.sleep(61)
    url = f"{envd_url(sandbox_id)}/filesystem.Filesystem/Stat"
    status = httpx.post(
        url, json={"path": "/tmp"}, headers={"E2b-Sandbox-Id": sandbox_id, "X-Access-Token": first}
    ).status_code
    obs["status_code"] = status
    expect(status == 401, f"a token rotated out 61 s ago answered {status}, expected 401")


if __name__ == "__main__":
    sys.exit(main(SUITES))
