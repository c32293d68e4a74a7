"""The git repository a local target's model lives in: the pin, the dirty check, the commit.

Git is the checkpoint mechanism (seed 004, eval-loop): an accepted edit is a commit of the model
files and the set's ledger, and a restore checks the model files of a commit out again. Every
call runs `git` as a child with the repository's own configuration; nothing here pushes.
"""

from __future__ import annotations

import subprocess
from collections.abc import Sequence
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


PYTEST_FILES = (
    "conftest.py",
    "pytest.ini",
    ".pytest.ini",
    "pyproject.toml",
    "tox.ini",
    "setup.cfg",
)
"""Files pytest reads in each folder from the rootdir down to what it collects."""
NOT_READ = ("runs", "__pycache__", ".pytest_cache")
"""Folders of a set that no run reads: its ledgers and caches."""


def _rel(root: Path, path: Path) -> str:
    return path.resolve().relative_to(root.resolve()).as_posix() or "."


def read_specs(root: Path, set_dir: Path, extra: Sequence[Path] = ()) -> list[str]:
    """Git pathspecs of everything a pytest run of the set reads: the whole set folder (its
    ledgers and caches aside), `extra` (the model files), and the pytest files of each folder
    above it up to the repository root."""
    set_rel = _rel(root, set_dir)
    specs = [set_rel, *(_rel(root, p) for p in extra)]
    folder = set_dir.resolve().parent
    top = root.resolve()
    while True:
        specs += [_rel(root, folder / name) for name in PYTEST_FILES]
        if folder == top or top not in folder.parents:
            break
        folder = folder.parent
    base = "" if set_rel == "." else f"{set_rel}/"
    specs += [f":(exclude){base}{name}" for name in NOT_READ]
    specs += [f":(exclude,glob){base}**/{name}/**" for name in NOT_READ[1:]]
    return specs


def dirty_read(root: Path, set_dir: Path, extra: Sequence[Path] = ()) -> list[str]:
    """What a pytest run of the set would read that differs from HEAD: modified, staged,
    deleted or untracked files of the set folder and the model files, the pytest files
    (conftest.py, pytest.ini, pyproject.toml, tox.ini, setup.cfg) above it up to the
    repository root, and a pytest file git is told to ignore (pytest reads it all the same)."""
    specs = read_specs(root, set_dir, list(extra))
    out = _git(
        root, "status", "--porcelain", "--untracked-files=all", "--ignored=matching", "--", *specs
    ).stdout
    found = set()
    for line in out.splitlines():
        if not line.strip():
            continue
        path = line[3:].strip().split(" -> ")[-1].strip('"')
        if line.startswith("!!") and Path(path).name not in PYTEST_FILES:
            continue  # ignored data (a generated table) is not a pytest file
        found.add(path)
    return sorted(found)


def pinned_files(root: Path, set_dir: Path) -> list[Path]:
    """The pytest files of the set folder (conftest.py and the like, in any folder of it but
    its ledgers): what a checkpoint pins and a restore returns beside the model files."""
    out = []
    for name in PYTEST_FILES:
        for path in sorted(set_dir.rglob(name)):
            parts = path.relative_to(set_dir).parts
            if not any(part in NOT_READ for part in parts[:-1]):
                out.append(path)
    return out


def model_git_sha(paths: list[Path], set_dir: Path | None = None) -> str | None:
    """HEAD of the repository holding `paths`, `-dirty` when any of them (or, given the set,
    anything a pytest run of it reads: `dirty_read`) has uncommitted changes; None outside git
    (the pin `modelGitSha`: a dirty tree pins nothing)."""
    if not paths:
        return None
    root = repo_root(paths[0])
    if root is None:
        return None
    try:
        sha = head_sha(root)
        dirty = dirty_read(root, set_dir, paths) if set_dir is not None else []
        return f"{sha}-dirty" if dirty or dirty_files(root, paths) else sha
    except RepoError:
        return None


def save_changes(root: Path, paths: list[Path], into: Path) -> Path:
    """Write the uncommitted changes of `paths` (against HEAD; an untracked file whole) to one
    patch file `into`, which `git apply` takes back."""
    tracked = [
        p
        for p in paths
        if _git(root, "ls-files", "--error-unmatch", "--", _rel(root, p), check=False).returncode
        == 0
    ]
    parts = []
    if tracked:
        parts.append(
            _git(root, "diff", "--binary", "HEAD", "--", *(_rel(root, p) for p in tracked)).stdout
        )
    for path in paths:
        if path in tracked or not path.exists():
            continue
        done = _git(
            root, "diff", "--binary", "--no-index", "--", "/dev/null", _rel(root, path), check=False
        )
        parts.append(done.stdout)
    into.parent.mkdir(parents=True, exist_ok=True)
    into.write_text("".join(parts), encoding="utf-8")
    return into


def same_read(root: Path, sha: str, set_dir: Path, files: list[Path]) -> bool:
    """Whether everything a pytest run of the set reads (`read_specs`) is, in the work tree,
    byte for byte what commit `sha` holds."""
    if not is_commit(root, sha):
        return False
    specs = read_specs(root, set_dir, files)
    return _git(root, "diff", "--quiet", sha, "--", *specs, check=False).returncode == 0


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
