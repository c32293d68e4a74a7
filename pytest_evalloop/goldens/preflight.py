"""What the controller settles once the selection is known and before anything is answered.

Two things, per set of the selection (seed 004, run_baseline's preflight):

- **Unscorable goldens.** A case whose golden is provisional, invalid, ambiguous or missing can
  never be scored (the golden gate refuses it), so answering it is money spent on nothing. The
  session says so at its start, and those cases are not answered unless the user asks for it
  (`--eval-answer-unscorable`, for a later rejudge once the goldens are verified).
- **The golden check.** On a set with a truth connection (an embedded target's tables, or the
  truth package set.json names: `targets.choice.truth_source`), every golden the run will score
  is re-derived first. A drifted golden, or one that could not be verified, stops the session
  before any answer (unless `--eval-allow-golden-drift`); what the check found becomes the
  run's `goldenCheck`.
- **Nothing to answer.** A selection whose every case is unscorable would answer nothing: the
  session stops with `EXIT_NOTHING_TO_ANSWER` and one line saying why and what fixes it.

The controller computes both (once, from the collected items, or from the node ids xdist's
workers report) and leaves the check's text in the session's state directory, where whichever
process opens the run reads it into `run.json`.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pytest_evalloop.options import Settings
    from pytest_evalloop.sets import cases as sets
    from pytest_evalloop.targets.embedded.heldcache import HeldGoldens

CHECK_FILE = "golden-check.json"
EXIT_NOTHING_TO_ANSWER = 9
"""A scored session whose selection holds no case that can be scored: nothing was answered
(pytest uses 0-5, the gates 6 and 7, an unfinished run 8; docs/configuration.md#exit-statuses)."""


def golden_refusal(case: sets.Case) -> str | None:
    """Why a case's golden cannot be scored (`golden_provisional`, …), or None when it can."""
    from pytest_evalloop.judge.judge import golden_gate

    golden = case.golden
    if golden is None:
        return golden_gate(None)
    # What the gate reads, without serialising the whole golden for each of many cases.
    fields = ("status", "kind", "rubric", "value", "path")
    return golden_gate({name: getattr(golden, name) for name in fields})


GOLDEN_FIX = {
    "golden_provisional": "verify the golden (`evalloop golden promote` or `attest`)",
    "golden_missing": "give the case a golden (`evalloop golden repair`)",
    "golden_invalid": "repair the golden (`evalloop golden repair`), or release its hold "
    "(`evalloop golden release`) once evidence confirms the key",
    "golden_ambiguous": "repair the golden (`evalloop golden repair`), or release its hold "
    "(`evalloop golden release`) once evidence confirms the key",
}
"""What the golden side door offers for each refusal of the golden gate (promote and attest
verify a provisional key and refuse a held one, which is repaired or released)."""


def answers_unscorable(settings: Settings) -> bool:
    """Whether cases with an unscorable golden are answered anyway (a rejudge spends nothing)."""
    return settings.answer_unscorable or bool(settings.rejudge_from)


@dataclass
class GoldenCheck:
    """The golden check of one set over the cases a run will score."""

    ran: bool
    text: str
    """`N ok, M drifted, K other finding(s), over …`, or why the check did not run."""
    drifted: list[str] = field(default_factory=list)
    """One line per route that derived another value (stops the run)."""
    unverified: list[str] = field(default_factory=list)
    """One line per route that could not run: a missing table, a query that does not compile,
    a truth package that cannot be served (stops the run: nothing vouches for the golden)."""
    findings: list[str] = field(default_factory=list)
    """One line per golden not proven two ways (reported, does not stop the run)."""


@dataclass
class SetPreflight:
    """What the controller found for one set of the selection."""

    set_dir: Path
    name: str
    selected: list[str]
    unscorable: dict[str, str]
    """qid → the golden gate's reason, for the selected cases that cannot be scored."""
    check: GoldenCheck


def selected_by_set(paths_and_qids: list[tuple[Path, str]]) -> dict[Path, list[str]]:
    """The selected qids of each set, in order, each once (samples are one case)."""
    found: dict[Path, dict[str, None]] = {}
    for cases_path, qid in paths_and_qids:
        found.setdefault(cases_path.parent, {})[qid] = None
    return {set_dir: list(qids) for set_dir, qids in found.items()}


def from_node_ids(
    root: Path, ids: list[str], initial: Sequence[Path] = ()
) -> list[tuple[Path, str]]:
    """(cases.jsonl path, qid) of each case item among xdist's collected node ids.

    A node id is relative to the rootdir, but pytest names a file outside it relative to the
    command-line path it was found under (`initial`): `cases.jsonl::q` for a set given as
    `/elsewhere/shop`. Such a path is looked for there, where the rootdir holds none."""
    from pytest_evalloop.sets.pin import CASES_FILE  # not the set's models: most ids are tests

    bases = [root, *(p if p.is_dir() else p.parent for p in initial)]
    found: dict[str, Path] = {}
    out = []
    for nodeid in ids:
        path, sep, name = nodeid.partition("::")
        if not sep or not path.endswith(CASES_FILE):
            continue
        if path not in found:
            where = [(base / path).resolve() for base in bases]
            found[path] = next((p for p in where if p.is_file()), where[0])
        out.append((found[path], name.split("[", 1)[0]))
    return out


def preflight(
    set_dir: Path, qids: list[str], settings: Settings, cases: list[sets.Case] | None = None
) -> SetPreflight:
    """Decide what a set's selected cases need before the run (pure of pytest).

    `cases` are the selected rows when the caller has them (the collected items); otherwise
    the set is loaded and `qids` pick them.
    """
    from pytest_evalloop.sets import cases as sets

    config = sets.load_set_config(set_dir)
    if cases is None:
        by_qid = {case.qid: case for _, case in sets.load_cases(set_dir).rows}
        cases = [by_qid[q] for q in qids if q in by_qid]
    chosen = list({case.qid: case for case in cases}.values())
    unscorable = {c.qid: reason for c in chosen if (reason := golden_refusal(c)) is not None}
    scored = [c for c in chosen if c.qid not in unscorable]
    # Closed here, not by the collector: under `-W error` its ResourceWarning errored an item.
    with (set_dir / sets.CASES_FILE).open("rb") as rows:
        total = sum(1 for line in rows if line.strip())
    check = golden_check(set_dir, config, scored, total=total, target=settings.target)
    return SetPreflight(set_dir, config.name, [c.qid for c in chosen], unscorable, check)


def golden_check(
    set_dir: Path,
    config: sets.SetConfig,
    scored: list[sets.Case],
    *,
    total: int,
    target: str | None = None,
) -> GoldenCheck:
    """Re-derive the goldens of the cases a run will score, on the set's truth connection (the
    embedded target's tables, or the truth package set.json names, behind its own server;
    `target` is `--eval-target`, beside whose package the truth package is looked for too)."""
    from pytest_evalloop.targets.choice import TruthError, no_truth_reason, truth_source
    from pytest_evalloop.targets.embedded.goldens import NOTHING_TO_DERIVE, TruthQueries

    derivable = [
        c for c in scored if c.golden is not None and c.golden.kind not in NOTHING_TO_DERIVE
    ]
    try:
        source = truth_source(set_dir, config, target=target)
        if source is None:
            return GoldenCheck(ran=False, text=f"not run: {no_truth_reason(set_dir, config)}")
        if derivable:
            from pytest_evalloop.steps import announce

            announce(f"{config.name}: checking {len(derivable)} golden(s) on the truth connection")
        truth = source.open() if derivable else None
    except TruthError as exc:
        return _unavailable(scored, derivable, str(exc), total=total)
    held = None
    if isinstance(truth, TruthQueries):
        from pytest_evalloop.targets.embedded.heldcache import HeldGoldens

        held = HeldGoldens(set_dir, truth.data_dir)
    try:
        return _check_cases(set_dir, scored, derivable, truth, total=total, known=held)
    finally:
        if truth is not None:
            truth.close()


def _unavailable(
    scored: list[sets.Case], derivable: list[sets.Case], why: str, *, total: int
) -> GoldenCheck:
    """The check of a set whose truth connection cannot be opened: no golden is verified."""
    first, _, rest = why.partition("\n")
    return GoldenCheck(
        ran=True,
        text=_text(0, 0, len(derivable), 0, scored, derivable, total),
        unverified=[f"every golden: could not verify: {first}", *rest.splitlines()],
    )


def _text(
    ok: int,
    drifted: int,
    unverified: int,
    other: int,
    scored: list[sets.Case],
    derivable: list[sets.Case],
    total: int,
) -> str:
    nothing = len(scored) - len(derivable)
    return (
        f"{ok} ok, {drifted} drifted, "
        + (f"{unverified} could not be verified, " if unverified else "")
        + f"{other} other finding(s), over the {len(derivable)} scored case(s) this run selects "
        "with a value to re-derive"
        + (f" ({nothing} more with nothing to re-derive)" if nothing else "")
        + f", of {total} in the set"
    )


def _check_cases(
    set_dir: Path,
    scored: list[sets.Case],
    derivable: list[sets.Case],
    truth: Any,
    *,
    total: int,
    known: HeldGoldens | None = None,
) -> GoldenCheck:
    from pytest_evalloop.targets.embedded.goldens import verify_case

    ok = 0
    found = GoldenCheck(ran=True, text="")
    counts = {"disagrees": 0, "failed": 0, "unproven": 0}
    # A golden's check depends on the golden alone: one that held needs no second look (a
    # synthetic 10,000-case set repeats a few dozen goldens).
    held: set[str] = set()
    for case in derivable:
        assert case.golden is not None
        key = case.golden.model_dump_json()
        raw = case.raw()
        if key in held or (known is not None and known.known(raw.get("golden") or {})):
            problems = []
        else:
            problems = verify_case(raw, set_dir, truth=truth)
            if not problems and known is not None:
                known.remember(raw.get("golden") or {})
        if not problems:
            held.add(key)
            ok += 1
            continue
        lines = {
            kind: [
                f"{case.qid}: route {p.route}: {p.message}" for p in problems if p.problem == kind
            ]
            for kind in counts
        }
        found.drifted += lines["disagrees"]
        found.unverified += lines["failed"]
        found.findings += lines["unproven"]
        # One word per case: a drift outweighs a route that could not run, which outweighs a
        # missing second derivation.
        worst = next(kind for kind in counts if lines[kind])
        counts[worst] += 1
    found.text = _text(
        ok,
        counts["disagrees"],
        counts["failed"],
        counts["unproven"],
        scored,
        derivable,
        total,
    )
    return found


def nothing_to_answer(found: list[SetPreflight], settings: Settings) -> str | None:
    """The one line that ends a session none of whose selected cases can be scored (so nothing
    would be answered), saying why and the command that fixes it; None otherwise."""
    if answers_unscorable(settings) or not found:
        return None
    if any(len(f.unscorable) < len(f.selected) for f in found):
        return None
    one = max(found, key=lambda f: len(f.selected))
    reasons = Counter(one.unscorable.values())
    listed = ", ".join(f"{n} {why}" for why, n in sorted(reasons.items()))
    return (
        f"evalloop: nothing to answer: all {len(one.selected)} selected case(s) of {one.name} "
        f"have a golden that cannot be scored ({listed}); {_fix(one, reasons, settings.target)}"
    )


def _fix(found: SetPreflight, reasons: Counter[str], target: str | None) -> str:
    where = found.set_dir
    flag = f" --eval-target={target}" if target else ""
    top = reasons.most_common(1)[0][0]
    if top == "golden_provisional" and not found.check.ran:
        return (
            "there is no truth connection to re-derive them on (the golden check says why): put "
            f"the truth package where {where / 'set.json'} truthPackage names it, or have a "
            f'person check each golden and run `evalloop golden attest {where} <qid> --by "<name>"`'
        )
    if top == "golden_provisional":
        return (
            f'run `evalloop golden attest {where} --all-provisional --by "<name>"{flag}` (it '
            "attests those the truth data reproduces), then run again"
        )
    if top in ("golden_ambiguous", "golden_invalid"):
        return (
            f"`evalloop golden release` or `evalloop golden repair` them ({where}), then run again"
        )
    from pytest_evalloop.sets import cases as sets

    return f"give them goldens in {where / sets.CASES_FILE}, then run again"


def session_start_lines(found: SetPreflight, settings: Settings) -> list[str]:
    """What the terminal says about one set before anything is answered."""
    lines = []
    head = f"evalloop: {found.name}:"
    if found.unscorable:
        reasons = Counter(found.unscorable.values())
        listed = ", ".join(f"{n} {why}" for why, n in sorted(reasons.items()))
        lines.append(
            f"{head} {len(found.unscorable)} of {len(found.selected)} selected case(s) have a "
            f"golden that cannot be scored ({listed})"
        )
        if settings.rejudge_from:
            lines.append("  a rejudge judges them anyway: their verdicts stay null")
        elif settings.answer_unscorable:
            lines.append(
                "  --eval-answer-unscorable: they are answered anyway; their verdicts stay null "
                "until the goldens are verified and the run is rejudged"
            )
        else:
            how = (
                "`evalloop golden promote` re-derives them two ways, or a named person attests "
                f'them (`evalloop golden attest {found.set_dir} --all-provisional --by "<name>"` '
                "attests every provisional one the truth data reproduces)"
                if found.check.ran
                else "a named person attests them (`evalloop golden attest`: this set has no "
                "truth connection to promote on)"
            )
            if set(reasons) != {"golden_provisional"}:
                # Promote and attest verify a provisional key only: each refusal its own way.
                how = "; ".join(
                    f"{why.removeprefix('golden_')}: {GOLDEN_FIX.get(why, how)}"
                    for why in sorted(reasons)
                )
            lines.append(
                f"  they are not answered, so nothing is spent on them. To score them, {how}, "
                "then run again; or pass --eval-answer-unscorable to answer them now for a later "
                "rejudge"
            )
    lines.append(f"{head} golden check: {found.check.text}")
    for line in found.check.drifted:
        lines.append(f"  drifted: {line}")
    for line in found.check.unverified:
        lines.append(f"  could not verify: {line}")
    for line in found.check.findings:
        lines.append(f"  not proven two ways: {line}")
    if found.check.drifted or found.check.unverified:
        if settings.allow_golden_drift:
            lines.append(
                "  --eval-allow-golden-drift: the run goes ahead on goldens the truth did not "
                "confirm; its run.json goldenCheck says so"
            )
        else:
            lines.append(
                "  stopping before answering: a score against a golden the truth data does not "
                "confirm means nothing. Repair a drifted golden (`evalloop golden repair`, "
                "docs/golden-side-door.md), make the truth runnable where it could not verify, "
                "or pass --eval-allow-golden-drift to run anyway"
            )
    return lines


def stops(found: list[SetPreflight], settings: Settings) -> bool:
    """Whether the session must stop before answering (a drifted golden, or one that could not
    be verified, not allowed)."""
    return not settings.allow_golden_drift and any(
        f.check.drifted or f.check.unverified for f in found
    )


def stop(found: list[SetPreflight], settings: Settings) -> tuple[str, int] | None:
    """Why the session ends before answering and its exit status, or None: goldens the truth
    data does not confirm (`EXIT_HARNESS_FAILURE`), or nothing to answer (`EXIT_NOTHING_TO_ANSWER`)."""
    from pytest_evalloop.measure.gate import EXIT_HARNESS_FAILURE

    if stops(found, settings):
        return (
            "evalloop: the golden check found goldens the truth data does not confirm "
            "(drifted, or could not verify); stopped before answering (details above; "
            "--eval-allow-golden-drift runs anyway)",
            EXIT_HARNESS_FAILURE,
        )
    nothing = nothing_to_answer(found, settings)
    return None if nothing is None else (nothing, EXIT_NOTHING_TO_ANSWER)


def recorded_text(found: SetPreflight, settings: Settings) -> str:
    """The run's `goldenCheck`: the check's result, and whether the run started on drift."""
    if (found.check.drifted or found.check.unverified) and settings.allow_golden_drift:
        return found.check.text + "; started anyway (--eval-allow-golden-drift)"
    return found.check.text


def publish(state_dir: Path, found: list[SetPreflight], settings: Settings) -> None:
    """Leave each set's `goldenCheck` where the process that opens its run will read it."""
    state_dir.mkdir(parents=True, exist_ok=True)
    data = {str(f.set_dir.resolve()): recorded_text(f, settings) for f in found}
    temp = state_dir / f".{CHECK_FILE}.tmp"
    temp.write_text(json.dumps(data), encoding="utf-8")
    temp.replace(state_dir / CHECK_FILE)


def recorded(state_dir: Path, set_dir: Path) -> Any:
    """The `goldenCheck` the controller left for a set, or None (no preflight ran)."""
    try:
        data = json.loads((state_dir / CHECK_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data.get(str(Path(set_dir).resolve())) if isinstance(data, dict) else None
