"""The dogfood scorecard: did a skill make the agent reach for its tools, answer right, stay lean?

Computed from a run's ledger (its `attempt`, `tool_call` and `score` events), one row per attempt,
the way the GCTRL dogfood protocol (seed 000) scores a question:

- **calls**: every tool call the attempt made, whatever role the target's profile gives it (a
  `list_graphs` with no role is a call like any other).
- **trigger** (0/1): the attempt called a tool before answering; for a write-back case (tagged
  `write-back`), it wrote (a write call that did not fail).
- **correctness** (0/1/2): match 2, near_match 1, no_match 0. An attempt with no verdict
  (needs_human, a refused golden, a harness error) is *unscored*. A case whose golden kind is
  `unanswerable` asks for data the target lacks: it scores 0 whatever the answer, and an answer
  the judge scored `match` (it said "not on record") is *excused*: out of the hallucination
  rule, never out of the total (its 0 of 2 counts, as the seed's 15/20 bar counts it).
- **hallucination**: a zero that is not an honest miss: a no_match on an unanswerable case (it
  invented an answer) or a no_match with no successful query behind it (it answered without
  evidence). A no_match backed by a query is a plain wrong answer.
- **discipline** (0/1): at most `max_calls` calls and no bulk dump. A write-back case has one
  shape: exactly one discovery call (`list_graphs`) and then exactly one write, into an
  explicit `compilationId` (read from the attempt's transcript), and nothing else. A bulk dump
  is a context call that returned more than `max_context_results` entities, a query asking for
  more than `max_rows` rows (SQL `LIMIT n`, Malloy `limit: n` / `top: n`) or selecting `*`
  without a limit (SQL `SELECT *`, Malloy `select: *`), or a final query that returned more
  than `max_rows` rows (or was capped).

The golden kinds and tags come from the set the run's own `run.json` names (`setDir`, checked
against its `datasetSha`), never from where the run directory sits. Contaminated attempts are
out of the scorecard, as they are out of every aggregate.
"""

from __future__ import annotations

import json
import re
import statistics
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

WRITE_TAG = "write-back"
CORRECTNESS = {"match": 2, "near_match": 1, "no_match": 0}


@dataclass(frozen=True)
class Limits:
    """What counts as disciplined, and which tools write."""

    max_calls: int = 3
    max_context_results: int = 20
    max_rows: int = 100
    write_tools: str = r"(?:^|_)(store|create_extraction|ingest_file)$"
    """A regex over tool names; matches MCP-prefixed names such as `mcp__kb__store` too."""
    discovery_tools: str = r"(?:^|_)list_graphs$"
    """The call a write-back makes first, to find the compilation it writes into."""
    write_target_keys: tuple[str, ...] = ("compilationId", "compilation_id")
    """The write's argument that names the compilation explicitly."""


@dataclass(frozen=True)
class Thresholds:
    """The pass criteria; the defaults are the dogfood protocol's."""

    trigger_rate: float = 1.0
    """Share of attempts that must trigger: all of them (a single miss fails)."""
    median_calls: float = 3.0
    correctness: float = 0.75
    """Share of the correctness maximum (2 per scored attempt, excused ones included: the
    seed's total >= 15/20)."""
    discipline: float = 0.8
    hallucinations: int = 0
    unscored: int = 0


@dataclass(frozen=True)
class CaseFacts:
    """What the scorecard needs to know about a case beyond the ledger."""

    golden_kind: str | None = None
    write_back: bool = False


@dataclass(frozen=True)
class Row:
    """One attempt's scores."""

    qid: str
    sample: int | None
    tools: tuple[str, ...]
    trigger: bool
    verdict: str | None
    correctness: int | None
    """None when unscored (an excused attempt scores 0)."""
    excused: bool
    hallucination: bool
    discipline: bool
    notes: tuple[str, ...] = ()

    @property
    def label(self) -> str:
        """`qid`, or `qid[sN]` for a repeated sample."""
        return self.qid if self.sample is None else f"{self.qid}[s{self.sample}]"

    @property
    def calls(self) -> int:
        """How many target tool calls the attempt made."""
        return len(self.tools)


