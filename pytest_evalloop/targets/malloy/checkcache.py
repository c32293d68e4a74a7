"""A package check that passed, kept on disk while nothing it read has changed.

`server.mjs --check` starts node and the compiler (2-3 s of CPU, most of it the parser warming
up), and every run checks its package and its truth package before anything is paid for: a
suite of runs, or a loop's baseline and two arms, would compile the same files again and again.
A check depends only on what it reads: the server (its source and its npm tree), the package's
name and model files (imports cannot leave the package), and the table files the models name.
So a passing check is stored under a key over the first three, with a digest of each table
file it read, and is reused only while every one of those digests still matches. A failing
check is never stored: its messages name paths of the directory it ran in, and a model that
does not compile is what a person fixes next, so it is compiled again.

Entries live beside the npm tree (`<install dir>/checks/`), so a new server version starts
empty; `EVALLOOP_MALLOY_CHECK_CACHE=0` turns the cache off.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

WHOLE_FILE_LIMIT = 64 * 1024 * 1024
"""Table files up to this size are hashed whole; a larger one by its size, modification time
and first and last MiB (a Parquet file's schema is in its footer, a CSV's header at its start),
so a check of a package over gigabytes of data does not read them all."""
_EDGE = 1024 * 1024
_VERSION = "1"


def enabled() -> bool:
    return os.environ.get("EVALLOOP_MALLOY_CHECK_CACHE", "1") != "0"


def key(root: Path, server: Path) -> str:
    """The key of a package's check: the server, the package's name, its model files."""
    digest = hashlib.sha256(f"v{_VERSION}\0{root.name}\0".encode())
    digest.update(hashlib.sha256(server.read_bytes()).digest())
    digest.update(str(server.parent).encode() + b"\0")  # the npm tree, by its lock's sha
    for path in sorted(p for p in root.rglob("*.malloy") if p.is_file()):
        digest.update(path.relative_to(root).as_posix().encode() + b"\0")
        digest.update(hashlib.sha256(path.read_bytes()).digest())
    meta = root / "publisher.json"
    if meta.is_file():
        digest.update(b"publisher.json\0" + hashlib.sha256(meta.read_bytes()).digest())
    return digest.hexdigest()


def file_digest(path: Path) -> str | None:
    """What stands for a table file's content (see WHOLE_FILE_LIMIT), None when it is gone."""
    try:
        stat = path.stat()
        digest = hashlib.sha256(str(stat.st_size).encode() + b"\0")
        with path.open("rb") as handle:
            if stat.st_size <= WHOLE_FILE_LIMIT:
                for block in iter(lambda: handle.read(_EDGE), b""):
                    digest.update(block)
            else:
                digest.update(str(stat.st_mtime_ns).encode() + b"\0" + handle.read(_EDGE))
                handle.seek(-_EDGE, os.SEEK_END)
                digest.update(handle.read(_EDGE))
    except OSError:
        return None
    return digest.hexdigest()


def load(server: Path, check_key: str, root: Path) -> dict[str, Any] | None:
    """The stored check, or None when there is none or a table file it read has changed."""
    if not enabled():
        return None
    try:
        entry = json.loads(_entry(server, check_key).read_text(encoding="utf-8"))
        tables: dict[str, str] = entry["tables"]
        check: dict[str, Any] = entry["check"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    for name, stored in tables.items():
        if file_digest(root / name) != stored:
            return None
    return {**check, "root": str(root), "tables": [str(root / name) for name in tables]}


def store(server: Path, check_key: str, root: Path, check: dict[str, Any]) -> None:
    """Keep a passing check, with a digest of every table file it read."""
    if not enabled() or not check.get("ok"):
        return
    tables = {}
    for full in check.get("tables") or []:
        path = Path(full)
        # Inside the package, by its path relative to the root (so a copy of the package hits).
        name = path.relative_to(root).as_posix() if path.is_relative_to(root) else str(path)
        digest = file_digest(path)
        if digest is None:
            return
        tables[name] = digest
    entry = _entry(server, check_key)
    kept = {k: v for k, v in check.items() if k not in ("root", "tables")}
    payload = {"tables": tables, "check": kept}
    try:
        entry.parent.mkdir(parents=True, exist_ok=True)
        temp = entry.with_name(f".{entry.name}.{os.getpid()}.tmp")
        temp.write_text(json.dumps(payload), encoding="utf-8")
        temp.replace(entry)  # atomic: a reader sees the old entry or the new, never half
    except OSError:
        return  # a read-only cache is a slower check, not an error


def _entry(server: Path, check_key: str) -> Path:
    return server.parent / "checks" / f"{check_key}.json"
