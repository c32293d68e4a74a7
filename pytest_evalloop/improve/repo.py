"""The git repository a local target's model lives in: the pin, the dirty check, the commit.

Git is the checkpoint mechanism (seed 004, eval-loop): an accepted edit is a commit of the model
files and the set's ledger, and a restore checks the model files of a commit out again. Every
call runs `git` as a child with the repository's own configuration; nothing here pushes.
"""

from __future__ import annotations

import subprocess
from pathlib import Path


class RepoError(ValueError):
    """The model is not in a usable git repository (none, dirty, or git failed)."""


def _git(cwd: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    try:
        done = subprocess.run(
            ["git", *args], cwd=cwd, capture_output=True, text=True, timeout=60, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise RepoError(f"git {args[0]} in {cwd}: {exc}") from exc
    if check and done.returncode != 0:
        tail = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["(no output)"]
        raise RepoError(f"git {' '.join(args[:2])} in {cwd} failed: {tail[0]}")
    return done


def repo_root(path: Path) -> Path | None:
    """The work tree holding `path`, or None when it is in no git repository."""
    folder = path if path.is_dir() else path.parent
    try:
        done = _git(folder, "rev-parse", "--show-toplevel", check=False)
    except RepoError:
        return None
    return Path(done.stdout.strip()) if done.returncode == 0 and done.stdout.strip() else None


def head_sha(root: Path) -> str:
    """The commit HEAD names."""
    return _git(root, "rev-parse", "HEAD").stdout.strip()


def dirty_files(root: Path, paths: list[Path]) -> list[str]:
    """Which of `paths` differ from HEAD (modified, staged, deleted, untracked)."""
    if not paths:
        return []
    rel = [str(p.resolve().relative_to(root.resolve())) for p in paths]
    out = _git(root, "status", "--porcelain", "--untracked-files=all", "--", *rel).stdout
    return sorted({line[3:].strip() for line in out.splitlines() if line.strip()})


def model_git_sha(paths: list[Path]) -> str | None:
    """HEAD of the repository holding `paths`, `-dirty` when any of them has uncommitted
    changes; None outside git (the pin `modelGitSha`: a dirty tree pins nothing)."""
    if not paths:
        return None
    root = repo_root(paths[0])
    if root is None:
        return None
    try:
        sha = head_sha(root)
        return f"{sha}-dirty" if dirty_files(root, paths) else sha
    except RepoError:
        return None


def commit(root: Path, paths: list[Path], message: str, *, force: tuple[Path, ...] = ()) -> str:
    """Commit `paths` (and `force`, added even where .gitignore excludes them); the new sha."""
    rel = [str(p.resolve().relative_to(root.resolve())) for p in paths]
    _git(root, "add", "--", *rel)
    forced = [str(p.resolve().relative_to(root.resolve())) for p in force if p.exists()]
    if forced:
        # The set's ledger rides in the checkpoint even where runs/ is ignored (seed 004: the
        # model and its ledger move in one commit).
        _git(root, "add", "-f", "--", *forced)
    if _git(root, "diff", "--cached", "--quiet", "--", *rel, *forced, check=False).returncode == 0:
        return head_sha(root)  # nothing new to pin: the commit that holds it already is HEAD
    _git(
        root,
        "-c",
        "user.name=evalloop",
        "-c",
        "user.email=evalloop@localhost",
        "commit",
        "--no-verify",
        "-m",
        message,
        "--",
        *rel,
        *forced,
    )
    return head_sha(root)


def checkout_files(root: Path, sha: str, paths: list[Path]) -> None:
    """Put `paths` back as commit `sha` holds them (a file the commit lacks is removed)."""
    for path in paths:
        rel = str(path.resolve().relative_to(root.resolve()))
        known = _git(root, "cat-file", "-e", f"{sha}:{rel}", check=False).returncode == 0
        if known:
            _git(root, "checkout", sha, "--", rel)
        elif path.exists():
            path.unlink()


def is_commit(root: Path, sha: str) -> bool:
    """Whether `sha` names a commit of the repository."""
    return _git(root, "cat-file", "-e", f"{sha}^{{commit}}", check=False).returncode == 0


def same_files(root: Path, sha: str, paths: list[Path]) -> bool:
    """Whether `paths` in the work tree are byte for byte what commit `sha` holds."""
    if not is_commit(root, sha):
        return False
    rel = [str(p.resolve().relative_to(root.resolve())) for p in paths]
    return _git(root, "diff", "--quiet", sha, "--", *rel, check=False).returncode == 0