def bulk_dumps(tool_calls: list[Any], final_rows: int | None, limits: Limits) -> list[str]:
    """Why an attempt counts as a bulk dump (empty when it does not)."""
    found = []
    for event in tool_calls:
        count = (event.ranked_summary or {}).get("resultCount")
        if (
            event.role == "context"
            and isinstance(count, int)
            and count > limits.max_context_results
        ):
            found.append(f"{event.tool} returned {count} entities (> {limits.max_context_results})")
        if event.role == "query" and event.query:
            found.extend(_bulk_query(event.tool, event.query, limits))
    if final_rows is not None and final_rows > limits.max_rows:
        found.append(f"final query returned {final_rows} rows (> {limits.max_rows})")
    return found


# SQL `LIMIT n`, Malloy `limit: n` and `top: n`; SQL `SELECT *` / `t.*`, Malloy `select: *`.
_LIMITS = re.compile(r"\blimit\s+(\d+)|\b(?:limit|top)\s*:\s*(\d+)", re.IGNORECASE)
_STAR = re.compile(r"\bselect\s*:?\s*(?:[\w\"`]+\.)?\*", re.IGNORECASE)


def _bulk_query(tool: str, query: str, limits: Limits) -> list[str]:
    asked = [int(m[1] or m[2]) for m in _LIMITS.finditer(query)]
    if any(n > limits.max_rows for n in asked):
        return [f"{tool} asked for {max(asked)} rows (> {limits.max_rows})"]
    if not asked and _STAR.search(query):
        return [f"{tool} selected * without a limit"]
    return []


def write_back_shape(
    calls: list[Any], arguments: Mapping[int, tuple[str, Mapping[str, Any]]] | None, limits: Limits
) -> list[str]:
    """Why a write-back attempt misses the seed's shape (empty when it has it): exactly one
    discovery call, then exactly one write into an explicit compilationId, nothing else.
    `arguments` maps a call's `seq` to its input, from the transcript (None: not on record)."""
    discovery = [e for e in calls if re.search(limits.discovery_tools, e.tool)]
    writes = [e for e in calls if re.search(limits.write_tools, e.tool)]
    others = len(calls) - len(discovery) - len(writes)
    problems = []
    if (len(discovery), len(writes), others) != (1, 1, 0):
        problems.append(
            f"write-back made {len(discovery)} discovery, {len(writes)} write and {others} other "
            "call(s); the shape is one discovery then one write"
        )
    elif (discovery[0].seq or 0) > (writes[0].seq or 0):
        problems.append("write-back wrote before its discovery call")
    for write in writes[:1]:
        logged = None if arguments is None else arguments.get(write.seq or 0)
        # The transcript's log is the one the events were written from: same call, same name.
        given = logged[1] if logged is not None and logged[0] == write.tool else None
        if given is None:
            problems.append(f"{write.tool}'s arguments are not on record (no transcript)")
        elif not any(_names_target(given.get(k)) for k in limits.write_target_keys):
            problems.append(f"{write.tool} names no compilationId")
    return problems


def _names_target(value: Any) -> bool:
    """An explicit compilation id: a non-blank string or an integer (never a bool)."""
    if isinstance(value, str):
        return bool(value.strip())
    return isinstance(value, int) and not isinstance(value, bool)


