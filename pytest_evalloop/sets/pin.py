"""A set's pin, `datasetSha`: which bytes it covers (`set.json`, `cases.jsonl`, and the gold
artifacts the rows name) and where such an artifact may lie (`golden_file`).

Read a line at a time: a run's close asks for it again, and a 4,000-case file is 10 MB.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from pytest_evalloop.sets.readback import open_regular

SET_FILE = "set.json"
CASES_FILE = "cases.jsonl"
REGRESSIONS_FILE = "judge-regressions.jsonl"


def find_set_dir(path: Path) -> Path | None:
    """The set directory for a set dir or a `cases.jsonl` path, or None when it is not a set.
    Here, with the names of a set's files, rather than beside the models that read them: every
    pytest start asks it of its arguments, and most name no set."""
    directory = path if path.is_dir() else path.parent
    if (directory / SET_FILE).is_file() and (directory / CASES_FILE).is_file():
        return directory
    return None


def dataset_sha(set_dir: Path) -> str:
    """sha256 over `set.json` then `cases.jsonl`: for each, its name, NUL, its bytes, NUL;
    then the same for each gold artifact a row's `golden.path` names, in path order.

    This is the reference harness's pin: it moves when a golden is repaired, independently of
    the model under test. A golden kept in an artifact is repaired by editing that file, not
    the row, so the artifact's bytes are part of the pin too (a set without artifacts hashes
    as before). A path that is missing or outside the set adds its name and a marker: that
    row is a collection error, and its fix moves the pin.
    """
    digest = hashlib.sha256()
    with open_regular(set_dir / CASES_FILE) as handle:
        digest.update(SET_FILE.encode("utf-8") + b"\0")
        digest.update((set_dir / SET_FILE).read_bytes())
        digest.update(b"\0" + CASES_FILE.encode("utf-8") + b"\0")
        # A line at a time, never the whole file (a run's close asks for the pin again).
        artifacts = _hash_finding_paths(handle, digest)
        digest.update(b"\0")
    for path in artifacts:
        digest.update(path.encode("utf-8"))
        digest.update(b"\0")
        try:
            digest.update(golden_file(set_dir, path).read_bytes())
        except (OSError, ValueError):
            digest.update(b"\0missing")
        digest.update(b"\0")
    return digest.hexdigest()


def _hash_finding_paths(handle: Iterable[bytes], digest: Any) -> list[str]:
    """Feed every byte of `handle` to `digest`; return `artifact_paths` of those bytes."""
    found: set[str] = set()
    for chunk in handle:
        digest.update(chunk)
        _paths_into(chunk, found)
    return sorted(found)


def artifact_paths(cases_bytes: bytes) -> list[str]:
    """The distinct `golden.path` values of the rows (unreadable lines skipped), sorted."""
    found: set[str] = set()
    _paths_into(cases_bytes, found)
    return sorted(found)


def _paths_into(data: bytes, found: set[str]) -> None:
    # Rows as `bytes.splitlines` makes them (a lone CR ends one too), whether `data` is the
    # whole file or one newline-ended line of it: the same paths either way.
    if b'"path"' not in data:
        return  # most rows hold their golden inline: no parse
    for line in data.splitlines():
        if b'"path"' not in line:
            continue
        try:
            golden = json.loads(line).get("golden")
        except (ValueError, AttributeError):
            continue
        path = golden.get("path") if isinstance(golden, dict) else None
        if isinstance(path, str) and path:
            found.add(path)


def golden_file(set_dir: Path, golden_path: str) -> Path:
    """The gold artifact `golden.path` names, which must lie inside the set directory.

    Raises ValueError saying why not: an absolute path, a `..` part, a NUL, or a path that
    resolves (through a symlink) outside the set. Checked at collection, so the judge is never
    shown a file from elsewhere.
    """
    if "\0" in golden_path:
        raise ValueError("it contains a NUL character")
    relative = Path(golden_path)
    if relative.is_absolute() or golden_path.startswith(("/", "\\")):
        raise ValueError("it is an absolute path")
    if ".." in re.split(r"[/\\]", golden_path):
        raise ValueError("it goes up out of the set with '..'")
    root = set_dir.resolve()
    artifact = (root / relative).resolve()
    if not artifact.is_relative_to(root):
        raise ValueError(f"it resolves to {artifact}, outside the set (a symlink?)")
    return artifact
