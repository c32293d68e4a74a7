"""A person's verdict on one attempt: `evalloop review` and the review panel of `evalloop view`.

One function, :func:`record_review`, does what a review writes, whichever face asked:

- a `review` event appended to the run's ledger (the judge's `score` is never edited), with who,
  when, why and the judge's verdict the person saw; `aggregates.settled_scores` decides how it
  counts (people's reviews of an attempt are one human label: `measure.people`);
- for a verdict, the attempt's one fixture in the set's `judge-regressions.jsonl`: the human
  label as it now stands (the latest ruling, each person's ruling, whether people disagree),
  the frozen prediction (final query, answer, the rows' artifact path) sealed with
  `predictionSha`, both verdicts and the why; the fixture it supersedes is voided by a line
  appended before it (never an edit), so `--eval-check-judge` and kappa count each settled
  attempt exactly once and leave out the ones people disagree on;
- on a judge suspect (`evalloop diagnose`: the rows match the golden, the judge said no_match)
  the suspect's `judge` issue is settled (`fixed`: the judge was wrong; `rejected`: it was
  right); `review_queue` lists the suspects still awaiting a person;
- "golden is wrong": the golden is held through the side door (`goldens.repair.hold`) and the
  review records that, changing no score;
- then the run's `run.json` totals and its `report.html` (when it has one) are rewritten from
  the ledger, so every view shows the new counts.

A review of a contaminated, harness-error, gold_wrong or unscored attempt is refused
(`aggregates.review_refusal`), as is a review without a why or a reviewer.
"""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pytest_evalloop.identity import person
from pytest_evalloop.ledger import contract as ledger
from pytest_evalloop.ledger import reader as ledger_reader
from pytest_evalloop.ledger import writer as ledger_writer
from pytest_evalloop.ledger.files import LedgerFileError
from pytest_evalloop.ledger.vocabulary import JUDGE
from pytest_evalloop.measure import aggregates, people
from pytest_evalloop.sets import cases as sets

GOLDEN_WRONG = "golden_wrong"
"""The review panel's and `--verdict`'s word for "the golden is wrong"."""
RULINGS = ("match", "no_match", "near_match", GOLDEN_WRONG)


class ReviewError(Exception):
    """The review cannot be recorded as asked; the message says what to do."""


@dataclass(frozen=True)
class Recorded:
    """What one review wrote."""

    event: ledger.ReviewEvent
    fixture_id: str | None
    golden_held: bool
    voided: tuple[str, ...] = ()
    """The attempt's earlier fixtures this review voided (appended void lines)."""
    label: people.HumanLabel | None = None
    """The attempt's human label after this review (None: a "golden is wrong" review)."""


def default_reviewer() -> str:
    """The reviewer when --by is not given (`identity.person`: git's user.name, else the login
    name)."""
    return person()


def set_dir_of(run_dir: Path, given: Path | None = None) -> Path:
    """The set a run belongs to: `given`, else the directory holding its `runs/` folder."""
    candidate = given if given is not None else run_dir.resolve().parent.parent
    if not (candidate / "set.json").is_file():
        raise ReviewError(
            f"{candidate} has no set.json: the run {run_dir} is not under <set>/runs/; "
            "name its set with --set"
        )
    return candidate


def record_review(
    run_dir: Path,
    qid: str,
    ruling: str,
    *,
    why: str,
    reviewer: str | None,
    sample: int | None = None,
    set_dir: Path | None = None,
) -> Recorded:
    """Record a person's ruling on one attempt of a run (see the module docstring)."""
    if ruling not in RULINGS:
        raise ReviewError(f"verdict {ruling!r} is not one of {list(RULINGS)}")
    why = (why or "").strip()
    if not why:
        raise ReviewError("a review needs a why: say what the judge missed (--why)")
    reviewer = (reviewer or "").strip() or None
    if reviewer is None:
        raise ReviewError("no reviewer: set `git config user.name` or pass --by NAME")
    the_set = set_dir_of(run_dir, set_dir)
    # One review at a time per set: the human label is computed from the reviews already in
    # the ledger, and the fixtures it voids and files must be those of that very state.
    with _set_lock(the_set):
        return _record(run_dir, the_set, qid, ruling, why, reviewer, sample)