def score_attempt(
    attempt: Any,
    tool_calls: list[Any],
    score: Any | None,
    facts: CaseFacts,
    limits: Limits,
    final_rows: int | None = None,
    arguments: Mapping[int, tuple[str, Mapping[str, Any]]] | None = None,
) -> Row:
    """Score one attempt from its ledger events (pure: no I/O). Every tool call counts, role
    or not; `arguments` (call seq -> input, from the transcript) shows where a write went."""
    calls = list(tool_calls)
    writes = [e for e in calls if re.search(limits.write_tools, e.tool) and not e.error]
    verdict = score.verdict if score is not None else None
    unanswerable = facts.golden_kind == "unanswerable"
    points = CORRECTNESS.get(verdict or "")
    excused = unanswerable and verdict == "match"
    correctness = 0 if unanswerable and points is not None else points
    evidence = any(e.role == "query" and not e.error for e in calls)
    hallucination = verdict == "no_match" and (unanswerable or not evidence)
    dumps = bulk_dumps(calls, final_rows, limits)
    if facts.write_back:
        trigger = bool(writes)
        misses = write_back_shape(calls, arguments, limits)
    else:
        trigger = bool(calls)
        misses = [] if len(calls) <= limits.max_calls else [f"{len(calls)} calls"]
    notes = [*dumps, *(misses if facts.write_back else [])]
    if attempt.error:
        notes.append(f"harness error: {attempt.error}")
    return Row(
        qid=attempt.qid,
        sample=attempt.sample,
        tools=tuple(e.tool for e in calls),
        trigger=trigger,
        verdict=verdict,
        correctness=correctness,
        excused=excused,
        hallucination=hallucination,
        discipline=not misses and not dumps,
        notes=tuple(notes),
    )


