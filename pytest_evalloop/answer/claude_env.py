"""What the ``claude`` CLI child is given: an allow-listed environment that names nothing of the
repository, and error text that never shows a secret (see ``docs/claude-code.md``)."""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from pathlib import Path

__all__ = ["child_env", "scratch_problem", "stderr_tail"]


def scratch_problem(temp_dir: Path | None = None, cwd: Path | None = None) -> str | None:
    """Why the CLI's scratch directories cannot be made, or None: they are made under the temp
    directory (`$TMPDIR`), and one inside the working directory would let the CLI find the
    eval set. Asked once before the run (a usage error) and by each attempt (a harness error
    if it changed since)."""
    import tempfile

    temp = (temp_dir or Path(tempfile.gettempdir())).resolve()
    repo = (cwd or Path.cwd()).resolve()
    if not temp.is_relative_to(repo):
        return None
    return (
        f"the claude-code answerer's scratch directories would sit under TMPDIR={temp}, inside "
        f"the working directory {repo}, where the CLI could find the eval set; point TMPDIR "
        "outside the repository (e.g. TMPDIR=/tmp), or run pytest from another directory"
    )


# The CLI authenticates from these alone, so a scratch HOME loses nothing (see child_env).
_CREDENTIAL_VARS = (
    "ANTHROPIC_API_KEY",
    "ANTHROPIC_AUTH_TOKEN",
    "CLAUDE_CODE_OAUTH_TOKEN",
    "CLAUDE_CODE_USE_BEDROCK",
    "CLAUDE_CODE_USE_VERTEX",
)
_ENV_EXACT = frozenset(
    {
        "PATH",
        "LANG",
        "LANGUAGE",
        "TZ",
        "TERM",
        "USER",
        "LOGNAME",
        "SHELL",
        "NO_COLOR",
        "HTTP_PROXY",
        "HTTPS_PROXY",
        "NO_PROXY",
        "ALL_PROXY",
        "http_proxy",
        "https_proxy",
        "no_proxy",
        "SSL_CERT_FILE",
        "SSL_CERT_DIR",
        "NODE_EXTRA_CA_CERTS",
        "MCP_TIMEOUT",
        "MAX_MCP_OUTPUT_TOKENS",
        "EVALLOOP_CACHE_DIR",
    }
)
_ENV_PREFIXES = ("ANTHROPIC_", "CLAUDE_", "LC_", "AWS_", "GOOGLE_", "CLOUD_ML_", "VERTEX_")
_ENV_DROPPED = frozenset({"CLAUDE_PROJECT_DIR", "CLAUDECODE", "CLAUDE_CODE_ENTRYPOINT"})


def child_env(
    environ: Mapping[str, str], *, home: Path, cwd: Path, tmp: Path, hidden: Path
) -> dict[str, str]:
    """The CLI's environment: an allow-list of what it needs, nothing naming ``hidden``.

    HOME is the scratch home when a credential variable authenticates the CLI, so no user
    settings, skills, memory or MCP servers load; otherwise the real HOME stays, because the
    CLI's login lives there (``--setting-sources project`` still keeps user settings out).
    """
    env: dict[str, str] = {}
    for name, value in environ.items():
        keep = name in _ENV_EXACT or name.startswith(_ENV_PREFIXES)
        if keep and name not in _ENV_DROPPED:
            env[name] = value
    env["PATH"] = os.pathsep.join(
        entry
        for entry in environ.get("PATH", os.defpath).split(os.pathsep)
        if entry and not _inside(entry, hidden)
    )
    env = {k: v for k, v in env.items() if k == "PATH" or str(hidden) not in v}
    scratch_home = any(environ.get(name) for name in _CREDENTIAL_VARS)
    env["HOME"] = str(home) if scratch_home else environ.get("HOME", str(home))
    if str(hidden) in env["HOME"]:
        env["HOME"] = str(home)
    env["PWD"] = str(cwd)
    # The CLI's own temporary files (claude-<uid>/, cc-socks/) go where the scratch root's
    # removal finds them, not into the host's $TMPDIR.
    env["TMPDIR"] = str(tmp)
    return env


def _inside(entry: str, root: Path) -> bool:
    try:
        return Path(entry).resolve().is_relative_to(root)
    except OSError:
        return False


def stderr_tail(lines: Iterable[str], env: Mapping[str, str]) -> str:
    """The last stderr lines for an error message, with secret values blanked."""
    from pytest_evalloop.model_api.redaction import environment_secrets, redact

    # The child's environment may hold credentials this process's does not.
    text = redact("\n".join(lines), environment_secrets(env) + environment_secrets())
    return f"stderr ends:\n{text}\n" if text else "stderr was empty; "
