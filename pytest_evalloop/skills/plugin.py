"""The skill-evals pytest plugin: its options, markers and collection hooks.

`pytest <skills dir>` collects a lint item per `SKILL.md` and a scenario item per
`<skill>/evals/<name>.yaml`; the ini key `eval_skills` names skills roots that a bare `pytest`
(no path arguments) collects as well.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal, cast

import pytest

from pytest_evalloop.options import answers_no_case, ini_path

# Only the light settings module at load: the collectors (pydantic models, yaml) are imported
# when a skill file is actually found, so pytest runs without skills never pay for them.
from pytest_evalloop.skills import settings as skill_settings
from pytest_evalloop.skills.settings import EVALS_DIR, SCENARIO_SUFFIXES, SKILL_FILE

STRICTNESS = ("strict", "advisory")
MODES = ("activation", "full")
BACKENDS = ("claude-code", "anthropic")


def pytest_addoption(parser: pytest.Parser) -> None:
    """Register the skill options in the `evalloop` group, each with an ini twin."""
    group = parser.getgroup("evalloop")
    group.addoption(
        "--eval-skill-strictness",
        choices=STRICTNESS,
        default=None,
        help="Release gate strictness: strict (gate findings are errors, the default) or "
        "advisory (gate findings are warnings); ini: eval_skill_strictness",
    )
    group.addoption(
        "--eval-lint-only",
        action="store_true",
        default=False,
        help="Collect only the SKILL.md lint items, not the skill scenarios",
    )
    group.addoption(
        "--eval-skill-fixtures",
        default=None,
        help="Directory of scenario fixture repositories; a scenario's `fixture` must be one of "
        "its subdirectories (ini: eval_skill_fixtures)",
    )
    group.addoption(
        "--eval-skill-mode",
        choices=MODES,
        default=None,
        help="Scenario runs: activation (read-only, 8 turns, the default) or full (edits "
        "accepted, 30 turns, rubric graded); ini: eval_skill_mode",
    )
    group.addoption(
        "--eval-skill-backends",
        default=None,
        help="Comma-separated backends each scenario runs on (claude-code, anthropic); default: "
        "--eval-answerer; ini: eval_skill_backends",
    )
    group.addoption(
        "--eval-question-preference",
        choices=(*skill_settings.PREFERENCES, "all"),
        default=None,
        help="Question preference installed in each sandbox; all runs interaction scenarios "
        "under each and checks prefer >= provider-default >= minimize",
    )
    group.addoption(
        "--eval-rubric-threshold",
        type=float,
        default=None,
        help="Share of rubric items a full-mode run must pass, in [0, 1] (default 0.75)",
    )
    group.addoption(
        "--eval-scorecard",
        action="store_true",
        default=False,
        help="Print the dogfood scorecard of each case run and fail the session (exit 6) when "
        "it misses the thresholds",
    )
    parser.addini("eval_skill_mode", "Scenario run mode: activation or full", default="")
    parser.addini("eval_skill_backends", "Comma-separated scenario backends", default="")
    parser.addini(
        "eval_skill_strictness", "Release gate strictness: strict or advisory", default=""
    )
    parser.addini("eval_skill_fixtures", "Directory of scenario fixture repositories", default="")
    parser.addini(
        "eval_skills",
        "Skills roots (directories of <id>/SKILL.md) collected when pytest gets no path argument",
        type="paths",
        default=[],
    )


def pytest_configure(config: pytest.Config) -> None:
    """Resolve the skill settings, register markers, add the ini skills roots (every process)."""
    for line in skill_settings.MARKERS:
        config.addinivalue_line("markers", line)
    config.stash[skill_settings.SETTINGS_KEY] = _settings(config)
    if not hasattr(config, "workerinput"):
        config.pluginmanager.register(SkillsTally(config), "evalloop-skills-tally")
    if config.args_source != pytest.Config.ArgsSource.ARGS:
        _add_skill_roots(config)


def _settings(config: pytest.Config) -> skill_settings.SkillSettings:
    strictness = config.getoption("eval_skill_strictness") or config.getini("eval_skill_strictness")
    strictness = strictness or "strict"
    if strictness not in STRICTNESS:
        raise pytest.UsageError(
            f"eval_skill_strictness = {strictness!r} is not one of {', '.join(STRICTNESS)}; "
            "fix the ini file or pass --eval-skill-strictness"
        )
    fixtures = config.getoption("eval_skill_fixtures") or (
        ini_path(config, ini) if (ini := config.getini("eval_skill_fixtures")) else None
    )
    mode = config.getoption("eval_skill_mode") or config.getini("eval_skill_mode") or "activation"
    if mode not in MODES:
        raise pytest.UsageError(
            f"eval_skill_mode = {mode!r} is not one of {', '.join(MODES)}; fix the ini file"
        )
    threshold = config.getoption("eval_rubric_threshold")
    threshold = 0.75 if threshold is None else threshold
    if not 0 <= threshold <= 1:
        raise pytest.UsageError(
            f"--eval-rubric-threshold={threshold} is outside [0, 1]; pass a share such as 0.75"
        )
    return skill_settings.SkillSettings(
        strictness=cast(skill_settings.Strictness, strictness),
        lint_only=bool(config.getoption("eval_lint_only")),
        fixtures_dir=Path(fixtures).resolve() if fixtures else None,
        mode=cast(Literal["activation", "full"], mode),
        backends=_backends(config),
        preference=config.getoption("eval_question_preference") or "provider-default",
        samples=max(1, int(config.getoption("eval_samples", 1) or 1)),
        rubric_threshold=threshold,
        scorecard=bool(config.getoption("eval_scorecard")),
    )


def _backends(config: pytest.Config) -> tuple[str, ...]:
    raw = config.getoption("eval_skill_backends") or config.getini("eval_skill_backends")
    raw = raw or config.getoption("eval_answerer", None) or "anthropic"
    names = tuple(dict.fromkeys(n.strip() for n in str(raw).split(",") if n.strip()))
    unknown = [n for n in names if n not in BACKENDS]
    if unknown or not names:
        raise pytest.UsageError(
            f"--eval-skill-backends={raw!r}: unknown backend(s) {unknown}; use a comma-separated "
            f"list of {', '.join(BACKENDS)}"
        )
    return names


def _add_skill_roots(config: pytest.Config) -> None:
    # Only when pytest chose its own paths (testpaths or the current directory): a path given
    # on the command line means "just this".
    roots: list[Path] = config.getini("eval_skills")
    for root in roots:
        if not root.is_dir():
            raise pytest.UsageError(
                f"eval_skills names {root}, which is not a directory; fix the ini file"
            )
        if not any(root.is_relative_to(Path(arg).resolve()) for arg in config.args):
            config.args.append(str(root))


def pytest_collect_file(file_path: Path, parent: pytest.Collector) -> pytest.Collector | None:
    """`SKILL.md` → a lint item; `<skill>/evals/<name>.yaml` → a scenario item (worker)."""
    if file_path.name == SKILL_FILE:
        from pytest_evalloop.skills import collect

        return collect.SkillFile.from_parent(parent, path=file_path)
    if _is_scenario(file_path) and not parent.config.stash[skill_settings.SETTINGS_KEY].lint_only:
        from pytest_evalloop.skills import collect

        return collect.ScenarioFile.from_parent(parent, path=file_path)
    return None


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_node_collection_finished(node: Any, ids: list[str]) -> None:
    """`--dist each` would run every scenario once per worker into one run: refused before
    any is run (controller)."""
    from pytest_evalloop.startchecks import DIST_EACH, dist_each

    if not dist_each(node.config) or answers_no_case(node.config.option):
        return
    root = node.config.rootpath
    if any(_is_scenario(root / nodeid.partition("::")[0]) for nodeid in ids):
        raise pytest.UsageError(DIST_EACH)


def _is_scenario(path: Path) -> bool:
    return (
        path.suffix in SCENARIO_SUFFIXES
        and path.parent.name == EVALS_DIR
        and (path.parent.parent / SKILL_FILE).is_file()
    )


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Note which skills roots have scenario items that will run: their lint items then
    record a ``skill_lint`` event in the same run (worker)."""
    # By marker, not by class: a run that found no skill never imports the collectors.
    config.stash[skill_settings.RUNNABLE_ROOTS_KEY] = {
        item.skill_dir.parent
        for item in items
        if item.get_closest_marker("skill_scenario") is not None and hasattr(item, "skill_dir")
    }


