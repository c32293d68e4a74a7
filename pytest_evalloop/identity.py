"""Who a person is when a command records what they did: one rule for every command that
writes a name (`evalloop review`, `evalloop view`'s review panel, `evalloop golden ...`).

`--by NAME` when given, else `git config user.name` (the name a reviewer's commits carry),
else the login name, else `unknown`.
"""

from __future__ import annotations

import getpass
import subprocess


def person(given: str | None = None) -> str:
    """The name to record: `given`, else git's user.name, else the login name."""
    name = (given or "").strip()
    return name or git_user() or login_name()


def git_user() -> str | None:
    """`git config user.name`, or None when git has none (or is not installed)."""
    try:
        done = subprocess.run(
            ["git", "config", "user.name"], capture_output=True, text=True, timeout=10, check=False
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip() or None


def login_name() -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return "unknown"
