"""`--eval-verify-goldens`: one item per case that re-derives its golden and fails on drift.

Each golden is re-derived on the set's truth connection (`targets.choice.truth_source`: the
embedded target's tables, or the truth package set.json names, whatever answers the set) by its
canonical query and its second, differently shaped derivation, and through the case's
`modelQuery` on the answerer-facing query tool — the proof that the model can answer it. Every
route is compared by value (`targets.embedded.pairing`): a route that holds the golden's figures
under other column names agrees, and the session's summary says which columns were paired.

The outcome words: "golden drifted" (a route derived another value, both values shown), "could
not verify" (a route could not run: a missing table, a query that does not compile), "golden not
proven two ways" (no second derivation). A provisional golden is not scored, so only its own
canonical route can fail it; the rest is its skip reason (what it lacks to be scored).
Offline: no model endpoint is involved.
"""

from __future__ import annotations

from typing import Any

import pytest

from pytest_evalloop.failures import EvalFailure
from pytest_evalloop.sets import cases as sets
from pytest_evalloop.stash import SETTINGS_KEY, runtime_of

PAIRED_PROPERTY = "evalloop_paired"
"""The `user_properties` key under which an item reports the columns it paired by value."""


class GoldenItem(pytest.Item):
    """Re-derives one case's golden by every route it records."""

    def __init__(self, *, case: sets.Case, lineno: int, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.case = case
        self.lineno = lineno
        self.add_marker(pytest.mark.evalloop)
        self.extra_keyword_matches.update([case.split, *case.tags])

    def runtest(self) -> None:
        from pytest_evalloop.goldens.preflight import golden_refusal
        from pytest_evalloop.targets.choice import TruthError, no_truth_reason, truth_source
        from pytest_evalloop.targets.embedded.goldens import NOTHING_TO_DERIVE, derive_golden

        set_dir = self.path.parent
        qid = self.case.qid
        config = sets.load_set_config(set_dir)
        target = self.config.stash[SETTINGS_KEY].target
        provisional = golden_refusal(self.case) == "golden_provisional"
        golden = self.case.golden
        if golden is None or golden.kind in NOTHING_TO_DERIVE:
            if provisional:
                pytest.skip(_provisional_reason(self.case, set_dir, [], None))
            return  # nothing to re-derive: a person vouches for it
        try:
            source = truth_source(set_dir, config, target=target)
            if source is None:
                pytest.skip(f"{no_truth_reason(set_dir, config)}: nothing to re-derive against")
            truth = self._truth(source)
        except TruthError as exc:
            raise EvalFailure(f"could not verify the golden of {qid}: {exc}", "drift") from None
        runner, no_model = self._runner(config)
        found = derive_golden(self.case.raw(), set_dir, model_query_runner=runner, truth=truth)
        paired = found.paired_lines()
        if paired:
            self.user_properties.append((PAIRED_PROPERTY, f"{qid}: " + "; ".join(paired)))
        drifts = found.drifts
        if provisional:
            own = [d for d in drifts if d.route == "canonical" and d.problem != "unproven"]
            if not own:
                pytest.skip(_provisional_reason(self.case, set_dir, drifts, no_model))
        if not drifts:
            return
        lines = [f"{_head(drifts)} {qid}:"]
        for drift in drifts:
            lines.append(f"  route {drift.route}: {drift.message}")
            if drift.problem != "unproven":
                lines.append(f"    stored:     {drift.stored!r}")
            if drift.derived is not None:
                lines.append(f"    re-derived: {drift.derived!r}")
        lines += [f"  paired by value: {line}" for line in paired]
        raise EvalFailure("\n".join(lines), "drift")

    def _truth(self, source: Any) -> Any:
        """The set's truth connection, one per set and process, closed at the end; a truth
        that cannot be opened is remembered, so every item says so without retrying."""
        truths: dict[Any, Any] = self.config.stash.setdefault(_TRUTHS, {})
        set_dir = self.path.parent
        if set_dir not in truths:
            from pytest_evalloop.targets.choice import TruthError

            try:
                truths[set_dir] = source.open()
            except TruthError as exc:
                truths[set_dir] = exc
            else:
                self.config.add_cleanup(truths[set_dir].close)
        found = truths[set_dir]
        if isinstance(found, Exception):
            raise found
        return found

    def _runner(self, config: sets.SetConfig) -> tuple[Any, str | None]:
        """The model route (the answerer-facing query tool), or None and why there is none."""
        from pytest_evalloop.answer.backends import default_target, user_supplies
        from pytest_evalloop.targets.target import missing_target

        runtime = runtime_of(self.config)
        settings = self.config.stash[SETTINGS_KEY]
        set_dir = self.path.parent
        if settings.target is None and not user_supplies(self.config, "target"):
            if (config.target or {}).get("kind") != "malloy" and missing_target(set_dir, config):
                return None, "no target answers this set (pass --eval-target)"
        targets: dict[Any, Any] = self.config.stash.setdefault(_TARGETS, {})

        def run(sql: str) -> list[dict[str, Any]]:
            # Built on the first query, so a target that cannot be built (its data missing) is
            # this route's "could not verify", not the item's traceback.
            if set_dir not in targets:
                targets[set_dir] = default_target(set_dir, config, settings)
            target = targets[set_dir]

            async def go() -> Any:
                session = await runtime.session_for(target)
                return await session.execute(sql)

            outcome = runtime.call(go())
            if outcome.error:
                raise ValueError(f"the answerer-facing query tool refused it: {outcome.error}")
            rows: list[dict[str, Any]] = outcome.rows
            return rows

        return run, None

    def repr_failure(self, excinfo: pytest.ExceptionInfo[BaseException], style: Any = None) -> Any:
        if isinstance(excinfo.value, EvalFailure):
            return excinfo.value.report
        return super().repr_failure(excinfo, style=style)

    def reportinfo(self) -> tuple[Any, int | None, str]:
        return self.path, self.lineno - 1, f"golden of {self.case.qid}"


def _head(drifts: list[Any]) -> str:
    problems = {d.problem for d in drifts}
    if "disagrees" in problems:
        return "golden drifted for"
    if "failed" in problems:
        return "could not verify the golden of"
    return "golden not proven two ways for"


def _provisional_reason(
    case: sets.Case, set_dir: Any, drifts: list[Any], no_model: str | None
) -> str:
    """Why a provisional golden is skipped: it is not scored; what it lacks to be."""
    from pytest_evalloop.targets.embedded.goldens import NOTHING_TO_DERIVE

    kind = case.golden.kind if case.golden is not None else None
    head = f"provisional golden of {case.qid}, not scored"
    if kind in NOTHING_TO_DERIVE:
        return (
            f"{head}: the golden is {kind}, with nothing to re-derive; a person checks it and runs "
            f'`evalloop golden attest {set_dir} {case.qid} --by "<name>"`'
        )
    if any(d.route == "canonical" for d in drifts):
        return f"{head}: nothing re-derives it (no golden.canonicalQuery)"
    lacks = []
    if any(d.route == "second" and d.problem == "unproven" for d in drifts):
        lacks.append(
            "a second derivation (golden.verification: secondQuery, primaryAxis, variesAxis)"
        )
    prefix = f"case {case.qid}: "
    lacks += [
        f"route {d.route}: {d.message.removeprefix(prefix)}"
        for d in drifts
        if not (d.route == "second" and d.problem == "unproven")
    ]
    if no_model:
        lacks.append(f"route model: not run: {no_model}")
    text = f"{head}: its canonical query reproduces it"
    return text + ("; to be verified it lacks " + "; ".join(lacks) if lacks else "")


def paired_summary(terminalreporter: Any) -> None:
    """The goldens a route reproduced only under other column names, and which columns were
    paired (controller; the items report them in `user_properties`)."""
    lines = [
        str(value)
        for outcome in ("passed", "failed", "skipped")
        for report in terminalreporter.stats.get(outcome, [])
        for name, value in getattr(report, "user_properties", [])
        if name == PAIRED_PROPERTY
    ]
    if not lines:
        return
    terminalreporter.section("evalloop: golden columns paired by value")
    terminalreporter.write_line(
        f"{len(lines)} golden(s) reproduced under other column names (golden = route column):"
    )
    for line in sorted(lines):
        terminalreporter.write_line(f"  {line}")


_TARGETS = pytest.StashKey[dict[Any, Any]]()
_TRUTHS = pytest.StashKey[dict[Any, Any]]()
