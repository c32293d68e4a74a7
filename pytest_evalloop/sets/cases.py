"""Eval sets on disk: `set.json`, `cases.jsonl` and `judge-regressions.jsonl` as pydantic models.

Loading is tolerant of what it does not know (real sets carry dozens of optional keys, which are
kept) and strict about what it does: every problem becomes a :class:`RowError` naming the file,
the line and what to do, and one bad row never hides the others.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Annotated, Any, Literal, Required

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError, field_validator
from typing_extensions import TypedDict

from pytest_evalloop.sets.names import QID_PATTERN as QID_PATTERN
from pytest_evalloop.sets.names import name_problem as name_problem
from pytest_evalloop.sets.names import qid_problem as qid_problem
from pytest_evalloop.sets.pin import CASES_FILE as CASES_FILE
from pytest_evalloop.sets.pin import REGRESSIONS_FILE as REGRESSIONS_FILE
from pytest_evalloop.sets.pin import SET_FILE as SET_FILE
from pytest_evalloop.sets.pin import dataset_sha as dataset_sha
from pytest_evalloop.sets.pin import find_set_dir as find_set_dir
from pytest_evalloop.sets.pin import golden_file as golden_file
from pytest_evalloop.sets.readback import CaseChanged, LineRef, line_digest, open_regular

GoldenStatus = Literal["verified", "provisional", "invalid", "ambiguous"]
GoldenKind = Literal["scalar", "rows", "unanswerable", "criteria"]


def question_sha(question: str) -> str:
    """First 16 hex characters of sha256 over the question's UTF-8 bytes (the seal)."""
    return hashlib.sha256(question.encode("utf-8")).hexdigest()[:16]


SEAL_MIN_HEX = 8
"""The shortest `questionSha` accepted as a seal: 2 hex characters would match one question in
256 by chance, 8 one in four billion. Up to the full 64 are accepted, in either case."""
_SEAL = re.compile(rf"[0-9a-f]{{{SEAL_MIN_HEX},64}}")


def seal_problem(question: str, stored: str) -> str | None:
    """Why a row's `questionSha` does not seal its question, or None when it does.

    The one rule every reader applies (collection, the report's rows, the goldens commands):
    a seal is 8 to 64 hex characters of sha256 over the question, compared case-insensitively
    as a prefix, so the 16 `question_sha` writes, the full hash and an upper-case copy all
    seal, and a 2-character stub does not.
    """
    full = hashlib.sha256(question.encode("utf-8")).hexdigest()
    text = stored.strip().lower()
    if not _SEAL.fullmatch(text):
        return (
            f"questionSha {stored!r} is not a seal: {SEAL_MIN_HEX} to 64 hex characters of the "
            f"question's sha256 (this question's first 16: {full[:16]})"
        )
    if not full.startswith(text):
        return (
            f"question edited after sealing: questionSha {stored!r} does not match the "
            f"question (sha {full[:16]})"
        )
    return None


def prediction_sha(prediction: Any) -> str:
    """First 16 hex of sha256 over the prediction as canonical (sorted-key) JSON."""
    text = json.dumps(prediction, sort_keys=True)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]


class _Open(BaseModel):
    """A model that keeps unknown keys, so a row written back loses nothing."""

    model_config = ConfigDict(extra="allow", populate_by_name=True)


class Alternate(_Open):
    """A second reading of the question, accepted or not."""

    assumption: str | None = None
    value: Any = None
    accept: bool | None = None


class Verification(_Open):
    """How the golden was confirmed by a second, differently shaped derivation."""

    primary_axis: str | None = Field(default=None, alias="primaryAxis")
    varies_axis: str | None = Field(default=None, alias="variesAxis")
    note: str | None = None
    second_query: str | None = Field(default=None, alias="secondQuery")


