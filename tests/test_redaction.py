import json
import string
from pathlib import Path

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from bench.redaction import REDACTED, Redactor, is_secret_name

SECRET = "s3cr3t-v4lue-0042"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("key e2b_0123456789abcdef01234567 used", f"key {REDACTED} used"),
        ('{"X-API-KEY": "abc", "n": 1}', f'{{"X-API-KEY": "{REDACTED}", "n": 1}}'),
        ("x-access-token: tok123\nnext", f"x-access-token: {REDACTED}\nnext"),
        ("e2b-traffic-access-token: tok123\nnext", f"e2b-traffic-access-token: {REDACTED}\nnext"),
        ("Sandbox(traffic_access_token='tok123')", f"Sandbox(traffic_access_token='{REDACTED}')"),
        ("Authorization: Bearer abc.def", f"Authorization: {REDACTED}"),
        ("Authorization: Basic cm9vdDo=", f"Authorization: {REDACTED}"),
        (
            '{"envdAccessToken": "t1", "trafficAccessToken": "t2"}',
            f'{{"envdAccessToken": "{REDACTED}", "trafficAccessToken": "{REDACTED}"}}',
        ),
        ("{'apiKey': 'abc'}", f"{{'apiKey': '{REDACTED}'}}"),
        ('Sandbox.create(api_key="e2b_wrong")', f'Sandbox.create(api_key="{REDACTED}")'),
        ("E2B_API_KEY=abc OTHER=1", f"E2B_API_KEY={REDACTED} OTHER=1"),
        ("export OPENAI_API_KEY='sk-1'", f"export OPENAI_API_KEY='{REDACTED}'"),
        ("ANTHROPIC_API_KEY=x", f"ANTHROPIC_API_KEY={REDACTED}"),
        ('GATEWAY_ACCESS_TOKEN="a b"', f'GATEWAY_ACCESS_TOKEN="{REDACTED}"'),
        ('api_key="cut-off', f'api_key="{REDACTED}"'),
        (
            "/files?path=/a&signature=v1_abc&signature_expiration=99&username=user",
            f"/files?path=/a&signature={REDACTED}&signature_expiration=99&username=user",
        ),
        ("/x?access_token=abc&b=2", f"/x?access_token={REDACTED}&b=2"),
        ("/x?a=1&key=abc&b=2", f"/x?a=1&key={REDACTED}&b=2"),
        ("<td>Authorization: Basic cm9vdDo=</td>", f"<td>Authorization: {REDACTED}</td>"),
    ],
)
def test_redact_text_patterns(text: str, expected: str) -> None:
    assert Redactor().redact_text(text) == expected


@pytest.mark.parametrize(
    "text",
    [
        "next_token=abc",
        "X-Next-Token: abc",
        "keyboard=1 monkey=2",
        "/x?monkey=1&keys=2",
        "max_tokens=100",
        "e2b_shortbeef",
    ],
)
def test_redact_text_leaves_lookalikes(text: str) -> None:
    assert Redactor().redact_text(text) == text


def test_added_secret_is_redacted_with_its_url_and_json_spellings() -> None:
    redactor = Redactor(['pa"ss/word+1'])

    text = redactor.redact_text('raw pa"ss/word+1 url pa%22ss%2Fword%2B1 json pa\\"ss/word+1')

    assert text == f"raw {REDACTED} url {REDACTED} json {REDACTED}"


def test_short_values_are_not_secrets() -> None:
    redactor = Redactor(["short", None, ""])

    assert redactor.redact_text("short words stay") == "short words stay"


def test_redact_obj_secret_named_keys_and_substrings() -> None:
    redactor = Redactor([SECRET])
    obj = {
        "headers": {"X-API-KEY": "k", "x-access-token": "t", "X-Next-Token": "cursor"},
        "env": {"E2B_API_KEY": "k", "HF_TOKEN": "h", "next_token": "cursor", "PATH": "/bin"},
        "trafficAccessToken": None,
        "log": [f"saw {SECRET}", (1, f"{SECRET}!")],
        SECRET: 3,
    }

    assert redactor.redact_obj(obj) == {
        "headers": {"X-API-KEY": REDACTED, "x-access-token": REDACTED, "X-Next-Token": "cursor"},
        "env": {"E2B_API_KEY": REDACTED, "HF_TOKEN": REDACTED, "next_token": "cursor", "PATH": "/bin"},
        "trafficAccessToken": None,
        "log": [f"saw {REDACTED}", (1, f"{REDACTED}!")],
        REDACTED: 3,
    }


@pytest.mark.parametrize(
    ("name", "secret"),
    [
        ("X-API-KEY", True),
        ("x-api-key", True),
        ("Authorization", True),
        ("E2B-Traffic-Access-Token", True),
        ("APIKEY", True),
        ("openai_api_key", True),
        ("MY_SERVICE_TOKEN", True),
        ("next_token", False),
        ("X-Next-Token", False),
        ("key", False),
        ("tokens", False),
    ],
)
def test_is_secret_name(name: str, secret: bool) -> None:
    assert is_secret_name(name) is secret


def test_redact_is_idempotent_on_every_pattern() -> None:
    redactor = Redactor([SECRET])
    text = (
        f"{SECRET} e2b_0123456789abcdef0123 Authorization: Bearer x api_key='y' "
        'E2B_API_KEY=z /f?signature=s&key=k {"apiKey": "q"}'
    )
    once = redactor.redact_text(text)

    assert redactor.redact_text(once) == once