class SkillsTally:
    """The controller's end of a session: closes the skills runs, prints activation metrics,
    checks the question-preference ordering, and applies the scorecard gate (controller)."""

    def __init__(self, config: pytest.Config) -> None:
        self.config = config
        self.run_dirs: set[str] = set()
        self.lines: list[str] = []
        self.scorecards: list[Any] = []
        self.ordering_failed = False
        self.activation_failed = False

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        """Keep the skills run each scenario report names (reports cross from workers)."""
        for key, value in report.user_properties:
            if key == "evalloop_skill_run":
                self.run_dirs.add(str(value))

    @pytest.hookimpl(trylast=True)
    def pytest_sessionfinish(self, session: pytest.Session, exitstatus: int) -> None:
        """After the core closed its runs: close ours, summarise, gate (controller)."""
        interrupted = exitstatus == pytest.ExitCode.INTERRUPTED or bool(session.shouldstop)
        settings = self.config.stash[skill_settings.SETTINGS_KEY]
        for run_dir in sorted(Path(p) for p in self.run_dirs):
            # Here, not above: an eval run with no skill in it never imports them (and yaml),
            # and a session with no run never imports the ledger's models.
            from pytest_evalloop.ledger import reader as ledger_reader
            from pytest_evalloop.session import runs
            from pytest_evalloop.skills import metrics, scenarios

            runs.finish_run(run_dir, interrupted=interrupted, totals=False)
            ledger = ledger_reader.read_run(run_dir)
            scores = ledger.of_kind("activation_score")
            selection = (ledger.info.selection if ledger.info else None) or {}
            catalog = selection.get("skills") or []  # every skill installed in its sandboxes
            # The neighbours the catalog's negatives name, from the catalog run.json names.
            root = ledger.info.set_dir if ledger.info else None
            named = scenarios.neighbors(Path(root)) if root else {}
            self.lines.append(f"run: {run_dir.name} at {run_dir}")
            self.lines += metrics.activation_table(
                scores, interval=settings.samples > 1, catalog=catalog, neighbors=named
            )
            # The gate reads the figures the table printed (one function, `metrics.figures`).
            wrong = metrics.activation_problems(scores, catalog, named)
            order = metrics.preference_order_problems(scores)
            self.lines += wrong + order
            self.activation_failed |= bool(wrong)
            self.ordering_failed |= bool(order)
        failed = self.ordering_failed or self.activation_failed
        if failed and session.exitstatus == pytest.ExitCode.OK:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED
        if settings.scorecard:
            self._scorecard(session)

    def _scorecard(self, session: pytest.Session) -> None:
        from pytest_evalloop.stash import TALLY_KEY

        tally = self.config.stash.get(TALLY_KEY, None)
        if not (tally and tally.run_dirs):
            return  # no run closed: no card, and not the ledger's models to say so
        from pytest_evalloop.measure.gate import EXIT_GATE_REJECTED
        from pytest_evalloop.skills.scorecard import Scorecard, run_case_facts

        for run_dir in sorted(Path(p) for p in tally.run_dirs):
            # The facts of the set the run's own run.json names, wherever --eval-runs-dir put
            # the run: the card printed and the gate read are this one card.
            facts, problem = run_case_facts(run_dir)
            card = Scorecard.from_ledger(run_dir, cases=facts)
            card.set_problem = problem
            self.scorecards.append(card)
            if not card.gate()[0]:
                session.exitstatus = EXIT_GATE_REJECTED

    def pytest_terminal_summary(self, terminalreporter: pytest.TerminalReporter) -> None:
        """Activation metrics per skill and backend; the scorecard of each case run."""
        if self.lines:
            terminalreporter.write_sep("=", "evalloop: skill activation")
            for line in self.lines:
                terminalreporter.write_line(line)
        if self.config.stash[skill_settings.SETTINGS_KEY].scorecard:
            from pytest_evalloop.skills.scorecard import write_card

            if not self.scorecards:
                terminalreporter.write_line("skill scorecard: no case run in this session")
            for card in self.scorecards:
                write_card(terminalreporter, card)