class Golden(_Open):
    """The verified answer of a case, and how to judge against it."""

    status: GoldenStatus | None = None
    kind: GoldenKind
    value: Any = None
    path: str | None = None
    rubric: str | None = None
    must_state: list[str] = Field(default_factory=list, alias="mustState")
    must_not_use: list[str] = Field(default_factory=list, alias="mustNotUse")
    alternates: list[Alternate] = Field(default_factory=list)
    canonical_query: str | None = Field(default=None, alias="canonicalQuery")
    verified_by: str | None = Field(default=None, alias="verifiedBy")
    verification: Verification | None = None


class GoldenArtifactError(ValueError):
    """A golden's `path` artifact that cannot be read as a JSON value (names file and fix)."""


def golden_value(set_dir: Path, golden: Golden | dict[str, Any] | None) -> Any:
    """The value a golden holds: its inline `value`, else the JSON artifact at its `path`.

    The one reader of a golden's value: verification, promotion, the judge's materials and the
    reports all call it, so a golden stored either way means the same thing everywhere. The
    path is relative to the set directory. None when the golden holds neither.
    """
    if golden is None:
        return None
    if isinstance(golden, Golden):
        value, path = golden.value, golden.path
    else:
        value, path = golden.get("value"), golden.get("path")
    if value is not None or not path:
        return value
    try:
        # Collection refuses such a row already; this holds for every other reader too.
        artifact = golden_file(Path(set_dir), str(path))
    except ValueError as exc:
        raise GoldenArtifactError(
            f"{Path(set_dir) / str(path)}: golden.path {path!r} is not inside the set: {exc}; "
            f"keep gold artifacts inside {set_dir}"
        ) from exc
    try:
        return json.loads(artifact.read_text(encoding="utf-8"))
    except FileNotFoundError as exc:
        raise GoldenArtifactError(
            f"{artifact}: golden.path {path!r} names no file; write the rows there or fix the path"
        ) from exc
    except (OSError, UnicodeDecodeError) as exc:
        raise GoldenArtifactError(
            f"{artifact}: golden.path {path!r} cannot be read: {exc}"
        ) from exc
    except json.JSONDecodeError as exc:
        raise GoldenArtifactError(
            f"{artifact}:{exc.lineno}: golden.path {path!r} is not JSON "
            f"({json_error_text(exc, with_line=True)}); a rows golden artifact is a JSON list of "
            "row objects"
        ) from exc


class ExpectedEntities(_Open):
    """Entity ids (`kind:source:name`) the answer depends on."""

    required: list[str] = Field(default_factory=list)
    required_any_of: list[list[str]] = Field(default_factory=list, alias="requiredAnyOf")
    acceptable: list[str] = Field(default_factory=list)


class Case(_Open):
    """One row of `cases.jsonl`."""

    qid: str = Field(min_length=1)
    question: str = Field(min_length=1)
    split: Literal["dev", "holdout"]
    state: Literal["candidate", "selected", "excluded"] = "selected"
    tags: list[str] = Field(default_factory=list)
    golden: Golden | None = None
    golden_revision: int | None = Field(default=None, alias="goldenRevision")
    question_sha: str | None = Field(default=None, alias="questionSha")
    coverage: str | None = None
    expected_entities: ExpectedEntities | None = Field(default=None, alias="expectedEntities")
    model_query: str | None = Field(default=None, alias="modelQuery")

    @field_validator("qid")
    @classmethod
    def _qid_pattern(cls, qid: str) -> str:
        problem = qid_problem(qid)
        if problem is not None:
            raise ValueError(problem)
        return qid

    def raw(self) -> dict[str, Any]:
        """The row as JSON, with its original key names and every unknown key."""
        return self.model_dump(mode="json", by_alias=True, exclude_unset=True)


class SetConfig(_Open):
    """`set.json`: what the set is, and (for our own sets) which target serves it."""

    name: str = Field(min_length=1)
    description: str | None = None
    dataset_version: int | None = Field(default=None, alias="datasetVersion")
    target: dict[str, Any] | None = None
    publisher: dict[str, Any] | None = None


