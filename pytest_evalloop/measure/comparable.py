"""What a decision may compare: one rule, in one place, for every path that decides.

A gate turns two runs into "accepted". That is only honest when both runs are whole measurements
of the set, made independently, under one design. Every path that decides or offers a
comparison (the in-run gate, `evalloop gate`, `evalloop flips --gate`, `accept`, `loop`,
`--calibration`, the runs index and history, the estimate) asks this module, through
:func:`refusals` (a pair, with a second post arm in targeted mode) or :func:`alone` (one run
that would serve as a baseline or a history point), and each reason comes back as a
:class:`Refusal` naming the run, the rule and what to do.

The rules (docs/measurement.md, "What a gate compares", is this table: :data:`RULES`):

- **finished**: the run's status is `complete`: not running, interrupted, aborted or invalid.
- **whole**: its selection is the whole split. Every narrowing (`-k`, `-m`, `--lf`, `--sw`,
  `--deselect`, node ids, an `-x`/`--maxfail` stop, Ctrl-C) is recorded in run.json
  `selection`, and when the run closes `selection.whole` says whether every case of the split
  was attempted (:func:`selection_record`). Cases the golden gate keeps out (a golden not
  verified) are left out of both runs alike and do not break it.
- **not a shard**: one shard of a sharded run is a hash-chosen subset (`shardrule`).
- **sealed**: the run is as it closed (`ledger.seal`): no event, artifact or pin changed since.
- **one model**: one served model (and one answerer and judge model) over the whole run.
- **independent** (pairs): two sessions (`sessionId`), whose answers were made separately: a
  rejudge pair (one rejudges the other, or both rejudge one source) measures the judge's noise,
  never a change; byte-identical answers are one run copied.
- **same design** (pairs): samples, judge samples, split, max turns, max tokens and the
  attempt timeout agree.

What can be known before the first request (a baseline's status, selection, seal, design; this
session's own narrowing flags) is refused then, as a usage error (`flagcheck`); the rest at the
end, with EXIT_HARNESS_FAILURE.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from pytest_evalloop.ledger.contract import RunInfo
from pytest_evalloop.ledger.reader import RunLedger

DESIGN_KEYS: tuple[tuple[str, str], ...] = (
    ("split", "--eval-split"),
    ("samples", "--eval-samples"),
    ("judgeSamples", "--eval-judge-samples"),
    ("maxTurns", "--eval-max-turns"),
    ("maxTokens", "--eval-max-tokens"),
    ("attemptTimeout", "--eval-attempt-timeout"),
)
"""The design two compared runs must share: run.json `selection` key, the option."""
MIXED_PINS = ("modelSha", "answererModel", "judgeModel")
"""Pins a run records as "mixed: a, b" when it served more than one over its attempts."""

RULES: tuple[tuple[str, str, str], ...] = (
    (
        "finished",
        "a run's status is not `complete` (running, interrupted by Ctrl-C or an -x/--maxfail "
        "stop, aborted, invalid)",
        "finish it (`--eval-resume=<run>`) or run it again",
    ),
    (
        "whole",
        "a run's selection is not the whole split: -k, -m, --lf, --sw, --deselect, node ids, a "
        "stop, or a resume that left cases out (`selection.whole` false or not recorded)",
        "run the whole split (drop the narrowing flags); name targets with --eval-targets "
        "instead of selecting them",
    ),
    (
        "shard",
        "a run is one shard of a sharded run (`--eval-shard=I/N`, N > 1)",
        "merge the shards (`evalloop merge`) and gate the merged run",
    ),
    (
        "sealed",
        "a run changed after it closed (an event line, an artifact or a run.json pin), or "
        "carries no seal",
        "run it again; a ledger is evidence only as it was written",
    ),
    (
        "one model",
        "a run served more than one model (`modelSha`, `answererModel` or `judgeModel` is "
        '"mixed: ...")',
        "run it again on one model",
    ),
    (
        "independent",
        "the two runs are one session (`sessionId`), or their answers were made once (a "
        "rejudge and its source, two rejudges of one run, a copied run)",
        "run an independent arm; measure judge noise with `evalloop noise`",
    ),
    (
        "measured",
        "the baseline measured nothing: most of its attempts were not submitted, or none was "
        "decided (its summary's `WARNING: this run measured nothing`); a current run that "
        "measured nothing is still gated (doing less never passes) and exits 15",
        "fix the cause its WARNING names and run the baseline again",
    ),
    (
        "same design",
        "the runs differ in samples, judge samples, split, max turns, max tokens or the "
        "attempt timeout",
        "run both under the same option (it is named)",
    ),
)
"""One row per rule: its name, when it refuses, what to do."""
_FIX = {name: fix for name, _when, fix in RULES}


class _Model(BaseModel):
    model_config = ConfigDict(defer_build=True)


class Refusal(_Model):
    """One reason a comparison cannot carry a decision."""

    rule: str
    """A rule of :data:`RULES`."""
    why: str
    """What was found, naming the run."""

    @property
    def text(self) -> str:
        """`<why> [<rule>: <fix>]`, one line."""
        return f"{self.why} [{self.rule}: {_FIX[self.rule]}]"


class RunFacts(_Model):
    """What the rule reads of one run (`facts_of`)."""

    name: str
    run_id: str
    status: str | None = None
    abort_reason: str | None = None
    session_id: str | None = None
    answers_from: str | None = None
    rejudge_of: str | None = None
    selection: dict[str, Any] = Field(default_factory=dict)
    shard: dict[str, Any] | None = None
    mixed: dict[str, str] = Field(default_factory=dict)
    """Pins of :data:`MIXED_PINS` whose value says several were served."""
    seal: str | None = "unsealed"
    """None when the run is as it was sealed; else what breaks it (or "unsealed")."""
    attempted: int | None = None
    """Cases of the ledger with every sample attempted (None: facts from run.json alone)."""
    unmeasured: str | None = None
    """Why the run measured nothing (`measure.unmeasured`); None: it measured, or not read."""
    answers: frozenset[str] = frozenset()
    """Each attempt's `answer_id` (for an attempt written before ids: its qid, sample, time,
    query and wall seconds): one held by two runs is one answer counted twice."""

    @property
    def answer_origin(self) -> str | None:
        """The session whose answerer made this run's answers."""
        return self.answers_from or self.session_id


