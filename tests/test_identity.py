"""One default for who a person is: `evalloop review`, `evalloop view` and the golden side door
record --by, else git's user.name, else the login name (issue 47: three defaults before)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pytest_evalloop import identity
from pytest_evalloop.goldens import repair, rewrite
from pytest_evalloop.review import review
from tests.conftest import EXAMPLE_SET


@pytest.fixture
def no_git_name(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A HOME without a git identity, and a known login name."""
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("GIT_CONFIG_NOSYSTEM", "1")
    monkeypatch.delenv("GIT_CONFIG_GLOBAL", raising=False)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("USER", "login-name")
    monkeypatch.setenv("LOGNAME", "login-name")
    return home


def test_by_then_git_then_the_login_name(no_git_name: Path) -> None:
    assert identity.person() == "login-name" == review.default_reviewer()
    assert identity.person("  Ana ") == "Ana"
    (no_git_name / ".gitconfig").write_text("[user]\n\tname = Git Name\n")
    assert identity.person() == "Git Name" == review.default_reviewer()


def test_the_side_door_records_the_same_person(no_git_name: Path, tmp_path: Path) -> None:
    (no_git_name / ".gitconfig").write_text("[user]\n\tname = Git Name\n")
    set_dir = tmp_path / "evals" / "shop"
    set_dir.mkdir(parents=True)
    for name in ("set.json", "model.json", "cases.jsonl"):
        (set_dir / name).write_bytes((EXAMPLE_SET / name).read_bytes())
    repair.hold(set_dir, "ecom_order_count", reason="checking a doubt")
    [change] = [
        json.loads(line)
        for line in (set_dir / rewrite.CHANGES_FILE).read_text().splitlines()
        if line.strip()
    ]
    assert change["by"] == "Git Name"