class RegressionFixture(_Open):
    """One row of `judge-regressions.jsonl`: a verdict a human settled."""

    fixture_id: str = Field(alias="fixtureId")
    qid: str
    verdict: Literal["match", "near_match", "no_match", "needs_human"]
    why: str | None = None
    settled_by: str | None = Field(default=None, alias="settledBy")
    golden_revision: int | None = Field(default=None, alias="goldenRevision")
    prediction_sha: str | None = Field(default=None, alias="predictionSha")
    prediction: dict[str, Any]
    run_id: str | None = Field(default=None, alias="runId")
    sample: int | None = None
    rulings: list[dict[str, str]] | None = None
    """Each person's current ruling on the attempt when this fixture was filed (`review`)."""
    people_disagree: bool = Field(default=False, alias="peopleDisagree")
    """People disagree on the attempt: shown, out of kappa, until one more review settles it."""


class VoidRecord(_Open):
    """A line of `judge-regressions.jsonl` that voids an earlier fixture (append-only: the
    fixture stays, this line says it no longer counts, e.g. a later review superseded it)."""

    void: str = Field(min_length=1)
    why: str | None = None
    superseded_by: str | None = Field(default=None, alias="supersededBy")


FIX_ROW = "Fix this row and run again."
FIX_OR_EXCLUDE = 'Fix this row (or set its "state" to "excluded") and run again.'


@dataclass(frozen=True)
class RowError:
    """One problem with one line of a set file, and what fixes it (`hint`)."""

    path: Path
    line: int | None
    message: str
    hint: str = FIX_ROW

    def __str__(self) -> str:
        where = f"{self.path}:{self.line}" if self.line is not None else str(self.path)
        return f"{where}: {self.message}"


@dataclass
class Loaded:
    """Rows that loaded, with their line numbers, and the errors of those that did not."""

    rows: list[tuple[int, Any]] = field(default_factory=list)
    errors: list[RowError] = field(default_factory=list)
    voided: list[tuple[int, Any]] = field(default_factory=list)
    """`judge-regressions.jsonl` only: the fixtures a later void line voided (out of `rows`)."""
    lines: dict[int, LineRef] = field(default_factory=dict)
    """`cases.jsonl` only: where each loaded row's line is and what it held, by line number, so
    an item can let its row go and read the same row back (:func:`case_at`)."""


class SetError(Exception):
    """A set that cannot be used at all (missing or unreadable `set.json`)."""


def json_error_text(exc: json.JSONDecodeError, *, with_line: bool = False) -> str:
    """The whole of a JSON error: what, where (column, and line when asked) and the character.

    `JSONDecodeError.msg` alone is cut off ("Invalid control character at"); its position is
    kept in separate fields, so they are put back together here.
    """
    what = exc.msg if exc.msg.endswith(" at") else f"{exc.msg} at"
    where = f"line {exc.lineno}, column {exc.colno}" if with_line else f"column {exc.colno}"
    found = exc.doc[exc.pos : exc.pos + 1]
    shown = f" (found {found!r})" if found else " (found the end of the text)"
    return f"invalid JSON: {what} {where}{shown}"


def utf8_error_text(exc: UnicodeDecodeError, *, line_start: int = 0) -> str:
    """Where a text is not UTF-8: the byte offset (1-based, within the line) and the bytes."""
    bad = exc.object[exc.start : exc.end]
    return (
        f"not valid UTF-8 at byte {exc.start - line_start + 1} ({bytes(bad)!r}); save the file "
        "as UTF-8"
    )


