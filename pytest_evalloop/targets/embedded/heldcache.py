"""Goldens the pre-run check found holding, remembered on disk while nothing it read changed.

Before anything is paid for, every run on an embedded set re-derives each golden it will score
(`goldens.preflight.golden_check`): the truth tables are copied into DuckDB (~0.25 s of CPU
for the example data) and each golden's two derivations run on them. A developer's tenth run
of the day, a suite of runs, or an improve loop's baseline and arms repeat that check on the
same goldens over the same data. Whether a golden holds depends only on what the check reads:
the golden itself (and the value of its artifact file), the bytes of the truth tables, the
DuckDB version that runs the queries and the code that compares. A golden that held is recorded
under a key over all of them, and is not derived again while that key matches. A golden that
drifted, failed or has a finding is never recorded: it is derived, and reported, every run.

Entries are empty marker files, `<cache root>/golden-checks/<data key>/<golden key>`: a check
writes one per golden with no lock (creating a file is atomic, and two writers of the same
marker write the same nothing). `EVALLOOP_GOLDEN_CHECK_CACHE=0` turns the cache off;
`--eval-verify-goldens` never reads it.
"""

from __future__ import annotations

import hashlib
import json
import os
from importlib import metadata
from pathlib import Path
from typing import Any

__all__ = ["HeldGoldens", "enabled"]

OFF_ENV = "EVALLOOP_GOLDEN_CHECK_CACHE"
# Bump when what "held" means changes in a way the code digest below does not capture.
_FORMAT = "1"


def enabled() -> bool:
    """Whether held goldens are remembered (`EVALLOOP_GOLDEN_CHECK_CACHE=0` turns it off)."""
    return os.environ.get(OFF_ENV, "1") != "0"


class HeldGoldens:
    """The goldens known to hold over one set's truth data, read and written in one folder."""

    def __init__(self, set_dir: Path, data_dir: Path, cache_dir: Path | None = None) -> None:
        self.set_dir = Path(set_dir)
        self.folder: Path | None = None
        if enabled():
            try:
                self.folder = _folder(Path(data_dir), cache_dir)
            except OSError:
                self.folder = None  # a table file gone: the check itself will say so

    def known(self, golden: dict[str, Any]) -> bool:
        """Whether `golden` held over this data before (False when the cache is off)."""
        key = self._key(golden)
        return key is not None and self.folder is not None and (self.folder / key).is_file()

    def remember(self, golden: dict[str, Any]) -> None:
        """Record that `golden` held; a cache that cannot be written is only a slower check."""
        key = self._key(golden)
        if key is None or self.folder is None:
            return
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
            (self.folder / key).touch()
        except OSError:
            return

    def _key(self, golden: dict[str, Any]) -> str | None:
        from pytest_evalloop.sets import cases as sets

        try:
            # The stored value as the check compares it: an artifact's content, not its path.
            value = sets.golden_value(self.set_dir, golden)
        except sets.GoldenArtifactError:
            return None
        text = json.dumps([golden, value], sort_keys=True, default=repr)
        return hashlib.sha256(text.encode("utf-8")).hexdigest()


def _folder(data_dir: Path, cache_dir: Path | None) -> Path:
    """`<cache root>/golden-checks/<key over the data, DuckDB and the comparing code>`."""
    from pytest_evalloop.targets.embedded import goldens, truth
    from pytest_evalloop.targets.embedded.data import TABLES, cache_root
    from pytest_evalloop.targets.embedded.snapshot import file_digest

    digest = hashlib.sha256(f"v{_FORMAT}\0{metadata.version('duckdb')}\0".encode())
    for module in (goldens, truth):
        digest.update(file_digest(Path(str(module.__file__))).encode() + b"\0")
    for table in TABLES:
        digest.update(f"{table}={file_digest(data_dir / f'{table}.parquet')}\0".encode())
    return cache_root(cache_dir) / "golden-checks" / digest.hexdigest()[:32]