def _record(
    run_dir: Path,
    the_set: Path,
    qid: str,
    ruling: str,
    why: str,
    reviewer: str,
    sample: int | None,
) -> Recorded:
    read = ledger_reader.read_run(run_dir)
    if read.info is None:
        # The reader's own words when it refused a file (a pipe, a link: `ledger.files`).
        why = "; ".join(f.message for f in read.errors) or "no readable run.json"
        raise ReviewError(f"{run_dir}: {why}; give a run directory")
    key = _attempt_key(read, qid, sample)
    score = read.scores().get(key)
    attempt = read.attempts().get(key)
    refusal = aggregates.review_refusal(score, attempt)
    if refusal is not None:
        which = qid if key[1] is None else f"{qid} (sample {key[1]})"
        raise ReviewError(f"review of {which} in {run_dir.name} refused: {refusal}")
    assert score is not None
    golden_wrong = ruling == GOLDEN_WRONG
    fields = {
        "qid": key[0],
        "sample": key[1],
        "phase": score.phase,
        "verdict": None if golden_wrong else ruling,
        "golden_wrong": golden_wrong,
        "reviewer": reviewer,
        "why": why,
        "judge_verdict": score.verdict,
        "judge_version": score.judge_version,
        "rubric_sha": score.rubric_sha,
    }
    fixture_id: str | None = None
    voided: tuple[str, ...] = ()
    label: people.HumanLabel | None = None
    suspect = judge_issue(read, key[0])
    if golden_wrong:
        _hold(the_set, qid, why=why, reviewer=reviewer, run_id=read.info.run_id)
    else:
        # Every verdict is one human label of the attempt (people.label_of): the attempt's
        # earlier fixture is voided and one fixture of the label as it now stands is filed,
        # agreeing with the judge or not, so kappa counts each settled attempt exactly once.
        earlier = [e for e in read.of_kind("review") if (e.qid, e.sample) == key]
        label = people.label_of([*earlier, ledger.ReviewEvent.model_validate(fields)])
        assert label is not None
        fixture_id, voided = _file_fixture(the_set, read, key, score, attempt, label, why)
    event = ledger.ReviewEvent.model_validate({**fields, "regression": fixture_id})
    settled: list[Any] = [event]
    if suspect is not None:
        settled.append(_suspect_settled(suspect, ruling, score.verdict, fixture_id, reviewer))
    ledger_writer.LedgerWriter(run_dir).append(*settled)
    _refresh_views(run_dir)
    return Recorded(event, fixture_id, golden_wrong, voided, label)


