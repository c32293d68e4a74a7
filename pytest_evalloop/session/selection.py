"""What a run selected of its set: its design, every flag that narrows it, and, when it closes,
how much of its split it attempted.

A run's `selection` in run.json is its design (split, samples, judge samples, turn and token
limits: what a resume must match and what two compared runs must share) and every narrowing of
the command line, recorded as typed (`-k`, `-m`, node ids, `--lf`, `--sw`, `--deselect`, `-x`).
When the run closes the controller adds what it covered (`selection_facts`, through
`measure.comparable.selection_record`): the split's case count, how many were attempted, each
case left out with why, and `whole`, which the comparability rule reads.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pytest_evalloop.ledger import reader as ledger_reader
from pytest_evalloop.sets import cases as sets

DESIGN: tuple[tuple[str, str, str], ...] = (
    ("split", "--eval-split", "split"),
    ("samples", "--eval-samples", "samples"),
    ("judgeSamples", "--eval-judge-samples", "judge_samples"),
    ("maxTurns", "--eval-max-turns", "max_turns"),
    ("maxTokens", "--eval-max-tokens", "max_tokens"),
    ("attemptTimeout", "--eval-attempt-timeout", "attempt_timeout"),
    ("answerUnscorable", "--eval-answer-unscorable", "answer_unscorable"),
    ("keyword", "-k", "keyword"),
    ("markexpr", "-m", "markexpr"),
    ("paths", "the paths and node ids named on the command line", "args"),
)
"""The options that change what a run measures (which cases, how many samples and judges, how
long an answerer may work): run.json `selection` key, the option, the Settings field."""


def design(settings: Any, set_dir: Path | None = None) -> dict[str, Any]:
    """The run's design as run.json `selection` records it (and a resume must match); with
    `set_dir`, the command line's paths into that set too (`selected_paths`), and every flag
    that narrows the selection (`narrowed_by`)."""
    out = {key: getattr(settings, field) for key, _option, field in DESIGN if key != "paths"}
    if set_dir is not None:
        out["paths"] = selected_paths(getattr(settings, "args", ()), set_dir)
        out["narrowedBy"] = narrowed_by(settings, out["paths"])
    return out


def narrowed_by(settings: Any, paths: list[str]) -> list[str]:
    """Every flag of this session that can leave cases of the split out, as typed: `-k`, `-m`,
    node ids or paths inside the set, and pytest's own (`options.narrowing_flags`)."""
    found = []
    if getattr(settings, "keyword", ""):
        found.append(f"-k {settings.keyword!r}")
    if getattr(settings, "markexpr", ""):
        found.append(f"-m {settings.markexpr!r}")
    named = [p for p in paths if p != "."]
    if named:
        found.append("node ids " + ", ".join(named[:5]) + (" ..." if len(named) > 5 else ""))
    return found + list(getattr(settings, "narrowing", ()))


@dataclass(frozen=True)
class Closing:
    """What the controller knows of its session when it closes a run: how the session ended
    and what it narrowed, for the run's whole-split record (`selection_facts`)."""

    narrowed_by: tuple[str, ...] = ()
    stopped: str | None = None
    """How the session stopped before its end (`-x`, `--maxfail`, Ctrl-C), or None."""
    answers_unscorable: bool = False
    selected: Mapping[Path, frozenset[str]] | None = None
    """The cases this session selected, by set folder (resolved); None when not known."""
    never_run: Mapping[str, frozenset[str]] | None = None
    """Per run directory (resolved): cases answered ahead that pytest never ran."""


def selection_facts(
    run_dir: Path, read: ledger_reader.RunLedger, closing: Closing, status: str
) -> dict[str, Any]:
    """run.json `selection` of a closing run: what it recorded at the start, this session's
    narrowing added, and how much of its split it attempted (`comparable.selection_record`)."""
    from pytest_evalloop.goldens.preflight import golden_refusal
    from pytest_evalloop.measure import comparable
    from pytest_evalloop.sets.partition import shard_of

    info = read.info
    assert info is not None
    stored = dict(info.selection or {})
    narrowed = list(dict.fromkeys([*(stored.get("narrowedBy") or []), *closing.narrowed_by]))
    set_dir = Path(info.set_dir) if info.set_dir else run_dir.parent.parent
    split = stored.get("split", "all")
    shard = info.shard or {}
    count = int(shard.get("count") or 1)
    problem = None
    try:
        # Row by row: only each selected row's golden verdict is kept (every parsed row at
        # once was the peak of a 4,000-case run's close).
        expected = {
            case.qid: golden_refusal(case)
            for _line, case, _ref in sets.iter_cases(set_dir, [])
            if case.state == "selected"
            and (split == "all" or case.split == split)
            and (count <= 1 or shard_of(case.qid, count) == int(shard.get("index") or 1))
        }
        if sets.dataset_sha(set_dir) != info.dataset_sha:
            problem = "the set changed while the run was open (datasetSha differs)"
    except (OSError, ValueError):
        problem = f"its set is not at {set_dir}"
    if problem is not None:
        return {**stored, "narrowedBy": narrowed, "whole": False, "wholeProblem": problem}
    attempted: dict[str, int] = {}
    for qid, _sample in read.attempts():
        attempted[qid] = attempted.get(qid, 0) + 1
    record = comparable.selection_record(
        expected,
        attempted,
        samples=int(stored.get("samples") or 1),
        answers_unscorable=closing.answers_unscorable,
        status=status,
        stopped=closing.stopped,
        narrowed_by=narrowed,
        rejudge=bool(info.rejudge_of),
        selected=None if closing.selected is None else closing.selected.get(set_dir.resolve()),
        never_run=(closing.never_run or {}).get(str(run_dir.resolve()), frozenset()),
    )
    return {**stored, **record}


def selected_paths(args: Iterable[str], set_dir: Path) -> list[str]:
    """What the command line selects of one set, relative to it: "." for the whole set (a
    path that is the set or contains it), `cases.jsonl::q1` for a case. Paths into other sets
    select nothing here and are left out, so the same cases named from another directory or
    beside another set are the same design."""
    root = set_dir.resolve()
    out = set()
    for arg in args:
        text, sep, node = arg.partition("::")
        path = Path(text).resolve()
        if path == root or root.is_relative_to(path):
            out.add("." + (sep + node if path == root and node else ""))
        elif path.is_relative_to(root):
            out.add(path.relative_to(root).as_posix() + sep + node)
    # The whole set named beside a case of it is the whole set.
    return ["."] if "." in out else sorted(out)
