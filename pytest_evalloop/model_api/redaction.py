"""The one redaction: what every text passes through before it reaches a file or a screen.

The ledger (`events.jsonl`, `run.json`), the artifacts, the item reports (terminal and junit)
and the summary lines all call :func:`redact`. It blanks:

- the values of credential-named environment variables (`ANTHROPIC_API_KEY`,
  `ANTHROPIC_AUTH_TOKEN` and any other name with KEY, TOKEN, SECRET, PASSWORD, AUTH or
  CREDENTIAL in it), and the user and password of a URL in the environment
  (`ANTHROPIC_BASE_URL=https://user:password@host`), wherever they occur, also as a JSON
  string escapes them;
- the userinfo of any URL in the text (`scheme://user:password@host` → `scheme://[redacted]@host`);
- the value of an auth header written out (`x-api-key: …`, `Authorization: Bearer …`,
  `"authorization": "Basic …"`), and any `Bearer <token>`.

Error text is where credentials leak: a gateway that echoes the request's headers in its 400,
an SDK exception naming the URL it called. The function is cheap when there is nothing to
blank (a few substring tests and one regex scan), so it runs on every line the ledger writes.
"""

from __future__ import annotations

import functools
import json
import os
import re
from collections.abc import Iterable, Mapping
from typing import Any
from urllib.parse import unquote, urlsplit

REDACTED = "[redacted]"
SECRET_NAME = re.compile(r"KEY|TOKEN|SECRET|PASSWORD|AUTH|CREDENTIAL", re.IGNORECASE)
"""An environment variable whose name matches holds a credential."""
MIN_SECRET = 6
"""Shorter values are not blanked: `1` or `true` in a flag variable would blank half a text."""

_URL_USERINFO = re.compile(r"(?i)\b([a-z][a-z0-9+.-]*://)[^/\s@\"'<>]+@")
# The scheme word is taken whole or not at all (atomic): a value blanked already is left be,
# rather than the scheme word being taken for the value.
_AUTH_HEADER = re.compile(
    r"(?i)((?:x-api-key|proxy-authorization|authorization)[\"']?\s*[:=]\s*[\"']?"
    r"(?>(?:(?:bearer|basic)\s+)?))[^\s\"',;\\()\[\]<>]+"
)
_BEARER = re.compile(r"(?i)\b(bearer\s+)[A-Za-z0-9._~+/=-]{6,}")
# Cheap gates for the patterns: most texts contain none of these, and a substring test is
# much cheaper than a regex scan of a long transcript.
_HEADER_HINTS = ("api-key", "API-KEY", "uthorization", "UTHORIZATION", "earer", "EARER")


def environment_secrets(env: Mapping[str, str] | None = None) -> list[str]:
    """The credential values in `env` (the process environment by default), longest first."""
    global _last_environ
    if env is not None:
        return _secrets_in(env)
    raw = getattr(os.environ, "_data", None)
    if not isinstance(raw, dict):  # not CPython's os._Environ: its own copy is the best there is
        return _secrets_in(dict(os.environ))
    # Asked for on every text written, while the environment hardly moves (pytest sets and
    # deletes PYTEST_CURRENT_TEST around each phase of each test). Reading and scanning it
    # costs tens of microseconds; comparing it with the last one read costs one. The last
    # answer holds while every variable that changed is one that can hold no credential.
    now = dict(raw)  # one step under the GIL (see environ_snapshot)
    last = _last_environ
    if last is not None and not any(
        _may_hold_secret(name, value) for name, value in now.items() ^ last[0].items()
    ):
        found = last[1]
    else:
        found = tuple(_secrets_in({os.fsdecode(k): os.fsdecode(v) for k, v in now.items()}))
    _last_environ = (now, found)
    return list(found)


_last_environ: tuple[dict[Any, Any], tuple[str, ...]] | None = None
"""The environment `environment_secrets` last read (raw) and the credentials it found in it."""


def _may_hold_secret(name: Any, value: Any) -> bool:
    """Whether a variable (added, removed or changed) counts in `_secrets_in`'s scan."""
    name, value = os.fsdecode(name), os.fsdecode(value)
    return bool(SECRET_NAME.search(name)) or ("://" in value and "@" in value)