@dataclass
class Scorecard:
    """Every attempt's row, and the aggregates the gate reads."""

    rows: list[Row]
    excluded: list[str] = field(default_factory=list)
    """Attempts left out (contaminated), by label."""
    run_dir: Path | None = None
    set_problem: str | None = None
    """Why the run's set could not be read (then no case is known to be unanswerable or a
    write-back, and the gate fails rather than score without them)."""

    @classmethod
    def from_ledger(
        cls,
        run_dir: Path,
        *,
        cases: Mapping[str, CaseFacts] | None = None,
        limits: Limits | None = None,
    ) -> Scorecard:
        """Score a run directory; `cases` defaults to the facts of the set its `run.json`
        names (`run_case_facts`), wherever the run directory sits."""
        from pytest_evalloop.ledger.contract import attempt_key
        from pytest_evalloop.ledger.reader import read_run

        limits = limits or Limits()
        problem = None
        if cases is None:
            cases, problem = run_case_facts(run_dir)
        facts = cases
        ledger = read_run(run_dir)
        scores = ledger.scores()
        calls: dict[tuple[str, int | None], list[Any]] = {}
        for event in ledger.of_kind("tool_call"):
            calls.setdefault(attempt_key(event), []).append(event)
        card = cls(rows=[], run_dir=run_dir, set_problem=problem)
        # By case and sample, not ledger order (the order attempts finished in): one run,
        # or two runs of the same answers, print one table.
        for key, attempt in sorted(ledger.attempts().items(), key=_attempt_order):
            if attempt.contaminated is True:
                label = (
                    attempt.qid if attempt.sample is None else f"{attempt.qid}[s{attempt.sample}]"
                )
                card.excluded.append(label)
                continue
            case = facts.get(attempt.qid, CaseFacts())
            row = score_attempt(
                attempt,
                sorted(calls.get(key, []), key=lambda e: e.seq or 0),
                scores.get(key),
                case,
                limits,
                _final_rows(run_dir, attempt.prediction_path),
                _call_arguments(run_dir, attempt.transcript_path) if case.write_back else None,
            )
            card.rows.append(row)
        return card

    # --- aggregates ---------------------------------------------------------------------

    @property
    def triggered(self) -> int:
        """Attempts that triggered."""
        return sum(r.trigger for r in self.rows)

    @property
    def median_calls(self) -> float:
        """The median number of target tool calls per attempt (0 with no attempts)."""
        return float(statistics.median(r.calls for r in self.rows)) if self.rows else 0.0

    @property
    def correctness_total(self) -> int:
        """Correctness points earned over scored attempts."""
        return sum(r.correctness or 0 for r in self.rows)

    @property
    def correctness_max(self) -> int:
        """2 per scored attempt, excused ones included (excusal is from the hallucination rule,
        not from the total)."""
        return 2 * sum(r.correctness is not None for r in self.rows)

    @property
    def excused(self) -> int:
        """Attempts excused from the hallucination rule (said "not on record" for data the
        target lacks); each scores 0 of 2."""
        return sum(r.excused for r in self.rows)

    @property
    def disciplined(self) -> int:
        """Attempts that stayed within the call budget without a bulk dump."""
        return sum(r.discipline for r in self.rows)

    @property
    def hallucinations(self) -> list[Row]:
        """Attempts whose zero is a hallucination."""
        return [r for r in self.rows if r.hallucination]

    @property
    def unscored(self) -> list[Row]:
        """Attempts without a verdict that counts (excused ones are not unscored)."""
        return [r for r in self.rows if r.correctness is None and not r.excused]

    # --- the gate and the report --------------------------------------------------------

    def gate(self, thresholds: Thresholds | None = None) -> tuple[bool, list[str]]:
        """Apply the pass criteria; returns (passed, the reason for each criterion missed)."""
        t = thresholds or Thresholds()
        n = len(self.rows)
        if not n:
            return False, [f"no attempts to score in {self.run_dir}"]
        reasons = []
        if self.set_problem:
            reasons.append(self.set_problem)
        if self.triggered < t.trigger_rate * n:
            missed = ", ".join(r.label for r in self.rows if not r.trigger)
            reasons.append(f"trigger {self.triggered}/{n} is below {t.trigger_rate:.0%}: {missed}")
        if self.median_calls > t.median_calls:
            reasons.append(f"median tool calls {self.median_calls:g} is above {t.median_calls:g}")
        total, most = self.correctness_total, self.correctness_max
        if not most:
            reasons.append("correctness: no attempt has a verdict that scores")
        elif total < t.correctness * most:
            reasons.append(
                f"correctness {total}/{most} ({total / most:.0%}) is below {t.correctness:.0%}"
            )
        if len(self.hallucinations) > t.hallucinations:
            names = ", ".join(r.label for r in self.hallucinations)
            reasons.append(f"{len(self.hallucinations)} hallucinated zero(s): {names}")
        if self.disciplined < t.discipline * n:
            lax = ", ".join(r.label for r in self.rows if not r.discipline)
            reasons.append(f"discipline {self.disciplined}/{n} is below {t.discipline:.0%}: {lax}")
        if len(self.unscored) > t.unscored:
            names = ", ".join(r.label for r in self.unscored)
            reasons.append(
                f"{len(self.unscored)} attempt(s) unscored: {names}; every case needs a verdict"
            )
        return not reasons, reasons

    def lines(self) -> list[str]:
        """The table (case, tools, calls, trigger, correctness, discipline, notes) and totals."""
        width = max([len("case"), *(len(r.label) for r in self.rows)])
        out = [f"{'case':<{width}}  calls  trigger  correct  discipline  tools / notes"]
        for row in self.rows:
            correct = f"{row.correctness} exc" if row.excused else _points(row.correctness)
            detail = ", ".join(row.tools) or "-"
            if row.notes:
                detail += " | " + "; ".join(row.notes)
            out.append(
                f"{row.label:<{width}}  {row.calls:>5}  {int(row.trigger):>7}  {correct:>7}  "
                f"{int(row.discipline):>10}  {detail}"
            )
        out.append(self._totals())
        if self.set_problem:
            out.append(f"set: {self.set_problem}")
        if self.excluded:
            out.append(f"left out (contaminated): {', '.join(self.excluded)}")
        return out

    def _totals(self) -> str:
        n = len(self.rows)
        return (
            f"median calls {self.median_calls:g} | trigger {self.triggered}/{n} | "
            f"correctness {self.correctness_total}/{self.correctness_max}"
            f"{f' ({self.excused} excused)' if self.excused else ''} | "
            f"discipline {self.disciplined}/{n} | hallucinations {len(self.hallucinations)} | "
            f"unscored {len(self.unscored)}"
        )


def _attempt_order(item: tuple[tuple[str, int | None], Any]) -> tuple[str, int]:
    qid, sample = item[0]
    return qid, -1 if sample is None else sample


def _points(value: int | None) -> str:
    return "-" if value is None else str(value)


