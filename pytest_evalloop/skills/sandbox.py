"""The sandbox of one skill run: a fixture copy holding the whole catalog under
``.claude/skills/<id>``, ``git init`` and a commit, the scenario's ``setup``, an isolated HOME
holding only the login files; and what the run changed in it afterwards. See docs/skills.md.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from pytest_evalloop.skills.scenarios import Scenario

ErrorKind = Literal["fixture", "sandbox", "setup", "provider", "isolation", "judge", "check"]


SKILLS_DIR = Path(".claude") / "skills"
SETUP_TIMEOUT_S = 120.0
DIFF_CHARS = 12_000
PREFERENCE_TEXT: dict[str, str] = {
    "prefer": "When a request leaves a material decision open that the repository cannot "
    "answer, ask the user before acting on it.",
    "minimize": "Ask the user only when you cannot proceed safely; otherwise make a reasonable "
    "assumption, state it, and continue.",
}
_GIT_IDENTITY = {
    "GIT_AUTHOR_NAME": "evalloop",
    "GIT_AUTHOR_EMAIL": "evalloop@localhost",
    "GIT_COMMITTER_NAME": "evalloop",
    "GIT_COMMITTER_EMAIL": "evalloop@localhost",
    "GIT_CONFIG_NOSYSTEM": "1",
    "GIT_CONFIG_GLOBAL": os.devnull,
}
# Login state the CLI keeps in ~/.claude.json; everything else there (projects, history) stays.
_LOGIN_KEYS = ("oauthAccount", "userID", "primaryApiKey", "customApiKeyResponses")


class RunError(Exception):
    """A run that produced no verdict; ``kind`` says which stage failed."""

    def __init__(self, kind: ErrorKind, message: str) -> None:
        super().__init__(message)
        self.kind: ErrorKind = kind


@dataclass
class Sandbox:
    """A run's scratch directories: the repository, the isolated HOME, scripted commands."""

    root: Path
    repo: Path
    home: Path
    bin: Path
    home_before: dict[str, tuple[int, int]] = field(default_factory=dict)

    def remove(self) -> None:
        """Delete the sandbox."""
        shutil.rmtree(self.root, ignore_errors=True)


def catalog_ids(catalog_root: Path) -> list[str]:
    """The skill ids of a catalog: directories holding a SKILL.md."""
    return sorted(p.parent.name for p in catalog_root.glob("*/SKILL.md"))


