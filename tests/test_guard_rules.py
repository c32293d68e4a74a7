"""The loop's guards as rules (issue 42): what an edit's meaning change reads, what is dirty,
which side-door records count.

No endpoint: a git repository of a small copy of the example set, and the example models.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pytest_evalloop import cli
from pytest_evalloop.improve import repo as repo_mod
from pytest_evalloop.improve import sidedoor
from pytest_evalloop.improve import workcopy as wc
from pytest_evalloop.ledger import reader as ledger_reader
from pytest_evalloop.sets import cases as sets
from pytest_evalloop.testing import FakeAnthropic
from tests.test_improve import (
    HOLDOUT_OTHER,
    HOLDOUT_STATUS,
    ISSUE,
    PASSING,
    QIDS,
    TARGET,
    WEAK,
    diagnosed,
    git,
    improver,
    reply,
    shop,
    stored_repo,  # noqa: F401 (a fixture)
)
from tests.test_improve import repo as repo  # noqa: F401, PLC0414 (a fixture)
from tests.test_run import make_set

EVALS = Path(__file__).resolve().parent.parent / "evals"
MALLOY = (EVALS / "ecommerce-malloy" / "ecommerce" / "ecommerce.malloy").read_text()
CODE_LINES = [
    n
    for n, line in enumerate(MALLOY.splitlines())
    if wc.malloy_code(line) and wc._malloy_source_at(MALLOY, n)
]


def commit(root: Path, message: str = "change") -> None:
    git(root, "add", "-A")
    git(root, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", message)


# --- 5. an edit's meaning: both sides of every changed line ----------------------------------


def _with_line(n: int, new: str | None) -> str:
    lines = MALLOY.splitlines()
    if new is None:
        del lines[n]
    else:
        lines[n] = new
    return "\n".join(lines) + "\n"


@settings(max_examples=60, deadline=None)
@given(st.sampled_from(CODE_LINES), st.sampled_from(["// ", "-- "]))
def test_commenting_out_or_deleting_any_line_of_code_changes_its_source(n: int, mark: str) -> None:
    line = MALLOY.splitlines()[n]
    source = f"source:{wc._malloy_source_at(MALLOY, n)}"
    indent = line[: len(line) - len(line.lstrip())]
    for after in (_with_line(n, f"{indent}{mark}{line.lstrip()}"), _with_line(n, None)):
        assert source in wc.meaning_changed("malloy", {"m": MALLOY}, {"m": after})
    # A comment added beside the code, or a re-indent, changes nothing it computes.
    assert (
        wc.meaning_changed("malloy", {"m": MALLOY}, {"m": _with_line(n, line + "  // why")}) == []
    )
    assert wc.meaning_changed("malloy", {"m": MALLOY}, {"m": _with_line(n, "  " + line)}) == []


def test_a_comment_stripped_from_both_sides_is_no_change() -> None:
    old = "source: s is t extend {\n  dimension: a is b // old note\n}\n"
    new = "source: s is t extend {\n  dimension: a is b -- a new note\n}\n"
    assert wc.meaning_changed("malloy", {"m": old}, {"m": new}) == []
    quoted = "source: s is t extend {\n  where: name = 'a//b'\n}\n"
    edited = "source: s is t extend {\n  where: name = 'a//c'\n}\n"
    assert wc.meaning_changed("malloy", {"m": quoted}, {"m": edited}) == ["source:s"]


# --- 6. dirty means anything pytest would read ------------------------------------------------


@pytest.fixture
def set_repo(tmp_path: Path) -> tuple[Path, Path]:
    root = tmp_path / "repo"
    root.mkdir()
    set_dir = make_set(root, QIDS)
    git(root, "init", "-q")
    commit(root, "the set")
    return root, set_dir


def test_untracked_and_ignored_pytest_files_are_dirty_data_and_ledgers_are_not(
    set_repo: tuple[Path, Path],
) -> None:
    root, set_dir = set_repo
    model = [set_dir / "model.json"]
    assert repo_mod.dirty_read(root, set_dir, model) == []
    (set_dir / "runs" / "r").mkdir(parents=True)
    (set_dir / "runs" / "r" / "events.jsonl").write_text("{}\n")
    (set_dir / "__pycache__").mkdir()
    (set_dir / "__pycache__" / "x.pyc").write_bytes(b"\0")
    assert repo_mod.dirty_read(root, set_dir, model) == []
    (set_dir / "conftest.py").write_text("# read by pytest\n")
    (root / "evals" / "pytest.ini").write_text("[pytest]\n")
    assert repo_mod.dirty_read(root, set_dir, model) == [
        "evals/pytest.ini",
        "evals/shop/conftest.py",
    ]
    assert repo_mod.model_git_sha(model, set_dir).endswith("-dirty")  # type: ignore[union-attr]
    assert not repo_mod.model_git_sha(model).endswith("-dirty")  # type: ignore[union-attr]
    commit(root)
    # An ignored conftest.py is read all the same; an ignored data file is not a pytest file.
    (root / ".gitignore").write_text("conftest.py\ndata/\n")
    commit(root, "ignore")
    (set_dir / "data").mkdir()
    (set_dir / "data" / "t.parquet").write_bytes(b"PAR1")
    (set_dir / "sub").mkdir()
    (set_dir / "sub" / "conftest.py").write_text("x = 1\n")
    assert repo_mod.dirty_read(root, set_dir, model) == ["evals/shop/sub/conftest.py"]
    assert set_dir / "sub" / "conftest.py" in repo_mod.pinned_files(root, set_dir)


def test_the_loop_refuses_an_untracked_conftest_before_anything_is_paid(
    fake: FakeAnthropic, repo: Path, capsys: Any
) -> None:
    (shop(repo) / "conftest.py").write_text("# changes every run\n")
    assert cli.main(["loop", str(shop(repo))]) == 2
    out = capsys.readouterr().out
    assert "uncommitted changes in evals/shop/conftest.py: pytest reads these" in out
    assert fake.calls() == []


# --- the side door: a record counts only when the set's history bears it out -----------------


def _hold(set_dir: Path, qid: str) -> None:
    assert cli.main(["golden", "hold", str(set_dir), qid, "--reason", "moved"]) == 0


def _rewrite_row(set_dir: Path, qid: str, change: Any) -> None:
    path = set_dir / sets.CASES_FILE
    rows = [json.loads(x) for x in path.read_text().splitlines()]
    for row in rows:
        if row["qid"] == qid:
            change(row)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def _forge(set_dir: Path, qid: str, action: str, old_sha: str, line: int = 1) -> None:
    record = {
        "at": "2099-01-01T00:00:00Z",
        "action": action,
        "qid": qid,
        "by": "someone",
        "line": line,
        "oldGoldenRevision": 1,
        "newGoldenRevision": 2,
        "oldStatus": "verified",
        "newStatus": "verified",
        "oldDatasetVersion": 1,
        "newDatasetVersion": 2,
        "oldDatasetSha": old_sha,
        "newDatasetSha": sets.dataset_sha(set_dir),
    }
    with (set_dir / "golden-changes.jsonl").open("a") as out:
        out.write(json.dumps(record) + "\n")


def _line_of(set_dir: Path, qid: str) -> int:
    rows = (set_dir / sets.CASES_FILE).read_text().splitlines()
    return next(n for n, x in enumerate(rows, 1) if json.loads(x)["qid"] == qid)


def _bump_version(set_dir: Path) -> None:
    path = set_dir / sets.SET_FILE
    data = json.loads(path.read_text())
    data["datasetVersion"] = 2
    path.write_text(json.dumps(data))


def test_a_real_hold_drops_its_case(set_repo: tuple[Path, Path]) -> None:
    root, set_dir = set_repo
    base = sets.dataset_sha(set_dir)
    _hold(set_dir, PASSING)
    commit(root)
    got = sidedoor.checked(set_dir, root, base, sets.dataset_sha(set_dir), [TARGET])
    assert got.reached and got.dropped == [PASSING] and got.refused == []


def test_a_forged_record_cannot_drop_a_chosen_case(set_repo: tuple[Path, Path]) -> None:
    root, set_dir = set_repo
    base = sets.dataset_sha(set_dir)
    # A hand edit of one case, and a record that names another as repaired.
    _rewrite_row(set_dir, HOLDOUT_OTHER, lambda row: row["tags"].append("edited"))
    _bump_version(set_dir)
    _forge(set_dir, PASSING, "repair", base, _line_of(set_dir, PASSING))
    commit(root)
    unchecked = sidedoor.side_door_rebase(
        base, sets.dataset_sha(set_dir), sidedoor.golden_changes(set_dir), []
    )
    assert unchecked.reached and unchecked.dropped == [PASSING]  # the shas alone would drop it
    got = sidedoor.checked(set_dir, root, base, sets.dataset_sha(set_dir), [])
    assert not got.reached and got.dropped == []
    assert f"case {HOLDOUT_OTHER} changed with no side-door record" in " ".join(got.refused)
    assert f"the record of {PASSING} (repair) is not what happened" in " ".join(got.refused)


def test_a_repair_that_changed_no_golden_content_drops_nothing(
    set_repo: tuple[Path, Path],
) -> None:
    root, set_dir = set_repo
    base = sets.dataset_sha(set_dir)
    _rewrite_row(set_dir, PASSING, lambda row: row.update(goldenRevision=2))
    _bump_version(set_dir)
    _forge(set_dir, PASSING, "repair", base, _line_of(set_dir, PASSING))
    commit(root)
    got = sidedoor.checked(set_dir, root, base, sets.dataset_sha(set_dir), [])
    assert not got.reached
    assert got.refused == [
        f"the record repairs {PASSING}, but what its golden holds did not change"
    ]


def test_a_forged_hold_and_other_forgeries_are_refused(set_repo: tuple[Path, Path]) -> None:
    root, set_dir = set_repo
    base = sets.dataset_sha(set_dir)
    _rewrite_row(set_dir, PASSING, lambda row: row["golden"].update(rubric="changed"))
    path = set_dir / sets.SET_FILE
    data = json.loads(path.read_text())
    path.write_text(json.dumps({**data, "datasetVersion": 2, "description": "edited too"}))
    _forge(set_dir, PASSING, "hold", base, line=1)
    commit(root)
    refused = " ".join(sidedoor.checked(set_dir, root, base, sets.dataset_sha(set_dir), []).refused)
    assert f"the record holds {PASSING}, but its golden is not held now" in refused
    assert "set.json changed beyond its datasetVersion" in refused
    if _line_of(set_dir, PASSING) != 1:
        assert f"the record of {PASSING} names line 1, where another case is" in refused


def test_a_baseline_dataset_no_commit_holds_cannot_be_checked(
    set_repo: tuple[Path, Path],
) -> None:
    root, set_dir = set_repo
    _rewrite_row(set_dir, PASSING, lambda row: row["tags"].append("uncommitted"))
    base = sets.dataset_sha(set_dir)  # a baseline answered on a dirty set
    _hold(set_dir, PASSING)
    commit(root)
    got = sidedoor.checked(set_dir, root, base, sets.dataset_sha(set_dir), [])
    assert not got.reached and "is in no commit" in got.refused[0]


def test_a_forged_record_settles_no_golden_suspect(
    fake: FakeAnthropic, repo: Path, capsys: Any
) -> None:
    meaning = {"file": "model.json", "old": WEAK, "new": WEAK + ', "expr": "lower(status)"'}
    run_dir = diagnosed(
        fake,
        repo,
        improver({"edit": meaning}, reply(meaningChanged=["dimension:orders:status"])),
    )
    assert cli.main(["improve", str(run_dir), "--issue", ISSUE, "--no-review"]) == 0
    set_dir = shop(repo)
    base = json.loads((run_dir / "run.json").read_text())["datasetSha"]
    # A hand edit of the holdout suspect's rubric, recorded as a hold it never was.
    _rewrite_row(set_dir, HOLDOUT_STATUS, lambda row: row["golden"].update(rubric="rewritten"))
    _bump_version(set_dir)
    _forge(set_dir, HOLDOUT_STATUS, "hold", base, _line_of(set_dir, HOLDOUT_STATUS))
    subprocess.run(
        ["git", "stash", "push", "-q", "--", "evals/shop/model.json"], cwd=repo, check=True
    )
    commit(repo, "a hand edit and its forged record")
    subprocess.run(["git", "stash", "pop", "-q"], cwd=repo, check=True)
    capsys.readouterr()
    argv = ["accept", str(run_dir), "--candidate", "base:cand-01"]
    code = cli.main([*argv, "--dismiss-suspect", TARGET, "re-derived by a person"])
    out = capsys.readouterr().out
    assert code == 6, out
    assert f"golden suspect(s) {HOLDOUT_STATUS} unsettled" in out
    assert "side-door records not counted" in out and "is not held now" in out
    [check] = ledger_reader.read_run(run_dir).of_kind("acceptance_check")
    assert check.decision == "unresolved" and check.final_run_ids == []
    assert not [p for p in (set_dir / "runs").iterdir() if "blind_gate" in p.name]