def load_set_config(set_dir: Path) -> SetConfig:
    """Parse `set.json`, raising :class:`SetError` with the file and the fix."""
    path = set_dir / SET_FILE
    try:
        raw = path.read_bytes()
    except FileNotFoundError as exc:
        raise SetError(missing_set_file_text(set_dir)) from exc
    try:
        data = json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as exc:
        line = raw.count(b"\n", 0, exc.start) + 1
        start = raw.rfind(b"\n", 0, exc.start) + 1
        raise SetError(f"{path}:{line}: {utf8_error_text(exc, line_start=start)}") from exc
    except json.JSONDecodeError as exc:
        raise SetError(f"{path}:{exc.lineno}: {json_error_text(exc, with_line=True)}") from exc
    if not isinstance(data, dict):
        raise SetError(f"{path}: must hold a JSON object, got {type(data).__name__}")
    try:
        return SetConfig.model_validate(data)
    except ValidationError as exc:
        raise SetError(f"{path}: {_pydantic_text(exc)}") from exc


def missing_set_file_text(set_dir: Path) -> str:
    """The error for a set directory (one holding cases.jsonl) that has no set.json."""
    return (
        f"{set_dir / SET_FILE}: missing: {set_dir} holds {CASES_FILE} but no {SET_FILE}, so "
        f'it is not a usable set; add {SET_FILE} (at least {{"name": "<set name>"}}) beside '
        f"{CASES_FILE}"
    )


def _pydantic_text(exc: ValidationError) -> str:
    parts = []
    for err in exc.errors():
        loc = ".".join(str(p) for p in err["loc"]) or "(row)"
        parts.append(f"field {loc!r}: {err['msg']} (got {err.get('input')!r:.80})")
    return "schema error: " + "; ".join(parts)


def _json_lines(
    path: Path, errors: list[RowError], refs: dict[int, LineRef] | None = None
) -> Iterator[tuple[int, str]]:
    # Bytes, decoded line by line: a line that is not UTF-8 is one error, and the lines after
    # it still load (text mode would stop the whole file at the first bad byte).
    offset = 0
    with open_regular(path) as handle:
        for lineno, raw in enumerate(handle, start=1):
            if refs is not None:
                refs[lineno] = LineRef(offset, line_digest(raw))
            offset += len(raw)
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                errors.append(
                    RowError(path, lineno, utf8_error_text(exc), "Fix this line and run again.")
                )
                continue
            if line.strip():
                yield lineno, line


def load_cases(set_dir: Path) -> Loaded:
    """Load every row of `cases.jsonl`, collecting all errors rather than stopping at one.

    Checks: UTF-8, JSON, schema (the qid pattern included), duplicate qid (both lines named),
    that `golden.path` stays inside the set, and, for rows not excluded, the question seal and
    that the `golden.path` artifact exists. Each error carries the hint that fixes it: setting
    `state` to `excluded` is offered only where it does.
    """
    loaded = Loaded()
    for lineno, case, ref in iter_cases(set_dir, loaded.errors):
        loaded.rows.append((lineno, case))
        loaded.lines[lineno] = ref
    return loaded


def iter_cases(set_dir: Path, errors: list[RowError]) -> Iterator[tuple[int, Case, LineRef]]:
    """The rows :func:`load_cases` loads, one at a time and by the same checks (their errors
    into `errors`): for a reader that needs a figure of every row, not every row at once (a
    10,000-case set's rows are 80 MB parsed)."""
    path = set_dir / CASES_FILE
    first_line: dict[str, int] = {}
    refs: dict[int, LineRef] = {}
    for lineno, line in _json_lines(path, errors, refs):
        ref = refs.pop(lineno)
        case = _parse_row(path, lineno, line, Case, errors)
        if case is None:
            continue
        problems = list(_case_problems(set_dir, case, first_line))
        first_line.setdefault(case.qid, lineno)
        if problems:
            errors.extend(RowError(path, lineno, p, hint) for p, hint in problems)
            continue
        yield lineno, case, ref


