"""A package check that passed is reused while nothing it read changed, and only then.

Each test checks a copy of the Malloy example package under a name of its own (the name is part
of the key), with the real compiler. That a stored entry is what answered is shown by marking
the entry: the mark comes back only when the cache answered.
"""

from __future__ import annotations

import json
import shutil
import uuid
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from tests.conftest import REPO

if TYPE_CHECKING:
    from pytest_evalloop.targets.malloy.package import PackageCheck

pytestmark = pytest.mark.skipif(
    shutil.which("node") is None or shutil.which("npm") is None,
    reason="the malloy target needs node and npm on PATH (install Node.js 20+)",
)


@pytest.fixture
def package(tmp_path: Path) -> Path:
    from tests.test_malloy_target import ensure_set_data

    ensure_set_data()
    root = tmp_path / f"pkg-{uuid.uuid4().hex[:12]}"
    # Table files copied as files (not the links the set holds), so a test can change one.
    shutil.copytree(REPO / "evals" / "ecommerce-malloy" / "ecommerce", root, symlinks=False)
    return root.resolve()


def check(root: Path) -> PackageCheck:
    from pytest_evalloop.targets.malloy import package

    package._check.cache_clear()  # the per-process cache: each call here asks the disk
    return package.check_package(root)


def entry_of(root: Path) -> Path:
    from pytest_evalloop.targets.malloy import checkcache
    from pytest_evalloop.targets.malloy.install import ensure_server

    server = ensure_server()
    return server.parent / "checks" / f"{checkcache.key(root, server)}.json"


def mark(entry: Path) -> None:
    data = json.loads(entry.read_text())
    data["check"]["pins"]["compiler"] = "from the cache"
    entry.write_text(json.dumps(data))


def test_a_passing_check_is_reused_by_a_copy_until_a_table_or_model_changes(
    package: Path, tmp_path: Path
) -> None:
    first = check(package)
    assert first.ok and first.tables
    entry = entry_of(package)
    stored = json.loads(entry.read_text())
    assert set(stored["tables"]) == {"data/" + Path(t).name for t in first.tables}
    mark(entry)
    assert check(package).pins["compiler"] == "from the cache"

    # A copy elsewhere under the same name reads the same entry, with its own root and tables.
    copy = (tmp_path / "elsewhere" / package.name).resolve()
    shutil.copytree(package, copy)
    again = check(copy)
    assert again.pins["compiler"] == "from the cache"
    assert again.root == str(copy) and all(t.startswith(str(copy)) for t in again.tables)

    # A table file whose content changed: compiled again (and the entry replaced).
    table = package / "data" / "users.parquet"
    table.write_bytes(table.read_bytes() + b"\0")
    redone = check(package)
    assert redone.pins["compiler"].startswith("@malloydata/malloy")
    mark(entry)

    # A model file that changed is another key: compiled again.
    model = package / "ecommerce.malloy"
    model.write_text(model.read_text() + "\n// a comment\n")
    assert entry_of(package) != entry
    assert check(package).pins["compiler"].startswith("@malloydata/malloy")


def test_a_failing_check_is_never_stored(package: Path) -> None:
    model = package / "ecommerce.malloy"
    model.write_text(model.read_text() + "\nsource: broken is duckdb.table('data/none.parquet')\n")
    failed = check(package)
    assert not failed.ok
    assert not entry_of(package).exists()
    failed_again = check(package)
    assert failed_again == failed


def test_the_cache_can_be_turned_off(package: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    check(package)
    mark(entry_of(package))
    monkeypatch.setenv("EVALLOOP_MALLOY_CHECK_CACHE", "0")
    assert check(package).pins["compiler"].startswith("@malloydata/malloy")