@contextmanager
def _set_lock(set_dir: Path) -> Iterator[None]:
    # set.json is in every set and never rewritten by a review: an flock on it serialises
    # reviews across processes (two `evalloop view` tabs, a view and a CLI review).
    fd = os.open(set_dir / "set.json", os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def judge_issue(read: ledger_reader.RunLedger, qid: str) -> str | None:
    """The judge-suspect issue (`evalloop diagnose`: the rows match the golden, the judge said
    no_match) naming `qid` in this run, if there is one."""
    for issue_id, issue in read.issues().items():
        if issue.owner == JUDGE and qid in issue.qids:
            return issue_id
    return None


def _suspect_settled(
    issue_id: str, ruling: str, judge_said: str | None, fixture_id: str | None, reviewer: str
) -> ledger.IssueStatusEvent:
    # The suspicion is settled either way: the judge was wrong (fixed: the person's verdict
    # counts), or right (rejected: a new diagnose takes the case up the ladder).
    status: ledger.IssueStatus
    if ruling == GOLDEN_WRONG:
        status, note = "rejected", "the golden is wrong: held through the side door"
    elif ruling != judge_said:
        status, note = "fixed", f"the judge was wrong: {reviewer} ruled {ruling}"
    else:
        status, note = "rejected", f"the judge was right: {reviewer} ruled {ruling} too"
    if fixture_id:
        note += f"; judge-regressions.jsonl: {fixture_id}"
    return ledger.IssueStatusEvent(issue_id=issue_id, status=status, by="review", note=note)


@dataclass(frozen=True)
class Queued:
    """A judge suspect no person has reviewed yet."""

    run: str
    """The run's directory under the runs directory."""
    qid: str
    sample: int | None
    issue_id: str
    judge_why: str | None
    diagnosis: str | None


def review_queue(runs_dir: Path) -> list[Queued]:
    """Every judge suspect under `runs_dir` awaiting a person (`evalloop view`'s queue): each
    `diagnosis` that `evalloop diagnose` routed to the judge, with no review of its attempt
    since. Runs in directory order, cases in ledger order."""
    kinds = frozenset({"diagnosis", "issue", "review"})
    queued = []
    for child in sorted(runs_dir.iterdir()) if runs_dir.is_dir() else []:
        if not (child / ledger.RUN_FILE).is_file():
            continue
        read = ledger_reader.read_run(child, kinds=kinds, validate=False)
        reviewed = read.reviews()
        for d in read.of_kind("diagnosis"):
            if d.status != "judge" or (d.qid, d.sample) in reviewed:
                continue
            issue_id = judge_issue(read, d.qid)
            if issue_id is None:
                continue
            why = (d.evidence or {}).get("judge_why") if isinstance(d.evidence, dict) else None
            queued.append(Queued(child.name, d.qid, d.sample, issue_id, why, d.diagnosis))
    return queued


def _attempt_key(
    read: ledger_reader.RunLedger, qid: str, sample: int | None
) -> tuple[str, int | None]:
    keys = [k for k in read.attempts() if k[0] == qid] or [k for k in read.scores() if k[0] == qid]
    if not keys:
        raise ReviewError(f"case {qid!r} has no attempt in {read.run_dir.name}")
    if sample is not None:
        if (qid, sample) not in keys:
            raise ReviewError(f"case {qid!r} has no sample {sample}; it has {[k[1] for k in keys]}")
        return (qid, sample)
    if len(keys) > 1:
        raise ReviewError(f"case {qid!r} has {len(keys)} samples: name one with --sample")
    return keys[0]


def _hold(set_dir: Path, qid: str, *, why: str, reviewer: str, run_id: str) -> None:
    from pytest_evalloop.goldens.change import GoldenRefused, GoldenUsageError
    from pytest_evalloop.goldens.repair import hold

    try:
        hold(set_dir, qid, reason=f"{why} (review of run {run_id})", by=reviewer)
    except (GoldenRefused, GoldenUsageError) as exc:
        raise ReviewError(f"golden of {qid} not held: {exc}") from exc


def _file_fixture(
    set_dir: Path,
    read: ledger_reader.RunLedger,
    key: tuple[str, int | None],
    score: Any,
    attempt: Any,
    label: people.HumanLabel,
    why: str,
) -> tuple[str, tuple[str, ...]]:
    """Void the attempt's live fixtures and append one of `label` (under the set lock): the
    new fixture's id and the voided ones'."""
    assert read.info is not None
    prediction: dict[str, Any] = {
        "final_query": getattr(attempt, "final_query", None),
        "answer_text": getattr(attempt, "answer_text", None),
        "predictionPath": getattr(attempt, "prediction_path", None),
    }
    path = set_dir / sets.REGRESSIONS_FILE
    base = f"{key[0]}-{read.info.run_id}" + (f"-s{key[1]}" if key[1] is not None else "")
    row = {
        "qid": key[0],
        "verdict": label.verdict,
        "why": why,
        "settledBy": label.reviewer,
        "settledAt": ledger.now_iso(),
        "judgeVerdict": score.verdict,
        "judgeWhy": score.why,
        "judgeVersion": score.judge_version,
        "rubricSha": score.rubric_sha,
        "runId": read.info.run_id,
        "sample": key[1],
        "goldenRevision": score.golden_revision,
        "rulings": [{"reviewer": who, "verdict": v} for who, v in label.rulings],
        "peopleDisagree": label.disagree,
        "predictionSha": sets.prediction_sha(prediction),
        "prediction": prediction,
    }
    loaded = sets.load_regressions(set_dir)
    taken = {f.fixture_id for _, f in [*loaded.rows, *loaded.voided]}
    fixture_id, n = base, 1
    while fixture_id in taken:
        n += 1
        fixture_id = f"{base}-{n}"
    lines = [
        {
            "void": f.fixture_id,
            "supersededBy": fixture_id,
            "why": f"superseded: {label.reviewer} reviewed {key[0]} of run {read.info.run_id} "
            "again",
            "at": row["settledAt"],
        }
        for _, f in loaded.rows
        if f.run_id == read.info.run_id and (f.qid, f.sample) == key
    ]
    lines.append({"fixtureId": fixture_id, **row})
    text = "".join(json.dumps(line, ensure_ascii=False) + "\n" for line in lines)
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, text.encode("utf-8"))
        os.fsync(fd)
    finally:
        os.close(fd)
    return fixture_id, tuple(line["void"] for line in lines[:-1])