def facts_of(
    ledger: RunLedger, seal_problem: str | None, unmeasured: str | None = None
) -> RunFacts:
    """The facts of a read run (`seal_problem`: `seal.verify`'s finding, "unsealed", or None;
    `unmeasured`: why it measured nothing, when the caller counted it)."""
    info = ledger.info
    if info is None:
        raise ValueError(f"{ledger.run_dir}: no readable run.json")
    answers = frozenset(
        a.answer_id or f"{a.qid}|{a.sample}|{a.at}|{a.final_query}|{a.wall_seconds}"
        for a in ledger.attempts().values()
        if a.answer_id is not None or a.at is not None
    )
    per_case: dict[str, int] = {}
    for qid, _sample in ledger.attempts():
        per_case[qid] = per_case.get(qid, 0) + 1
    samples = int((info.selection or {}).get("samples") or 1)
    attempted = sum(1 for n in per_case.values() if n >= samples)
    return facts_from_info(info, seal_problem, answers, attempted, unmeasured)


def facts_from_info(
    info: RunInfo,
    seal_problem: str | None,
    answers: frozenset[str] = frozenset(),
    attempted: int | None = None,
    unmeasured: str | None = None,
) -> RunFacts:
    """The facts run.json alone gives (no answer fingerprints unless `answers` is given): enough
    for `alone`, which never reads the events."""
    data = info.model_dump(by_alias=True)
    mixed = {
        pin: str(data[pin])
        for pin in MIXED_PINS
        if isinstance(data.get(pin), str) and str(data[pin]).startswith("mixed:")
    }
    return RunFacts(
        name=info.label or info.run_id,
        run_id=info.run_id,
        status=info.status,
        abort_reason=info.abort_reason,
        session_id=info.session_id,
        answers_from=info.answers_from,
        rejudge_of=info.rejudge_of,
        selection=dict(info.selection or {}),
        shard=info.shard,
        mixed=mixed,
        seal=seal_problem,
        answers=answers,
        attempted=attempted,
        unmeasured=unmeasured,
    )


# --- one run --------------------------------------------------------------------------------


def alone(run: RunFacts, side: str) -> list[Refusal]:
    """Why one run cannot serve a decision (as `side`: baseline, current, second post arm)."""
    who = f"the {side} run {run.name}" if side else f"run {run.name}"
    found: list[Refusal] = []
    if run.status != "complete":
        how = {
            "running": "is still running (or was killed: its run.json says running)",
            "interrupted": "was interrupted before every case was answered",
            "aborted": f"aborted ({run.abort_reason or 'no reason recorded'})",
            "invalid": "closed with a ledger that does not validate",
        }.get(run.status or "", f"has status {run.status!r}")
        found.append(Refusal(rule="finished", why=f"{who} {how}"))
    whole = whole_problem(run.selection)
    recorded = run.selection.get("attempted")
    if whole is None and run.attempted is not None and recorded != run.attempted:
        # A record that claims more than the ledger holds is no record of this ledger.
        whole = f"records {recorded} cases attempted, but its ledger holds {run.attempted}"
    if whole is not None:
        found.append(Refusal(rule="whole", why=f"{who} {whole}"))
    if run.unmeasured and side == "baseline":
        found.append(Refusal(rule="measured", why=f"{who} measured nothing: {run.unmeasured}"))
    shard = run.shard or {}
    if int(shard.get("count") or 1) > 1:
        found.append(
            Refusal(
                rule="shard",
                why=f"{who} is shard {shard.get('index')}/{shard.get('count')} of a sharded run: "
                "a hash-chosen subset the bar was not set for",
            )
        )
    if run.seal is not None:
        what = (
            "carries no seal or no chain (closed before seals existed, or they were removed)"
            if run.seal == "unsealed"
            else f"changed after it closed: {run.seal}"
        )
        found.append(Refusal(rule="sealed", why=f"{who} {what}"))
    for pin, value in run.mixed.items():
        found.append(Refusal(rule="one model", why=f"{who} served more than one: {pin} {value}"))
    return found


