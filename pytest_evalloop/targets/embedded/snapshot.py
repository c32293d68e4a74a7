"""A model's answerer-facing relations, built once into a read-only DuckDB file and reused.

Building the relations (`install_sources`: read every parquet file, build each source and
view) costs ~0.4 s of CPU and, held in an in-memory database, ~100 MB of resident memory per
process. The result depends only on the model, the raw data files and the DuckDB version, so it
is built once into `<cache root>/snapshots/<key>/model.duckdb` and every sandbox opens that
file read-only: opening costs milliseconds, DuckDB pages in (compressed) blocks only as queries
touch them, and every sandbox of one process shares one database instance.

The key hashes everything the file's content depends on (format, DuckDB version, the code that
builds it, the model's full JSON, each raw file's bytes), so a changed model, builder or
regenerated data gets a new file and a stale one is never opened.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
import threading
import uuid
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pytest_evalloop.targets.embedded.model import SemanticModel

__all__ = ["SNAPSHOT_CATALOG", "file_digest", "snapshot_key", "snapshot_path"]

# Bump when what a snapshot holds changes in a way the inputs below do not capture.
SNAPSHOT_FORMAT = "1"
# DuckDB names a database opened from a file after its stem: queries see the catalogue "model".
SNAPSHOT_CATALOG = "model"
_FILE_NAME = f"{SNAPSHOT_CATALOG}.duckdb"

# Digests of files by (path, size, mtime, inode): a process that opens many sandboxes over the
# same data (golden verification does one per case) hashes each file once.
_DIGESTS: dict[tuple[str, int, int, int], str] = {}
_DIGESTS_LOCK = threading.Lock()
# One builder at a time per process; across processes the atomic rename settles races.
_BUILD_LOCK = threading.Lock()


def snapshot_key(model: SemanticModel, data_dir: Path) -> str:
    """A hex digest of everything the snapshot of `model` over `data_dir` depends on."""
    import duckdb

    from pytest_evalloop.targets.embedded import model as builder
    from pytest_evalloop.targets.embedded.data import TABLES

    digest = hashlib.sha256()
    for part in (SNAPSHOT_FORMAT, duckdb.__version__, model.model_dump_json(by_alias=True)):
        digest.update(part.encode())
        digest.update(b"\x1e")
    # install_sources and what it calls live in model.py: an edit there can change the content.
    digest.update(file_digest(Path(builder.__file__)).encode())
    for table in TABLES:
        path = Path(data_dir) / f"{table}.parquet"
        digest.update(f"{table}={file_digest(path)}".encode())
        digest.update(b"\x1e")
    return digest.hexdigest()


def snapshot_path(model: SemanticModel, data_dir: Path, cache_dir: Path | None = None) -> Path:
    """The read-only database file holding `model`'s relations over `data_dir`, built if absent.

    Raises FileNotFoundError for a missing raw file and ModelFileError for a model whose
    sources cannot be built, as `install_sources` does.
    """
    key = snapshot_key(model, data_dir)  # raises for a missing raw file, before any fallback
    try:
        return _ensure(_snapshots_root(cache_dir) / key[:32], model, data_dir)
    except OSError:
        # An unusable cache (read-only home, a file where the folder should be) must not stop
        # the run: build into a private temporary folder instead.
        user = getattr(os, "getuid", lambda: "user")()
        fallback = Path(tempfile.gettempdir()) / f"pytest-evalloop-snapshots-{user}"
        return _ensure(fallback / key[:32], model, data_dir)


def _snapshots_root(cache_dir: Path | None) -> Path:
    from pytest_evalloop.targets.embedded.data import cache_root

    return cache_root(cache_dir) / "snapshots"


def _ensure(folder: Path, model: SemanticModel, data_dir: Path) -> Path:
    final = folder / _FILE_NAME
    if final.is_file():
        return final
    with _BUILD_LOCK:
        if final.is_file():
            return final
        folder.mkdir(parents=True, exist_ok=True)
        # Built under a private name and renamed into place, so a reader (another xdist worker)
        # never opens a half-written file; a racing builder's rename replaces an equal file.
        scratch = folder / f".{_FILE_NAME}.{os.getpid()}.{uuid.uuid4().hex}"
        try:
            _build(scratch, model, data_dir)
            os.replace(scratch, final)
        finally:
            scratch.unlink(missing_ok=True)
            Path(f"{scratch}.wal").unlink(missing_ok=True)
    return final


def _build(path: Path, model: SemanticModel, data_dir: Path) -> None:
    import duckdb

    from pytest_evalloop.targets.embedded.model import install_sources

    con = duckdb.connect(str(path))
    try:
        con.execute("SET enable_progress_bar = false")  # never printed into our stdout
        install_sources(con, model, data_dir)
        con.execute("CHECKPOINT")
    finally:
        con.close()


def file_digest(path: Path) -> str:
    """The sha256 of a file's bytes, hashed once per process while its size and mtime hold."""
    try:
        stat = path.stat()
    except FileNotFoundError:
        raise FileNotFoundError(
            f"embedded data file {path} is missing; call ensure_data() to generate it"
        ) from None
    key = (str(path.resolve()), stat.st_size, stat.st_mtime_ns, stat.st_ino)
    with _DIGESTS_LOCK:
        known = _DIGESTS.get(key)
    if known is not None:
        return known
    with path.open("rb") as handle:
        value = hashlib.file_digest(handle, "sha256").hexdigest()
    with _DIGESTS_LOCK:
        _DIGESTS[key] = value
    return value