def test_redact_text_redacts_every_secret_of_a_large_input_and_keeps_the_rest() -> None:
    # A run's wire log is megabytes: each of 50 known values and each secret-shaped member, wherever it is in
    # 5,000 records, goes, and nothing else changes (how long it takes is a benchmark's question, not a test's)
    secrets_ = [f"{SECRET}-{n}" for n in range(50)]
    redactor = Redactor(secrets_)
    records = [
        {"stdout": "x" * 200 + secrets_[n % 50], "url": "/files?path=/a&username=user", "apiKey": f"k{n}"}
        for n in range(5000)
    ]
    expected = [
        {"stdout": "x" * 200 + REDACTED, "url": "/files?path=/a&username=user", "apiKey": REDACTED} for _ in records
    ]

    assert json.loads(redactor.redact_text(json.dumps(records))) == expected


# Characters API keys and tokens are made of.
TOKEN_CHARS = string.ascii_letters + string.digits + "-_./+="
secrets = st.text(alphabet=TOKEN_CHARS, min_size=8, max_size=40)
filler = st.text(max_size=30)
json_leaves = st.one_of(st.none(), st.booleans(), st.integers(), filler)


@st.composite
def nested_with_secret(draw: st.DrawFn) -> tuple[str, object]:
    secret = draw(secrets)
    embedded = draw(filler) + secret + draw(filler)
    tree = draw(
        st.recursive(
            json_leaves,
            lambda children: st.one_of(st.lists(children, max_size=4), st.dictionaries(filler, children, max_size=4)),
            max_leaves=12,
        )
    )
    # Put the secret in a value, a key and a list item so every path of the walk is exercised.
    return secret, {"tree": tree, "value": embedded, embedded: [tree, embedded], "list": [1, [embedded]]}


@given(nested_with_secret())
@example(("00000000", {"tree": 12_500_000_000, "list": [1.0000000025]}))  # a secret of digits inside numbers
def test_secret_never_survives_redact_obj(case: tuple[str, object]) -> None:
    secret, obj = case
    redactor = Redactor([secret])

    assert secret not in json.dumps(redactor.redact_obj(obj), ensure_ascii=False)


@given(secrets, filler, filler)
def test_secret_never_survives_redact_text(secret: str, before: str, after: str) -> None:
    redactor = Redactor([secret])

    assert secret not in redactor.redact_text(before + secret + after + secret)


@given(st.text(max_size=200))
def test_redact_text_is_idempotent(text: str) -> None:
    redactor = Redactor(["fixed-secret-value"])
    once = redactor.redact_text(text)

    assert redactor.redact_text(once) == once


PINS = Path(__file__).parent / "fixtures" / "pins" / "framework-runners.json"
# Packages whose names look like secret names, each with a version it really has been published under.
LOOKALIKE_PINS = {
    "cookie": "0.7.2",
    "Cookie": "1.0.2",
    "set-cookie-parser": "2.7.1",
    "tough-cookie": "5.1.2",
    "authorization": "0.1.4",
    "api_key": "0.1.0",
    "keyring": "25.6.0",
    "oauthlib": "3.3.1",
    "PyJWT": "2.15.1",
    "python-dateutil": "2.9.0.post0",
    "@ag-ui/core": "0.1.1-canary.beta.0",
    "node": "v20.20.2",
}


def pin_lines(pins: dict[str, dict[str, str]]) -> str:
    return "\n".join(
        f"{runner}: {name}=={version}" for runner, names in pins.items() for name, version in names.items()
    )


def test_realistic_pin_sets_pass_redaction_unchanged() -> None:
    """The pins the framework runners really reported (342 packages), as a mapping, as JSON and as `name==version`."""
    pins = json.loads(PINS.read_text())
    redactor = Redactor([SECRET, "e2b_0123456789abcdef0123456789"])

    assert (
        redactor.redact_obj(pins),
        redactor.redact_text(json.dumps(pins, indent=2)),
        redactor.redact_text(pin_lines(pins)),
    ) == (pins, json.dumps(pins, indent=2), pin_lines(pins))


@pytest.mark.parametrize(("name", "version"), sorted(LOOKALIKE_PINS.items()))
def test_a_package_named_like_a_secret_keeps_its_version(name: str, version: str) -> None:
    redactor = Redactor()

    assert (
        redactor.redact_obj({"runner": {name: version}}),
        redactor.redact_text(f"{name}=={version}"),
        redactor.redact_text(json.dumps({name: version})),
    ) == ({"runner": {name: version}}, f"{name}=={version}", json.dumps({name: version}))


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("Cookie: session=abc123def", f"Cookie: {REDACTED}"),
        ('{"cookie": "sid=0.7.2"}', f'{{"cookie": "{REDACTED}"}}'),
        ('{"Set-Cookie": "token; Path=/"}', f'{{"Set-Cookie": "{REDACTED}"}}'),
        ("OPENAI_API_KEY=sk-proj.1.2 next", f"OPENAI_API_KEY={REDACTED} next"),
    ],
)
def test_real_cookies_and_keys_are_still_redacted(text: str, expected: str) -> None:
    assert Redactor().redact_text(text) == expected


def test_a_known_secret_is_redacted_even_when_it_looks_like_a_version() -> None:
    redactor = Redactor(["2026.11.30.12345"])

    assert redactor.redact_obj({"cookie": "2026.11.30.12345", "note": "v 2026.11.30.12345"}) == {
        "cookie": REDACTED,
        "note": f"v {REDACTED}",
    }