def whole_problem(selection: Mapping[str, Any]) -> str | None:
    """Why a run's recorded selection is not the whole split, or None when it is."""
    if selection.get("whole") is True:
        return None
    if "whole" not in selection:
        return (
            "recorded no whole-split check (run.json `selection.whole`): its selection is unknown"
        )
    left = selection.get("leftOut") or {}
    parts = [
        f"{entry.get('count')} {reason}"
        for reason, entry in left.items()
        if isinstance(entry, dict) and not entry.get("allowed")
    ]
    cases = selection.get("cases")
    attempted = selection.get("attempted")
    head = (
        f"attempted {attempted} of the split's {cases} cases"
        if cases is not None
        else "is not the whole split"
    )
    return head + (f"; left out: {'; '.join(parts)}" if parts else "")


# --- two runs -------------------------------------------------------------------------------


def refusals(
    baseline: RunFacts, current: RunFacts, second: RunFacts | None = None
) -> list[Refusal]:
    """Why this comparison (with a second post arm in targeted mode) cannot carry a decision;
    empty when it can. Each run alone, then each pair of them."""
    arms = [("baseline", baseline), ("current", current)]
    if second is not None:
        arms.append(("second post arm", second))
    found = [r for side, run in arms for r in alone(run, side)]
    for i, (side_a, a) in enumerate(arms):
        for side_b, b in arms[i + 1 :]:
            found += _pair(side_a, a, side_b, b)
    return found


def _pair(side_a: str, a: RunFacts, side_b: str, b: RunFacts) -> list[Refusal]:
    found: list[Refusal] = []
    both = f"the {side_a} run {a.name} and the {side_b} run {b.name}"
    if a.session_id is None or b.session_id is None:
        found.append(Refusal(rule="independent", why=f"{both}: a session id is not recorded"))
    elif a.session_id == b.session_id:
        found.append(
            Refusal(
                rule="independent",
                why=f"{both} are one session ({a.session_id[:12]}): one run, or a copy of it",
            )
        )
    elif a.answer_origin == b.answer_origin or a.run_id == b.rejudge_of or b.run_id == a.rejudge_of:
        how = (
            f"{b.name} rejudges {a.name}"
            if b.rejudge_of == a.run_id
            else f"{a.name} rejudges {b.name}"
            if a.rejudge_of == b.run_id
            else "both judge answers one session made"
        )
        found.append(
            Refusal(
                rule="independent",
                why=f"{both} share their answers ({how}): a rejudge pair measures the judge's "
                "noise, not a change",
            )
        )
    shared = len(a.answers & b.answers)
    if shared and not any(r.rule == "independent" for r in found):
        found.append(
            Refusal(
                rule="independent",
                why=f"{both} hold {shared} of the same answers (a rejudge of one, a merge or a "
                "copy of its answers): one measurement counted twice",
            )
        )
    found += design_refusals(a.selection, b.selection, f"{side_a} {a.name}", f"{side_b} {b.name}")
    return found


def design_refusals(
    a: Mapping[str, Any], b: Mapping[str, Any], name_a: str, name_b: str
) -> list[Refusal]:
    """The design options two runs' selections differ in (a key one of them lacks differs)."""
    found = []
    for key, option in DESIGN_KEYS:
        if a.get(key) != b.get(key):
            found.append(
                Refusal(
                    rule="same design",
                    why=f"{option} differs: the {name_a} has {_shown(a.get(key))}, the "
                    f"{name_b} {_shown(b.get(key))}",
                )
            )
    return found


def _shown(value: Any) -> str:
    return "it unrecorded" if value is None else repr(value)


def texts(found: Iterable[Refusal]) -> list[str]:
    """Each refusal's line, in order, without repeats."""
    return list(dict.fromkeys(r.text for r in found))