def _final_rows(run_dir: Path, prediction_path: str | None) -> int | None:
    """Rows the final query returned on re-execution; None when the artifact is missing."""
    if not prediction_path:
        return None
    try:
        data = json.loads((run_dir / prediction_path).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    rows = data.get("rows") if isinstance(data, dict) else None
    if not isinstance(rows, list):
        return None
    # A capped result returned at least one row more than it showed.
    return len(rows) + 1 if data.get("truncated") else len(rows)


def _call_arguments(
    run_dir: Path, transcript_path: str | None
) -> dict[int, tuple[str, dict[str, Any]]] | None:
    """Each tool call's input by its `seq`, from the attempt's transcript (its host-side tool
    log, the one the `tool_call` events were written from); None when it is not on record."""
    if not transcript_path:
        return None
    try:
        data = json.loads((run_dir / transcript_path).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    log = data.get("tool_log") if isinstance(data, dict) else None
    if not isinstance(log, list):
        return None
    return {
        seq: (str(use.get("tool")), dict(use["input"]))
        for seq, use in enumerate(log, start=1)
        if isinstance(use, dict) and isinstance(use.get("input"), dict)
    }


def run_case_facts(run_dir: Path) -> tuple[dict[str, CaseFacts], str | None]:
    """The case facts of the set the run's own `run.json` names (`setDir`), and why they could
    not be had (None when they could): no such record, no set there, or a set that changed
    since the run (`datasetSha`), whose kinds and tags may not be the ones it ran."""
    from pytest_evalloop.ledger.reader import read_run_info
    from pytest_evalloop.sets import cases as sets

    try:
        info = read_run_info(run_dir)
    except (OSError, ValueError) as exc:
        return {}, f"{run_dir / 'run.json'} cannot be read ({exc}): the run's set is unknown"
    if not info.set_dir:
        return {}, (
            f"{run_dir / 'run.json'} names no set (setDir): golden kinds and write-back tags "
            "are unknown; pass the cases (Scorecard.from_ledger(run_dir, cases=...))"
        )
    set_dir = Path(info.set_dir)
    if sets.find_set_dir(set_dir) is None:
        return {}, (
            f"the run's set {set_dir} (run.json setDir) holds no set.json and cases.jsonl: "
            "put the set back or pass the cases"
        )
    if info.dataset_sha and sets.dataset_sha(set_dir) != info.dataset_sha:
        return {}, (
            f"the set at {set_dir} changed since the run (datasetSha {info.dataset_sha} in "
            f"run.json, {sets.dataset_sha(set_dir)} now): its golden kinds and tags may not "
            "be the run's"
        )
    return load_case_facts(set_dir), None


def load_case_facts(set_dir: Path) -> dict[str, CaseFacts]:
    """Golden kind and write-back flag per qid of a set (empty when `set_dir` is not a set)."""
    from pytest_evalloop.sets import cases as sets

    if sets.find_set_dir(set_dir) is None:
        return {}
    facts = {}
    for _, case in sets.load_cases(set_dir).rows:
        kind = case.golden.kind if case.golden is not None else None
        facts[case.qid] = CaseFacts(golden_kind=kind, write_back=WRITE_TAG in case.tags)
    return facts


def terminal_section(
    terminalreporter: Any,
    run_dir: Path,
    *,
    thresholds: Thresholds | None = None,
    cases: Mapping[str, CaseFacts] | None = None,
    limits: Limits | None = None,
) -> bool:
    """Write the scorecard and its gate verdict to the terminal; returns whether it passed.

    Call it from `pytest_terminal_summary` with the run directory the session wrote.
    """
    card = Scorecard.from_ledger(run_dir, cases=cases, limits=limits)
    return write_card(terminalreporter, card, thresholds)


def write_card(
    terminalreporter: Any, card: Scorecard, thresholds: Thresholds | None = None
) -> bool:
    """Write one scored run's table and gate verdict; returns whether it passed."""
    passed, reasons = card.gate(thresholds)
    name = card.run_dir.name if card.run_dir is not None else "run"
    terminalreporter.write_sep("=", f"skill scorecard: {name}")
    for line in card.lines():
        terminalreporter.write_line(line)
    verdict = "PASSED" if passed else "FAILED"
    terminalreporter.write_line(f"scorecard gate: {verdict}", green=passed, red=not passed)
    for reason in reasons:
        terminalreporter.write_line(f"  - {reason}")
    return passed
