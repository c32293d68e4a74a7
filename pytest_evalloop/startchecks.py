"""The usage errors a session raises at configure, before anything is collected or paid for:
no endpoint for a set that needs one, a target that cannot serve it (a Malloy package that does
not compile), a run label taken or a resume that does not fit, and comparison flags that do not
resolve (controller).

Each names what to do. A session that names no set asks none of them beyond a look at its
arguments, and imports nothing heavy: most pytest runs with the plugin installed are a project's
own tests.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from pytest_evalloop import options
from pytest_evalloop.items import named_sets, names_a_set
from pytest_evalloop.stash import SETTINGS_KEY


def endpoint_problem(config: pytest.Config, *, cases_found: bool = False) -> str | None:
    """Why the session's answerer or judge cannot be reached (no key for the endpoint, no
    `claude` for claude-code), or None. Asked at configure of the sets the command line names,
    and again when collection found cases under a folder it walked (`cases_found`): one usage
    error before anything is paid for, not one error per item."""
    settings = config.stash[SETTINGS_KEY]
    if not (cases_found or names_a_set(config)):
        return None
    if settings.answerer == "claude-code" and not (config.option.collectonly or settings.estimate):
        import shutil

        if shutil.which("claude") is None:
            return (
                "--eval-answerer=claude-code: the `claude` executable is not on PATH; install "
                "Claude Code (npm install -g @anthropic-ai/claude-code) or pick --eval-answerer=anthropic"
            )
        from pytest_evalloop.answer.claude_env import scratch_problem

        problem = scratch_problem()
        if problem is not None:
            return f"--eval-answerer=claude-code: {problem}"
    if settings.verify_goldens or settings.estimate:
        return None  # nothing here calls the endpoint
    if config.option.collectonly or options.endpoint_missing() is None:
        return None
    from pytest_evalloop.answer.backends import user_supplies

    if user_supplies(config, "answerer") and user_supplies(config, "judge"):
        return None  # a conftest or plugin brings both roles: nothing here calls the endpoint
    return options.endpoint_missing()


DIST_EACH = (
    "--dist each runs every case in every xdist worker: the run would hold each attempt once "
    "per worker (and pay for each as often) and fail validation; drop --dist each (the default "
    "--dist load deals each case to one worker), or run the other tests apart with -m 'not evalloop'"
)


def xdist_workers(config: pytest.Config) -> bool:
    """Whether the session runs its tests in xdist workers (`-n N` or `--tx`)."""
    option = config.option
    return bool(getattr(option, "numprocesses", None) or getattr(option, "tx", None))


def dist_each(config: pytest.Config) -> bool:
    """Whether xdist is asked to run every test in every worker (`--dist each`)."""
    return xdist_workers(config) and getattr(config.option, "dist", "no") == "each"


def target_problem_of(config: pytest.Config) -> str | None:
    """Why a set the arguments name has nothing to be answered against, or a Malloy package
    that does not compile (one usage error, before anything is collected), or None."""
    settings = config.stash[SETTINGS_KEY]
    if settings.verify_goldens or settings.check_judge or settings.estimate:
        return None
    if settings.rejudge_from or config.option.collectonly:
        return None
    set_dirs = named_sets(config)
    if not set_dirs:
        return None
    from pytest_evalloop.answer.backends import user_supplies

    if user_supplies(config, "target"):
        return None
    from pytest_evalloop.sets import cases as sets
    from pytest_evalloop.targets.choice import is_malloy, target_problem

    problems = []
    for set_dir in set_dirs:
        try:
            set_config = sets.load_set_config(set_dir)
        except sets.SetError:
            continue  # collection reports a set.json it cannot read, naming the line
        if settings.target and not is_malloy(settings.target, set_config):
            continue  # an external server: reached (or not) when the run starts
        problem = target_problem(set_dir, set_config, target=settings.target)
        if problem:
            problems.append(problem)
    return "\n".join(problems) or None


def check_run_choice(config: pytest.Config) -> None:
    """`--eval-label` taken, `--eval-resume` of a complete run or under another configuration:
    one usage error before anything is collected or answered (controller)."""
    settings = config.stash[SETTINGS_KEY]
    if not (settings.label or settings.resume) or config.option.collectonly:
        return
    if settings.verify_goldens or settings.check_judge:
        return
    set_dirs = named_sets(config)
    if not set_dirs:
        return  # an ini file's label or resume, in a session of plain tests: nothing to check
    from pytest_evalloop.answer import backends
    from pytest_evalloop.session import runchoice, runs, selection
    from pytest_evalloop.sets import cases as sets

    crowded = runchoice.one_run_for_many_sets(
        f"--eval-resume={settings.resume}" if settings.resume else f"--eval-label={settings.label}",
        _chosen_runs(settings, set_dirs),
    )
    if crowded:
        raise pytest.UsageError(crowded)
    for set_dir in set_dirs:
        parent = runs.runs_dir_for(set_dir, settings.runs_dir)
        try:
            if not settings.resume:
                runchoice.check_label_free(parent, settings.label or "")
                continue
            run_dir = runchoice.resumable_run(settings.resume, set_dir, parent)
            design = selection.design(settings, set_dir)
            runchoice.check_resume_design(
                settings.resume, run_dir, design, runchoice.sharding(settings)
            )
            builtin = {
                r for r in ("answerer", "judge", "target") if not backends.user_supplies(config, r)
            }
            configured = backends.default_role_pins(
                settings, set_dir, sets.load_set_config(set_dir), roles=builtin
            )
            configured["datasetSha"] = sets.dataset_sha(set_dir)
            runchoice.check_resume_pins(settings.resume, run_dir, configured)
            runchoice.check_resume_seal(settings.resume, run_dir)
        except (ValueError, OSError) as exc:
            raise pytest.UsageError(str(exc)) from exc


def _chosen_runs(settings: Any, set_dirs: list[Path]) -> dict[Path, Path]:
    """The run folder `--eval-label` or `--eval-resume` names for each set (a run that cannot
    be found is left out: the checks that follow say why)."""
    from pytest_evalloop.measure.comparison import resolve_run
    from pytest_evalloop.session import runs

    chosen: dict[Path, Path] = {}
    for set_dir in set_dirs:
        parent = runs.runs_dir_for(set_dir, settings.runs_dir)
        if not settings.resume:
            chosen[set_dir] = parent / (settings.label or "")
            continue
        try:
            chosen[set_dir] = resolve_run(settings.resume, set_dir=set_dir, runs_dir=parent)
        except (OSError, ValueError):
            continue
    return chosen


def check_flags(config: pytest.Config) -> None:
    """Every comparison and configuration flag resolved before the first request: one usage
    error naming each flag that does not (`flagcheck`), before anything is collected or paid."""
    settings = config.stash[SETTINGS_KEY]
    from pytest_evalloop.session import flagcheck

    idle = flagcheck.gate_without_run(settings, config.option)
    if idle:
        raise pytest.UsageError(idle)
    if config.option.collectonly or settings.verify_goldens or settings.check_judge:
        return

    def supplies(role: str) -> bool:
        # Asked only of a named set's roles: a session naming none never imports the backends.
        from pytest_evalloop.answer.backends import user_supplies

        return user_supplies(config, role)

    problems = flagcheck.flag_problems(settings, named_sets(config), user_supplies=supplies)
    if problems:
        raise pytest.UsageError("\n".join(problems))