def _refresh_views(run_dir: Path) -> None:
    # run.json totals are what the run counted: a review changes the count, so they follow it.
    from pytest_evalloop.report.html import rewrite_report

    read = ledger_reader.read_run(run_dir)
    if read.info is not None and read.info.totals is not None:
        ledger_writer.update_run_info(run_dir, totals=aggregates.tally(read).totals())
    rewrite_report(run_dir)


def review_main(argv: list[str]) -> int:
    """`evalloop review <run> <qid> --verdict V --why TEXT [--by NAME] [--sample N]`."""
    parser = argparse.ArgumentParser(
        prog="evalloop review",
        description="Record a person's verdict on one attempt of a stored run (append-only).",
    )
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("qid")
    parser.add_argument("--verdict", required=True, choices=RULINGS)
    parser.add_argument("--why", required=True, help="why the judge's verdict is (not) right")
    parser.add_argument(
        "--by", help="the reviewer (default: git config user.name, else the login name)"
    )
    parser.add_argument("--sample", type=int, help="which sample, when the case has several")
    parser.add_argument("--set", type=Path, dest="set_dir", help="the run's set directory")
    args = parser.parse_args(argv)
    try:
        done = record_review(
            args.run_dir,
            args.qid,
            args.verdict,
            why=args.why,
            reviewer=args.by or default_reviewer(),
            sample=args.sample,
            set_dir=args.set_dir,
        )
    except (ReviewError, LedgerFileError) as exc:
        # A ledger file refused on the way (shared through a hard link, say): named, no trace.
        print(f"evalloop review: {exc}", file=sys.stderr)
        return 1
    event = done.event
    what = "golden held (side door)" if done.golden_held else f"verdict {event.verdict}"
    print(
        f"{args.run_dir.name} {event.qid}: {what} by {event.reviewer} (judge: {event.judge_verdict})"
    )
    if done.fixture_id:
        voided = f" (voided {', '.join(done.voided)}: superseded)" if done.voided else ""
        print(f"judge-regressions.jsonl: appended {done.fixture_id}{voided}")
    if done.label is not None and done.label.disagree:
        print(
            f"people disagree on {event.qid} ({done.label.text()}): counted as needs_human and "
            "out of kappa until one more review settles it"
        )
    return 0
