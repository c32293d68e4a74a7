"""Installing the Malloy server's npm tree once, from the lock file, into a cache directory.

The tree goes to `<cache>/evalloop/malloy-server/<sha of the lock>` (cache: `$XDG_CACHE_HOME`,
else `~/.cache`; `tools/real_components.sh` pre-installs the same directory, so CI and the
tests use what `make test` installed). `npm ci` installs exactly the lock file's versions; a
lock change gets a new directory, so an old tree is never reused for a new lock. Installing
runs under a file lock: two xdist workers starting at once install it once.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
from pathlib import Path

HERE = Path(__file__).parent
SERVER_FILE = "server.mjs"
MANIFESTS = ("package.json", "package-lock.json")
STAMP = ".evalloop-installed"
INSTALL_TIMEOUT_S = 900.0


class MalloyUnavailable(RuntimeError):
    """Node or npm is missing, or the npm tree could not be installed; says what to run."""


def lock_sha() -> str:
    """sha256 (16 hex) of the manifests: which install directory serves this package version."""
    digest = hashlib.sha256()
    for name in MANIFESTS:
        digest.update((HERE / name).read_bytes())
    return digest.hexdigest()[:16]


def install_root() -> Path:
    """`$EVALLOOP_MALLOY_SERVER_DIR`, else `<$XDG_CACHE_HOME or ~/.cache>/evalloop/malloy-server`."""
    explicit = os.environ.get("EVALLOOP_MALLOY_SERVER_DIR")
    if explicit:
        return Path(explicit)
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(cache) / "evalloop" / "malloy-server"


def node_command() -> str:
    """The `node` executable, or MalloyUnavailable naming what to install."""
    node = shutil.which("node")
    if node is None:
        raise MalloyUnavailable(
            "the malloy target needs Node.js (node and npm on PATH, version 20 or later): "
            "install it (e.g. `apt-get install nodejs npm`), then run again"
        )
    return node


def ensure_server() -> Path:
    """The installed `server.mjs`, its npm tree installed first when missing."""
    import fcntl

    node_command()
    npm = shutil.which("npm")
    if npm is None:
        raise MalloyUnavailable(
            "the malloy target installs its npm dependencies with `npm ci`, and npm is not on "
            "PATH: install npm (it ships with Node.js), then run again"
        )
    target = install_root() / lock_sha()
    target.mkdir(parents=True, exist_ok=True)
    with open(target.parent / f".{target.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (target / STAMP).is_file():
            from pytest_evalloop.steps import announce

            announce(f"installing the Malloy server's npm packages into {target} (once, ~30 s)")
            _npm_ci(npm, target)
        server = target / SERVER_FILE
        source = (HERE / SERVER_FILE).read_bytes()
        if not server.is_file() or server.read_bytes() != source:
            temp = target / f".{SERVER_FILE}.tmp"
            temp.write_bytes(source)
            temp.replace(server)
    return server


def _npm_ci(npm: str, target: Path) -> None:
    for name in MANIFESTS:
        shutil.copyfile(HERE / name, target / name)
    flags = ["--no-audit", "--no-fund", "--loglevel=error"]
    done = _npm([npm, "ci", *flags], target)
    if done.returncode != 0 and "EUSAGE" in (done.stderr or ""):
        # A registry mirror without some platforms' optional DuckDB bindings writes a lock that
        # `npm ci` calls out of sync; `npm install` still takes every locked version from it.
        done = _npm([npm, "install", "--no-save", *flags], target)
    if done.returncode != 0:
        tail = "\n".join((done.stderr or done.stdout).strip().splitlines()[-8:])
        raise MalloyUnavailable(
            f"`{' '.join(done.args)}` in {target} exited {done.returncode}:\n{tail}\n"
            "check network access to the npm registry, or run `make real-components`"
        )
    (target / STAMP).write_text(lock_sha() + "\n", encoding="utf-8")


def _npm(command: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run(
            command, cwd=cwd, capture_output=True, text=True, timeout=INSTALL_TIMEOUT_S, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise MalloyUnavailable(
            f"`{' '.join(command)}` in {cwd} failed: {exc}; run it by hand to see why"
        ) from exc
