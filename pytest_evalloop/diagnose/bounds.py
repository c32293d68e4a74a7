"""What an issue may rest on, whoever wrote it: diagnose, or a person by hand.

An issue names cases of its set, and a model issue rests on at least one dev case: holdout is
never shown to diagnose or improve, so an edit "for" a holdout case is an edit nobody could
have diagnosed, and the acceptance check would lose what it keeps for itself. One rule
(`issue_bounds`), which `evalloop validate` reports and `evalloop improve` refuses on before
anything is paid; with the code table (`vocabulary.issue_problems`, which the ledger contract
applies to every `issue` line) it is everything a hand-written issue is held to.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from pytest_evalloop.ledger import contract as ledger
from pytest_evalloop.ledger import files
from pytest_evalloop.ledger.reader import Finding, RunLedger
from pytest_evalloop.sets import cases as sets


def issue_bounds(qids: Sequence[str], owner: str, cases: Mapping[str, sets.Case]) -> list[str]:
    """Why an issue's cases cannot carry it (empty: they can)."""
    if not qids:
        return ["it names no case (an issue rests on the cases it names)"]
    problems = []
    unknown = [q for q in qids if q not in cases]
    if unknown:
        problems.append(
            f"qids not in the set's {sets.CASES_FILE}: {', '.join(unknown)} (an issue names "
            "cases of its own set)"
        )
    known = [q for q in qids if q in cases]
    holdout = [q for q in known if cases[q].split != "dev"]
    if owner == "model" and known and len(holdout) == len(known):
        problems.append(
            f"a model issue resting only on holdout cases ({', '.join(holdout)}): holdout is "
            "never shown to diagnose or improve, so no edit is made for it; name a dev case"
        )
    return problems


def set_cases(set_dir: Path) -> dict[str, sets.Case] | None:
    """The set's cases by qid (None: no set there, or none of its lines loads)."""
    if not (set_dir / sets.SET_FILE).is_file():
        return None
    loaded = sets.load_cases(set_dir)
    if not loaded.rows:
        return None
    return {case.qid: case for _, case in loaded.rows}


def issue_findings(read: RunLedger, set_dir: Path) -> list[Finding]:
    """`evalloop validate`'s check of a run's issues against its set (`issue_bounds`)."""
    issues = read.issues()
    if not issues:
        return []
    where = str(read.run_dir / ledger.EVENTS_FILE)
    cases = set_cases(set_dir)
    if cases is None:
        return [
            Finding(
                "warning",
                where,
                f"issues not checked against their set: no loadable {sets.SET_FILE} and "
                f"{sets.CASES_FILE} at {set_dir}",
            )
        ]
    return [
        Finding("error", where, f"issue {issue_id!r}: {problem}")
        for issue_id, issue in issues.items()
        for problem in issue_bounds(issue.qids, issue.owner, cases)
    ]


def refused_declaration(run_dir: Path, issue_id: str) -> list[str]:
    """Why the ledger contract refuses a line declaring `issue_id` (empty: none is refused). A
    refused line is no issue to readers, so an issue declared twice, validly then not, would
    read as the valid one: this looks at every declaration."""
    path = run_dir / ledger.EVENTS_FILE
    try:
        lines = files.read_text(path).splitlines()  # never waits on a pipe: `ledger.files`
    except OSError:
        return []
    found: list[str] = []
    for line in lines:
        try:
            data: Any = json.loads(line)
        except ValueError:
            continue
        if not (isinstance(data, dict) and data.get("kind") == "issue"):
            continue
        if data.get("issue_id") != issue_id:
            continue
        try:
            ledger.IssueEvent.model_validate(data)
        except ValidationError as exc:
            found += [str(e["msg"]).removeprefix("Value error, ") for e in exc.errors()]
    return found