# --- what a run covered of its split --------------------------------------------------------


GOLDEN_PREFIX = "golden not scorable: "
"""A left-out reason the golden gate gave: the same in both runs of one dataset, so it never
breaks a run's wholeness."""


NEVER_RUN = "not run: answered ahead of its turn, then never run by pytest"
"""A case the look-ahead answered and pytest then did not run (a mark a hook added later, an
item dropped from the session): its verdict is in the ledger, and is no whole run's."""


def selection_record(
    expected: Mapping[str, str | None],
    attempted: Mapping[str, int],
    *,
    samples: int,
    answers_unscorable: bool,
    status: str,
    stopped: str | None,
    narrowed_by: list[str],
    rejudge: bool,
    selected: Collection[str] | None = None,
    never_run: Collection[str] = (),
) -> dict[str, Any]:
    """run.json `selection` facts of a closing run: how much of its split it attempted.

    `expected`: each case of the split this run should hold (this shard's, under `--eval-shard`)
    with the golden gate's refusal or None; `attempted`: attempts per qid in the ledger.
    A case is attempted when all its samples are. A case left out is named with why: the golden
    gate (allowed: the dataset keeps it out of every run alike), the abort, a stop, the
    selection flags (a case the closing session did not select: `selected`, when known), a
    rejudge's source that did not hold it, or pytest not running a case it selected (a skip),
    answered ahead or not (`never_run`: the attempt in the ledger was never pytest's).
    """
    left: dict[str, list[str]] = {}
    done = 0
    for qid, gate in expected.items():
        if qid in never_run and attempted.get(qid):
            # A stop explains it (-x, Ctrl-C): pytest ran nothing after it, ahead or not.
            reason = f"not run: {stopped}" if stopped else NEVER_RUN
        elif attempted.get(qid, 0) >= samples:
            done += 1
            continue
        elif gate is not None and not answers_unscorable:
            reason = GOLDEN_PREFIX + gate
        elif status == "aborted":
            reason = "not attempted: the run aborted first"
        elif stopped:
            reason = f"not run: {stopped}"
        elif narrowed_by and (selected is None or qid not in selected):
            # A case the session selected and pytest did not run (a skip) was "not selected"
            # when the session was narrowed, and "not run" when not: by how it was named.
            reason = f"not selected ({', '.join(narrowed_by)})"
        elif rejudge:
            reason = "not in the rejudged run"
        else:
            reason = "not run"
        left.setdefault(reason, []).append(qid)
    left_out = {
        reason: {"count": len(qids), "qids": qids[:10], "allowed": reason.startswith(GOLDEN_PREFIX)}
        for reason, qids in left.items()
    }
    return {
        "cases": len(expected),
        "attempted": done,
        "leftOut": left_out,
        "whole": all(entry["allowed"] for entry in left_out.values()),
        "narrowedBy": narrowed_by,
    }


def left_out_of(selection: Mapping[str, Any], where: str) -> dict[str, list[str]]:
    """A run's left-out reasons that break wholeness, as `coverage_line`'s extra parts (the
    golden gate's are the same in both runs and said once, by the current run)."""
    out = {}
    for reason, entry in (selection.get("leftOut") or {}).items():
        if isinstance(entry, dict) and not entry.get("allowed") and entry.get("count"):
            qids = list(entry.get("qids") or [])
            # Named by count: the record keeps the first few qids only.
            out[f"{reason} {where}"] = qids + [""] * (int(entry["count"]) - len(qids))
    return out


def coverage_line(
    compared: int, selection: Mapping[str, Any], extra: Mapping[str, list[str]]
) -> str:
    """`compared N of M cases; left out: ... (why)`: the line every view prints.

    `selection`: the current run's; `extra`: further left-out reasons of the comparison (only
    in one run, dropped for a reason), each with its qids.
    """
    cases = selection.get("cases")
    of = f" of {cases}" if isinstance(cases, int) else ""
    parts = []
    for reason, entry in (selection.get("leftOut") or {}).items():
        if isinstance(entry, dict) and entry.get("count"):
            parts.append(
                f"{entry['count']} {reason}{_qids(entry.get('qids') or [], entry['count'])}"
            )
    for reason, qids in extra.items():
        if qids:
            named = [q for q in qids if q]
            parts.append(f"{len(qids)} {reason}{_qids(named, len(qids))}")
    tail = f"; left out: {'; '.join(parts)}" if parts else ""
    return f"compared {compared}{of} cases{tail}"


def _qids(qids: list[str], count: int) -> str:
    shown = ", ".join(qids[:5])
    more = f", +{count - min(5, len(qids))} more" if count > min(5, len(qids)) else ""
    return f" ({shown}{more})" if shown else ""