def case_at(path: Path, ref: LineRef, lineno: int, qid: str) -> Case:
    """Case `qid` of `cases.jsonl` at `path`, read back from the very line it was collected
    from: at `ref.offset` when the line is still there, else wherever the file now holds a line
    of the same bytes (rows inserted or moved above it). A run answers the rows it collected;
    a row edited or removed since is :class:`CaseChanged`, never another row read in its place.
    """
    try:
        with open_regular(path) as handle:
            handle.seek(ref.offset)
            line = handle.readline()
            if line_digest(line) != ref.digest:
                handle.seek(0)
                line = next((raw for raw in handle if line_digest(raw) == ref.digest), b"")
    except OSError as exc:
        raise CaseChanged(
            f"{path}: case {qid} (line {lineno} when collected) cannot be read back: "
            f"{exc.strerror or exc}; put the file back and run again"
        ) from None
    if not line:
        raise CaseChanged(
            f"{path}: case {qid} (line {lineno} when collected) was changed or removed during "
            "the session; a run answers the rows it collected: run again to answer the file "
            "as it is now"
        )
    return Case.model_validate_json(line)


class ShownGolden(TypedDict, total=False):
    """The keys of a row's golden that a report shows (as the file spells them)."""

    status: GoldenStatus | None
    kind: Required[GoldenKind]
    value: Any
    path: str | None
    rubric: str | None
    mustState: list[str]


class ShownCase(TypedDict, total=False):
    """The keys of a `cases.jsonl` row that a report shows (:func:`shown_cases`)."""

    qid: Required[Annotated[str, Field(min_length=1)]]
    question: Required[Annotated[str, Field(min_length=1)]]
    split: Required[Literal["dev", "holdout"]]
    state: Literal["candidate", "selected", "excluded"]
    questionSha: str | None
    tags: list[str]
    coverage: str | None
    golden: ShownGolden | None


@cache
def _shown_adapter() -> TypeAdapter[ShownCase]:
    return TypeAdapter(ShownCase)


def shown_cases(set_dir: Path) -> dict[str, ShownCase]:
    """The rows of `cases.jsonl` by qid, as a report shows them: just the keys it shows.

    Validated by pydantic from each line's bytes, but into a dict of those keys rather than a
    :class:`Case` (whose nested models cost three times the parse: half a second over 10,000
    rows, each time a report is written). A row that does not parse into that shape, a qid's
    later rows, and a row whose question no longer matches its seal are left out, as
    :func:`load_cases` leaves them out; its other checks (qid pattern, golden artifacts) guard
    a run, and a report only shows the text. Raises OSError when the file cannot be read.
    """
    path = set_dir / CASES_FILE
    adapter = _shown_adapter()
    out: dict[str, ShownCase] = {}
    seen: set[str] = set()
    for _, line in _json_lines(path, []):
        try:
            row = adapter.validate_json(line)
        except ValidationError:
            continue
        qid = row["qid"]
        if qid in seen:
            continue
        seen.add(qid)
        stored = row.get("questionSha")
        if stored is not None and row.get("state") != "excluded":
            if seal_problem(row["question"], stored) is not None:
                continue
        out[qid] = row
    return out


def _parse_row(
    path: Path, lineno: int, line: str, model: type[BaseModel], errors: list[RowError]
) -> Any:
    try:
        # The fast path: pydantic parses the bytes itself (most rows are good).
        return model.model_validate_json(line)
    except ValidationError:
        pass  # parse again below, to say exactly what is wrong
    try:
        data = json.loads(line)
    except json.JSONDecodeError as exc:
        errors.append(RowError(path, lineno, json_error_text(exc)))
        return None
    if not isinstance(data, dict):
        errors.append(RowError(path, lineno, f"a row must be a JSON object, got {data!r:.60}"))
        return None
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        qid = data.get("qid") or data.get("fixtureId")
        label = f"row {qid!r}: " if qid else ""
        errors.append(RowError(path, lineno, label + _pydantic_text(exc)))
        return None


