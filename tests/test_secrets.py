"""No credential gets out: not into the ledger, the artifacts, junit or the terminal.

The one redaction (`pytest_evalloop/model_api/redaction.py`) is tested on its own, then every
error path is run for real with a distinctive API key, auth token and URL password, against a
gateway that echoes credentials back, and everything the runs left behind is searched for them.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pytest_evalloop.ledger import reader as ledger_reader
from pytest_evalloop.model_api.redaction import REDACTED, environment_secrets, redact
from pytest_evalloop.testing import FakeAnthropic
from tests.test_run import QIDS, make_set, run, spec

# Spelled in two parts so the tree holds nothing shaped like a real key.
KEY = "sk-" + "ant-api03-DistinctiveKey-7q3wZ"
TOKEN = "tok-DistinctiveToken-5m2xQ"
PASSWORD = "pw-DistinctivePassword-9k1z"
SECRETS = (KEY, TOKEN, PASSWORD)


# --- the function ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "kept"),
    [
        ("x-api-key: abcdef123456", "x-api-key: "),
        ('{"x-api-key": "abcdef123456"}', '{"x-api-key": "'),
        ("Authorization: Bearer abcdef123456", "Authorization: Bearer "),
        ("authorization=Basic YWxpY2U6cGFzc3dvcmQ=", "authorization=Basic "),
        ("sent bearer abcdef123456 upstream", "sent bearer "),
        ("GET https://alice:hunter2@example.com/v1", "GET https://"),
    ],
)
def test_auth_headers_bearer_tokens_and_url_userinfo_are_blanked(text: str, kept: str) -> None:
    out = redact(text, [])
    assert out.startswith(kept + REDACTED), out
    for secret in ("abcdef123456", "YWxpY2U6cGFzc3dvcmQ=", "hunter2", "alice"):
        assert secret not in out


def test_environment_credentials_are_blanked_anywhere(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ANTHROPIC_API_KEY", KEY)
    monkeypatch.setenv("ANTHROPIC_AUTH_TOKEN", TOKEN)
    monkeypatch.setenv("ANTHROPIC_BASE_URL", f"http://evaluser:{PASSWORD}@127.0.0.1:9")
    monkeypatch.setenv("EVALLOOP_SHORT_TOKEN", "1")  # too short to blank: it would blank all
    text = f"key {KEY}, token {TOKEN}, password {PASSWORD}, user evaluser (1 of 1)"
    out = redact(text)
    assert not any(secret in out for secret in SECRETS)
    assert out.count(REDACTED) == 4 and "(1 of 1)" in out
    assert KEY in environment_secrets() and PASSWORD in environment_secrets()
    # Without the environment's values the patterns still catch the headers.
    assert redact("no secrets here, only http://host.invalid/path", []) == (
        "no secrets here, only http://host.invalid/path"
    )


def test_redaction_leaves_json_lines_valid(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ANTHROPIC_API_KEY", KEY)
    import json

    line = json.dumps({"error": f'gateway said {{"x-api-key": "{KEY}"}} via http://u:p@h/'})
    assert json.loads(redact(line))["error"].count(REDACTED) == 2


# --- every error path, for real ----------------------------------------------------------------


def _hits(texts: dict[str, str]) -> dict[str, list[str]]:
    """Where each secret occurs: a name per text that holds it."""
    return {s: [name for name, text in texts.items() if s in text] for s in SECRETS}


def _files(root: Path) -> dict[str, str]:
    return {
        str(path): path.read_bytes().decode("utf-8", errors="replace")
        for path in root.rglob("*")
        if path.is_file()
    }


def test_no_error_path_lets_a_credential_out(
    pytester: pytest.Pytester,
    fake: FakeAnthropic,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    shop = make_set(pytester.path, QIDS)
    seen: dict[str, str] = {}

    def session(label: str, faults: list[dict[str, object]], *args: str) -> pytest.RunResult:
        fake.policy = spec(shop, faults=faults).policy()
        junit = tmp_path / f"{label}.xml"
        result = run(
            pytester,
            shop,
            f"--eval-label={label}",
            f"--junitxml={junit}",
            "--eval-retries=0",
            "--eval-concurrency=1",
            "--eval-request-timeout=0.5",
            *args,
        )
        seen[f"{label}: terminal"] = result.stdout.str() + result.stderr.str()
        seen[f"{label}: junit"] = junit.read_text(encoding="utf-8")
        return result

    # The API key. Case 1: the judge gets an HTML page; case 2: the answerer's request hangs;
    # case 3: a gateway echoes the key to the judge; case 4: to the answerer, which aborts the
    # run (its reason quotes that error); cases 5 and 6 are skipped with the reason.
    monkeypatch.setenv("ANTHROPIC_API_KEY", KEY)
    key_faults: list[dict[str, object]] = [
        {"role": "judge", "kind": "html"},
        {"role": "answerer", "kind": "hang", "seconds": 30, "after": 3},
        {"role": "judge", "kind": "gateway", "after": 1},
        {"role": "answerer", "kind": "gateway", "after": 7},
    ]
    keyed = session("key", key_faults)
    assert keyed.parseoutcomes().get("aborted") == 2, seen["key: terminal"]
    # The auth token alone (sent as a bearer header): the gateway echoes it to the judge of
    # case 1 and to the answerer of case 2; the other four are scored.
    monkeypatch.delenv("ANTHROPIC_API_KEY")
    monkeypatch.setenv("ANTHROPIC_AUTH_TOKEN", TOKEN)
    token_faults: list[dict[str, object]] = [
        {"role": "judge", "kind": "gateway"},
        {"role": "answerer", "kind": "gateway", "after": 3},
    ]
    session("token", token_faults)
    # A password in the base URL: the client refuses to send it, on the answerer's path (a
    # run) and on the judge's (a rejudge of the token run's answers).
    monkeypatch.setenv("ANTHROPIC_BASE_URL", fake.base_url.replace("//", f"//evaluser:{PASSWORD}@"))
    session("url", [])
    session("url-rejudge", [], "--eval-rejudge-from=token")

    runs = shop / "runs"
    seen.update(_files(runs))
    hits = _hits(seen)
    print(f"secrets grep over {len(seen)} texts (run files, junit, terminal): {hits}")
    assert hits == {secret: [] for secret in SECRETS}

    # Every path did run, and what it blanked says so.
    served = [r.outcome for r in fake.requests]
    assert served.count("gateway") == 4 and served.count("malformed") == 1
    assert served.count("hang") == 1
    key_run = ledger_reader.read_run(runs / "key")
    errors = [a.error for a in key_run.of_kind("attempt") if a.error]
    assert [e.split(":", 1)[0] for e in errors] == ["judge", "answerer", "judge", "answerer"]
    assert "gave an unusable reply" in errors[0] and "timed out" in errors[1]
    assert f"Bearer {REDACTED}" in errors[2] and f"Bearer {REDACTED}" in errors[3]
    assert REDACTED in (key_run.info.abort_reason if key_run.info else "")
    assert REDACTED in seen["key: junit"] and REDACTED in seen["key: terminal"]
    token_errors = [
        a.error for a in ledger_reader.read_run(runs / "token").of_kind("attempt") if a.error
    ]
    assert len(token_errors) == 2 and all(f"Bearer {REDACTED}" in e for e in token_errors)
    for label, role in (("url", "answerer"), ("url-rejudge", "judge")):
        url_run = ledger_reader.read_run(runs / label)
        failed = [a.error for a in url_run.of_kind("attempt") if a.error]
        assert len(failed) == 4 and all(e.startswith(f"{role}: ") for e in failed), failed
        assert all("unreachable" in e for e in failed)
        assert url_run.info is not None and url_run.info.status == "aborted"


def test_the_environment_is_read_whole_while_another_thread_changes_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # pytest sets and deletes PYTEST_CURRENT_TEST on the main thread while pipeline threads
    # read the environment for secrets: the read must see one whole environment, never a name
    # that vanished between listing and lookup (KeyError, seen in a full run).
    import os
    import threading

    monkeypatch.setenv("EVALLOOP_TEST_API_KEY", "k" * 24)
    stop = threading.Event()

    def churn() -> None:
        while not stop.is_set():
            os.environ["EVALLOOP_TEST_CHURN"] = "x"
            del os.environ["EVALLOOP_TEST_CHURN"]

    thread = threading.Thread(target=churn)
    thread.start()
    try:
        for _ in range(3000):
            assert "k" * 24 in environment_secrets()
    finally:
        stop.set()
        thread.join()


@settings(max_examples=100, deadline=None)
@given(
    secret=st.text(
        alphabet=st.sampled_from(list('ab1_-"\\\n\t\x01\u00e9\u2028/')), min_size=6, max_size=20
    ).filter(lambda v: len(v.strip()) >= 6),
    ascii_only=st.booleans(),
)
def test_a_credential_is_blanked_in_json_text_however_it_is_escaped(
    secret: str, ascii_only: bool
) -> None:
    """A credential with a quote, a backslash, a control character or a non-ASCII letter is
    escaped when written as JSON (run.json, seal.json, a ledger line): it is blanked in that
    form too, and the text stays valid JSON."""
    secrets = environment_secrets({"MY_SERVICE_TOKEN": secret})
    # The key quoted inside JSON that is itself written as JSON (a tool result, an answer
    # that shows a config) is escaped twice: blanking it must not break the outer JSON.
    nested = json.dumps({"key": secret}, ensure_ascii=ascii_only)
    values = {
        "label": f"x{secret}y",
        "path": secret,
        "nested": nested,
        "slash": "\\" + secret,
        "twice": secret + secret,  # a key ending in a backslash, then the key again
        "escapes": f"\n{secret}\t\u00e0{secret}",
    }
    text = json.dumps(values, ensure_ascii=ascii_only)
    cleaned = redact(text, secrets)
    data = json.loads(cleaned)
    for name in ("label", "path", "slash", "twice", "escapes"):
        assert secret not in data[name], (name, cleaned)


@settings(max_examples=60, deadline=None)
@given(
    key=st.text(
        alphabet=st.sampled_from(list("ab1_-'\"\\\t\n\x01\u00e9 ")), min_size=8, max_size=16
    ).filter(lambda v: len(v.strip()) >= 8 and not v.startswith(" ")),
    around=st.sampled_from(["<html>{}</html>", "{}", "x-api-key: {}\n\nbody", "'{}'\t\"{}\""]),
)
def test_an_unusable_body_that_echoes_the_key_never_shows_it(key: str, around: str) -> None:
    """A gateway's body that is not a message, quoting the key: the error folds its spaces
    and quotes it with repr, which escapes a quote or a control character in the key; the
    key was blanked before that, so no form of it is shown."""
    import anthropic

    from pytest_evalloop.model_api.endpoint import _unusable

    client = anthropic.AsyncAnthropic(api_key=key, base_url="http://127.0.0.1:9")
    said = _unusable(client, "m", "the body is not JSON", around.replace("{}", key))
    folded = " ".join(key.split())
    for form in {key, folded, repr(key)[1:-1], repr(folded)[1:-1], json.dumps(key)[1:-1]}:
        assert form not in said, said