def catalog_sha(catalog_root: Path) -> str:
    """sha256 over every installed file of the catalog (evals excluded): a catalog pin, since
    a trigger rate depends on every description, not only the tested skill's."""
    digest = hashlib.sha256()
    for skill_id in catalog_ids(catalog_root):
        for path in sorted((catalog_root / skill_id).rglob("*")):
            rel = path.relative_to(catalog_root)
            if path.is_file() and not _excluded(rel.parts[1:]):
                digest.update(str(rel).encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()[:16]


def _excluded(parts: tuple[str, ...]) -> bool:
    # An installed skill has no scenarios: one agent was seen reading them.
    return bool(parts) and parts[0] in ("evals", "runs", "__pycache__")


def build_sandbox(
    scenario: Scenario,
    skill_dir: Path,
    *,
    catalog_root: Path,
    preference: str,
    fixtures_dir: Path | None,
) -> Sandbox:
    """Create and commit the sandbox of one run; raises RunError (fixture, sandbox, setup)."""
    root = Path(tempfile.mkdtemp(prefix="evalloop-skill-")).resolve()
    box = Sandbox(root=root, repo=root / "repo", home=root / "home", bin=root / "bin")
    try:
        _copy_fixture(scenario, fixtures_dir, box.repo)
        _install_catalog(catalog_root, box.repo / SKILLS_DIR)
        if preference in PREFERENCE_TEXT:
            _write_preference(box.repo, preference)
        _install_bin(scenario, skill_dir, box.bin)
        _seed_home(box.home)
        _git(box, "init", "-q", "--initial-branch=main")
        _git(box, "add", "-A")
        _git(box, "commit", "-q", "--allow-empty", "--no-verify", "-m", "sandbox")
        if scenario.setup:
            _run_setup(box, scenario.setup)
        box.home_before = _snapshot(box.home)
    except BaseException:
        box.remove()
        raise
    return box


def _copy_fixture(scenario: Scenario, fixtures_dir: Path | None, repo: Path) -> None:
    if scenario.fixture is None:
        repo.mkdir(parents=True)
        (repo / "README.md").write_text("# sandbox\n", encoding="utf-8")
        return
    source = (fixtures_dir / scenario.fixture) if fixtures_dir else None
    if source is None or not source.is_dir():
        raise RunError(
            "fixture",
            f"scenario {scenario.name!r} names fixture {scenario.fixture!r}, but "
            f"{source or 'no --eval-skill-fixtures directory'} is not a directory; create it or "
            "pass --eval-skill-fixtures",
        )
    shutil.copytree(source, repo, symlinks=True, ignore=shutil.ignore_patterns(".git"))


def _install_catalog(catalog_root: Path, target: Path) -> None:
    target.mkdir(parents=True, exist_ok=True)
    for skill_id in catalog_ids(catalog_root):
        shutil.copytree(
            catalog_root / skill_id,
            target / skill_id,
            ignore=shutil.ignore_patterns("evals", "runs", "__pycache__"),
        )


def _write_preference(repo: Path, preference: str) -> None:
    memory = repo / "CLAUDE.md"
    before = memory.read_text(encoding="utf-8") + "\n" if memory.is_file() else ""
    memory.write_text(before + "## Questions\n\n" + PREFERENCE_TEXT[preference] + "\n", "utf-8")


def _install_bin(scenario: Scenario, skill_dir: Path, bin_dir: Path) -> None:
    bin_dir.mkdir(parents=True)
    for name, script in scenario.bin.items():
        source = skill_dir / script
        if not source.is_file():
            raise RunError(
                "sandbox",
                f"scenario {scenario.name!r}: bin {name!r} points at {source}, which is not a "
                "file; fix the path (relative to the skill directory)",
            )
        shutil.copy2(source, bin_dir / name)
        (bin_dir / name).chmod(0o755)


def _seed_home(home: Path) -> None:
    """Only what login needs: the credentials file and the login keys of ``~/.claude.json``."""
    (home / ".claude").mkdir(parents=True)
    real = Path.home()
    credentials = real / ".claude" / ".credentials.json"
    if credentials.is_file():
        shutil.copy2(credentials, home / ".claude" / ".credentials.json")
    try:
        config = json.loads((real / ".claude.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return
    if isinstance(config, dict):
        login = {k: config[k] for k in _LOGIN_KEYS if k in config}
        login["hasCompletedOnboarding"] = True
        (home / ".claude.json").write_text(json.dumps(login), encoding="utf-8")


def write_back_login(box: Sandbox) -> None:
    """A refreshed OAuth token lands in the sandbox HOME; keep it for the next run."""
    fresh = box.home / ".claude" / ".credentials.json"
    real = Path.home() / ".claude" / ".credentials.json"
    if fresh.is_file() and real.is_file() and fresh.read_bytes() != real.read_bytes():
        shutil.copy2(fresh, real)


def _git_env(box: Sandbox) -> dict[str, str]:
    return {**os.environ, **_GIT_IDENTITY, "HOME": str(box.home)}


def _git(box: Sandbox, *args: str) -> str:
    argv = ["git", "-c", "core.hooksPath=/dev/null", "-c", "commit.gpgsign=false", *args]
    done = subprocess.run(
        argv, cwd=box.repo, env=_git_env(box), capture_output=True, text=True, check=False
    )
    if done.returncode != 0:
        raise RunError(
            "sandbox", f"git {' '.join(args)} failed in {box.repo}: {done.stderr.strip()[-500:]}"
        )
    return done.stdout


def _run_setup(box: Sandbox, script: str) -> None:
    env = _git_env(box)
    env["PATH"] = f"{box.bin}{os.pathsep}{env.get('PATH', '')}"
    try:
        done = subprocess.run(
            ["sh", "-e", "-c", script],
            cwd=box.repo,
            env=env,
            capture_output=True,
            text=True,
            timeout=SETUP_TIMEOUT_S,
            check=False,
        )
    except subprocess.TimeoutExpired:
        raise RunError("setup", f"setup did not finish within {SETUP_TIMEOUT_S:g} s") from None
    if done.returncode != 0:
        raise RunError(
            "setup",
            f"setup exited with code {done.returncode}: {(done.stderr or done.stdout)[-500:]}",
        )


def _snapshot(root: Path) -> dict[str, tuple[int, int]]:
    out: dict[str, tuple[int, int]] = {}
    for path in root.rglob("*"):
        if path.is_file() and not path.is_symlink():
            stat = path.stat()
            out[str(path.relative_to(root))] = (stat.st_size, stat.st_mtime_ns)
    return out


def file_changes(box: Sandbox) -> list[str]:
    """Changed repository paths (``git status``), then changed HOME paths as ``~/path``."""
    status = _git(box, "status", "--porcelain", "--untracked-files=all", "--no-renames")
    changed = [line[3:].strip().strip('"') for line in status.splitlines() if len(line) > 3]
    after = _snapshot(box.home)
    home = [
        f"~/{p}"
        for p in sorted(set(after) | set(box.home_before))
        if after.get(p) != box.home_before.get(p)
    ]
    return changed + home


def diff_text(box: Sandbox, changes: list[str]) -> str:
    """``git status``, ``git diff`` and the content of new files, for the judge."""
    status = _git(box, "status", "--short", "--untracked-files=all")
    diff = _git(box, "diff", "HEAD")
    parts = ["$ git status --short\n" + (status or "(clean)\n"), "$ git diff\n" + diff]
    for rel in changes:
        path = box.repo / rel
        if not rel.startswith("~/") and path.is_file() and f"b/{rel}" not in diff:
            parts.append(f"--- new file {rel}\n" + path.read_text("utf-8", "replace"))
    text = "\n".join(parts)
    return text if len(text) <= DIFF_CHARS else text[:DIFF_CHARS] + "\n[... diff cut]"