def _secrets_in(env: Mapping[str, str]) -> list[str]:
    found: set[str] = set()
    for name, value in env.items():
        if SECRET_NAME.search(name) and len(value) >= MIN_SECRET:
            found.add(value)
        if "://" in value and "@" in value:
            found.update(_userinfo_parts(value))
    # As a JSON string writes them too (run.json, seal.json, the ledger are redacted as JSON
    # text): a value with a quote, a backslash, a newline or a non-ASCII letter in it is
    # escaped there, and its plain form would never be found.
    for value in list(found):
        found.update(_json_forms(value))
    return sorted(found, key=len, reverse=True)


def _blank_escaped(text: str, secret: str) -> str:
    """`text` with `secret` (a form with a backslash: most often JSON-escaped) blanked where
    it starts outside an escape: after an even run of backslashes, counted in `text` as it
    was. A match from the second backslash of `\\\\`, or from the letter of `\\n`, would
    leave a lone backslash before the blank: invalid JSON."""
    out = []
    done = 0
    at = text.find(secret)
    while at != -1:
        run = 0
        while at - run > 0 and text[at - run - 1] == "\\":
            run += 1
        if run % 2:
            at = text.find(secret, at + 1)
            continue
        out += [text[done:at], REDACTED]
        done = at + len(secret)
        at = text.find(secret, done)
    return "".join(out) + text[done:]


@functools.lru_cache(maxsize=64)
def _json_forms(value: str) -> tuple[str, ...]:
    # Cached: the environment is read again for every text redacted, and its values rarely move.
    forms = {json.dumps(value, ensure_ascii=ascii_only)[1:-1] for ascii_only in (False, True)}
    return tuple(forms - {value})


def environ_snapshot() -> dict[str, str]:
    """The process environment at one instant, safe to take from any thread.

    `os.environ`'s own iteration looks each name up after listing it, so a name the main thread
    removes meanwhile (pytest sets and deletes PYTEST_CURRENT_TEST around every test) raised
    KeyError in a pipeline thread. Copying the mapping's underlying dict is one step under the
    GIL; only the decoding happens afterwards, on the copy.
    """
    raw = getattr(os.environ, "_data", None)
    if not isinstance(raw, dict):  # not CPython's os._Environ: its own copy is the best there is
        return dict(os.environ)
    return {os.fsdecode(k): os.fsdecode(v) for k, v in dict(raw).items()}


def _userinfo_parts(url: str) -> list[str]:
    try:
        parts = urlsplit(url)
    except ValueError:
        return []
    out = []
    for raw in (parts.username, parts.password):
        if raw and len(raw) >= MIN_SECRET:
            out += [raw, unquote(raw)]
    return out


def redact(text: str, secrets: Iterable[str] | None = None) -> str:
    """`text` with every credential blanked (see the module docstring).

    `secrets` are the literal values to blank: by default the environment's; a caller that
    redacts many texts at once passes `environment_secrets()` (plus any key it was given
    directly) once, since reading the environment costs more than most scans.
    """
    if not text:
        return text
    values = environment_secrets() if secrets is None else sorted(secrets, key=len, reverse=True)
    for secret in values:  # longest first: a key that contains another is blanked whole
        if len(secret) >= MIN_SECRET and secret in text:
            if "\\" in secret:
                text = _blank_escaped(text, secret)
            else:
                text = text.replace(secret, REDACTED)
    if "://" in text and "@" in text:
        text = _URL_USERINFO.sub(lambda m: m.group(1) + REDACTED + "@", text)
    if any(hint in text for hint in _HEADER_HINTS):
        text = _AUTH_HEADER.sub(lambda m: m.group(1) + REDACTED, text)
        text = _BEARER.sub(lambda m: m.group(1) + REDACTED, text)
    return text


def redact_bytes(data: bytes, secrets: Iterable[str] | None = None) -> bytes:
    """:func:`redact` for UTF-8 bytes (artifact files); bytes that are not UTF-8 are kept."""
    text = data.decode("utf-8", errors="surrogateescape")
    cleaned = redact(text, secrets)
    return data if cleaned == text else cleaned.encode("utf-8", errors="surrogateescape")
