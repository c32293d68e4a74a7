"""Checks of a working copy before anyone runs on it: it loads, its touched sources answer, and
the goldens its meaning change touches are re-derived on it.

A copy is checked through the same target code a run uses (`targets.choice.build_target` on the
copy's set directory): the embedded model validates when the server is built, Malloy's real
compiler compiles every model file of the package (`check_package`), and then one query runs per
touched source. The golden audit (seed 004, eval-improve step 4) re-runs each affected case's
`modelQuery` on the edited copy and compares it with the stored golden; a case that names a
changed entity but cannot be re-derived is suspect too, because nothing cleared it.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from pytest_evalloop.improve.workcopy import Kind
from pytest_evalloop.sets import cases as sets

AUDIT_TAIL_LINES = 12


def _count_query(kind: Kind, source: str) -> str:
    if kind == "malloy":
        return f"run: {source} -> {{ aggregate: row_count is count() }}"
    return f"SELECT count(*) AS row_count FROM {source}"


def load_problem(kind: Kind, copy_set: Path, package_root: Path | None) -> str | None:
    """Why the edited copy does not load (file and line where the target says), or None."""
    if kind == "malloy":
        from pytest_evalloop.targets.malloy.package import MalloyError, check_package

        try:
            check = check_package(package_root or copy_set)
        except MalloyError as exc:
            return str(exc)
        if not check.ok:
            return (
                "; ".join(f"{p.file or '?'}:{p.line or '?'}: {p.message}" for p in check.problems)
                or "the package does not compile"
            )
        return None
    from pytest_evalloop.targets.embedded.model import ModelFileError
    from pytest_evalloop.targets.embedded.server import load_set_target

    try:
        load_set_target(copy_set)
    except (ModelFileError, ValueError) as exc:
        return str(exc)
    return None


async def check_copy(
    kind: Kind,
    copy_set: Path,
    package_root: Path | None,
    touched: list[str],
    cases: list[sets.Case],
    meaning: list[str],
    set_dir: Path,
) -> tuple[list[dict[str, Any]], list[dict[str, Any]], dict[str, Any]]:
    """Load the copy, query each touched source, audit the goldens: (checks, suspects, audit)."""
    checks: list[dict[str, Any]] = []
    problem = load_problem(kind, copy_set, package_root)
    checks.append({"check": "load", "ok": problem is None, "detail": problem or "loads"})
    audit: dict[str, Any] = {"ran": False, "clean": None, "model": str(copy_set), "tail": ""}
    if problem is not None:
        audit["tail"] = "not run: the edited model does not load"
        return checks, [], audit
    from pytest_evalloop.targets.choice import build_target

    config = sets.load_set_config(copy_set)
    target = build_target(copy_set, config, target=None, tool_profile=None)
    session = await target.open()
    try:
        for source in touched:
            done = await session.execute(_count_query(kind, source))
            ok = done.error is None and done.not_run is None
            detail = done.error or done.not_run or f"{len(done.rows)} row(s)"
            checks.append({"check": "query", "source": source, "ok": ok, "detail": detail})
        suspects, audit = await _audit(session, cases, meaning, set_dir, str(copy_set))
    finally:
        await target.close()
    return checks, suspects, audit


def mentions(case: sets.Case, entity: str) -> bool:
    """Whether a case's golden, rubric, queries or expected entities name an entity."""
    name = entity.rsplit(":", 1)[-1]
    g = case.golden
    texts = [case.model_query or "", case.question]
    if g is not None:
        texts += [g.rubric or "", g.canonical_query or ""]
    if case.expected_entities is not None:
        texts.append(case.expected_entities.model_dump_json(by_alias=True))
    pattern = re.compile(rf"(?<![\w]){re.escape(name)}(?![\w])", re.IGNORECASE)
    return any(pattern.search(t) for t in texts)


async def _audit(
    session: Any, cases: list[sets.Case], meaning: list[str], set_dir: Path, model: str
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    from pytest_evalloop.targets.embedded.pairing import compare_golden

    suspects: list[dict[str, Any]] = []
    lines: list[str] = []
    checked: list[str] = []
    for case in cases:
        g = case.golden
        hit = next((e for e in meaning if mentions(case, e)), None)
        if hit is None or g is None or g.status != "verified":
            continue
        checked.append(case.qid)
        stored = sets.golden_value(set_dir, g)
        if not case.model_query or g.kind not in ("scalar", "rows"):
            suspects.append({"qid": case.qid, "entity": hit, "stored": stored, "rederived": None})
            lines.append(f"{case.qid}: names {hit}; no modelQuery to re-derive it: suspect")
            continue
        done = await session.execute(case.model_query)
        if done.error or done.not_run:
            suspects.append({"qid": case.qid, "entity": hit, "stored": stored, "rederived": None})
            lines.append(f"{case.qid}: modelQuery failed on the edit: {done.error or done.not_run}")
            continue
        differs = compare_golden(stored, done.rows, g.kind)
        if differs is None:
            lines.append(f"{case.qid}: names {hit}; re-derived on the edit: same")
        else:
            rederived = done.rows[0] if g.kind == "scalar" and done.rows else done.rows[:20]
            suspects.append(
                {"qid": case.qid, "entity": hit, "stored": stored, "rederived": rederived}
            )
            lines.append(f"{case.qid}: names {hit}; re-derived on the edit: {differs}")
    audit = {
        "ran": True,
        "clean": not suspects,
        "model": model,
        "checked": checked,
        "tail": "\n".join(lines[-AUDIT_TAIL_LINES:]) or "no golden names a changed entity",
    }
    return suspects, audit