def _case_problems(
    set_dir: Path, case: Case, first_line: dict[str, int]
) -> Iterable[tuple[str, str]]:
    # An excluded row is never collected, judged or read for its golden, so the checks that
    # only protect a run (the seal, the artifact being there) skip it, and excluding the row
    # is a true fix for them. A duplicate qid or a golden path out of the set is wrong in any
    # row: qids are one namespace for the whole file (runs, goldens commands), and a path out
    # of the set is never a golden.
    if case.qid in first_line:
        yield (
            f"duplicate qid {case.qid!r}: already defined on line {first_line[case.qid]}",
            "Give one of the two rows a new qid (qids are unique in the file, excluded rows "
            "included) and run again.",
        )
    golden_path = case.golden.path if case.golden is not None else None
    artifact = None
    if golden_path:
        try:
            artifact = golden_file(set_dir, golden_path)
        except ValueError as exc:
            yield (
                f"row {case.qid!r}: golden.path {golden_path!r} is not inside the set: {exc}",
                f"Keep gold artifacts inside {set_dir} and give golden.path relative to it "
                "(e.g. gold/<qid>.json), then run again.",
            )
    if case.state == "excluded":
        return
    if case.question_sha is not None:
        problem = seal_problem(case.question, case.question_sha)
        if problem is not None:
            fix = (
                "restore the question, or add it as a new case with a new qid"
                if problem.startswith("question edited")
                else f"write its first 16 ({question_sha(case.question)}) or the full hash"
            )
            yield (f"row {case.qid!r}: {problem}; {fix}", FIX_OR_EXCLUDE)
    if artifact is not None and not artifact.is_file():
        yield (
            f"row {case.qid!r}: golden artifact missing: golden.path {golden_path!r} "
            f"(looked for {set_dir / str(golden_path)})",
            FIX_OR_EXCLUDE,
        )


def load_regressions(set_dir: Path) -> Loaded:
    """Load `judge-regressions.jsonl`, checking each fixture's `predictionSha` seal; a void line
    (`{"void": <fixtureId>}`) moves its fixture from `rows` to `voided`."""
    path = set_dir / REGRESSIONS_FILE
    loaded = Loaded()
    if not path.is_file():
        return loaded
    seen: dict[str, int] = {}
    voids: list[tuple[int, VoidRecord]] = []
    for lineno, line in _json_lines(path, loaded.errors):
        if '"void"' in line and '"fixtureId"' not in line:
            void = _parse_row(path, lineno, line, VoidRecord, loaded.errors)
            if void is not None:
                voids.append((lineno, void))
            continue
        row = _parse_row(path, lineno, line, RegressionFixture, loaded.errors)
        if row is None:
            continue
        if row.fixture_id in seen:
            msg = f"duplicate fixtureId {row.fixture_id!r}: already on line {seen[row.fixture_id]}"
            loaded.errors.append(RowError(path, lineno, msg))
            continue
        seen[row.fixture_id] = lineno
        if row.prediction_sha and prediction_sha(row.prediction) != row.prediction_sha:
            msg = (
                f"fixture {row.fixture_id!r}: prediction edited after sealing: predictionSha "
                f"{row.prediction_sha!r} != {prediction_sha(row.prediction)!r}"
            )
            loaded.errors.append(RowError(path, lineno, msg))
            continue
        loaded.rows.append((lineno, row))
    _apply_voids(path, loaded, voids)
    return loaded


def _apply_voids(path: Path, loaded: Loaded, voids: list[tuple[int, VoidRecord]]) -> None:
    at = {row.fixture_id: i for i, (_, row) in enumerate(loaded.rows)}
    lines = {row.fixture_id: lineno for lineno, row in loaded.rows}
    gone: set[str] = set()
    for lineno, void in voids:
        if void.void not in at or lines[void.void] > lineno:
            msg = f"void of {void.void!r}: no fixture with that fixtureId precedes this line"
            loaded.errors.append(RowError(path, lineno, msg, "Remove this line and run again."))
            continue
        gone.add(void.void)
    loaded.voided = [r for r in loaded.rows if r[1].fixture_id in gone]
    loaded.rows = [r for r in loaded.rows if r[1].fixture_id not in gone]
