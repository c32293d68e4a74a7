"""Every comparison and configuration flag resolved before the first request.

A typo in CI (`--baseline=nonexistent`, `--eval-targets=@missing`, `--eval-tool-profile=nosuch`,
`--eval-rejudge-from=nosuch`), a gate with nothing to compare against, or a baseline whose
breaking pins differ from this session's configuration used to be found after (or during) the
paid run. `flag_problems` resolves each of them for every named set, on the controller in
`pytest_configure`; the plugin raises one `pytest.UsageError` (exit 4) listing every problem,
each naming the flag and what to do.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pytest_evalloop.options import Settings
    from pytest_evalloop.sets.cases import SetConfig

Supplies = Callable[[str], bool]
"""Whether a conftest or plugin brings its own role (answerer, judge, target)."""


def flag_problems(
    settings: Settings,
    set_dirs: Iterable[Path],
    *,
    user_supplies: Supplies,
) -> list[str]:
    """Every comparison and configuration flag that does not resolve, one line each."""
    problems: list[str] = []
    if settings.gate != "off" and not settings.baseline:
        problems.append(
            f"--eval-gate={settings.gate} needs --baseline=<label or run dir> to compare "
            "against; pass --baseline, or drop --eval-gate (a gate without a baseline "
            "gates nothing)"
        )
    if settings.baseline2 and not settings.targets:
        problems.append(
            "--baseline2 is a second post arm for targeted mode; name the targets with "
            "--eval-targets=q1,q2 (chosen before the run), or drop --baseline2"
        )
    if settings.targets:
        from pytest_evalloop.measure.gate import parse_targets

        try:
            parse_targets(settings.targets)
        except ValueError as exc:
            problems.append(f"--eval-targets={settings.targets}: {exc}")
    problems += _repeated_arms(settings)
    for set_dir in set_dirs:
        problems += _set_problems(settings, set_dir, user_supplies)
    return list(dict.fromkeys(problems))


def gate_without_run(settings: Settings, option: Any) -> str | None:
    """A gate asked of a session that measures nothing (it would exit 0 having decided
    nothing): the usage error saying so, or None."""
    if settings.gate == "off":
        return None
    idle = [
        flag
        for flag, on in (
            ("--collect-only", option.collectonly),
            ("--setup-plan", getattr(option, "setupplan", False)),
            ("--setup-only", getattr(option, "setuponly", False)),
            ("--eval-verify-goldens", settings.verify_goldens),
            ("--eval-check-judge", settings.check_judge),
            ("--eval-estimate", settings.estimate),
        )
        if on
    ]
    if not idle:
        return None
    return (
        f"--eval-gate={settings.gate} decides on a run, and {', '.join(idle)} answers no case: "
        "drop the gate (or run the set to gate it)"
    )


def _repeated_arms(settings: Settings) -> list[str]:
    """One run cannot be two arms of one comparison (as the A/A check refuses)."""
    arms = {
        "--baseline": settings.baseline,
        "--baseline2": settings.baseline2,
        "--eval-label": settings.label,
        "--eval-resume": settings.resume,
    }
    named = [(flag, ref) for flag, ref in arms.items() if ref]
    problems = []
    for i, (flag, ref) in enumerate(named):
        for other, ref2 in named[i + 1 :]:
            # A label and a resume naming one run is that run resumed, not two arms.
            if ref == ref2 and {flag, other} != {"--eval-label", "--eval-resume"}:
                problems.append(f"{flag} and {other} both name {ref!r}: {REPEATED_ARM}")
    return problems


REPEATED_ARM = (
    "one run cannot be two arms of a comparison; every arm must be an independent run "
    "(run another post arm, or drop one flag)"
)


def _set_problems(settings: Settings, set_dir: Path, user_supplies: Supplies) -> list[str]:
    from pytest_evalloop.measure.comparison import read_compared, resolve_run, run_view
    from pytest_evalloop.session.runs import runs_dir_for
    from pytest_evalloop.sets import cases as sets

    try:
        config = sets.load_set_config(set_dir)
    except sets.SetError:
        return []  # collection reports a set.json it cannot read, naming the line
    parent = runs_dir_for(set_dir, settings.runs_dir)
    problems: list[str] = []
    if settings.tool_profile and not user_supplies("target"):
        from pytest_evalloop.targets.profiles import ProfileError, load_profile

        try:
            load_profile(settings.tool_profile, config, set_dir)
        except ProfileError as exc:
            problems.append(f"--eval-tool-profile={settings.tool_profile}: {exc}")
    refs = {
        "--baseline": settings.baseline,
        "--baseline2": settings.baseline2,
        "--eval-rejudge-from": settings.rejudge_from,
    }
    found: dict[str, Path] = {}
    for flag, ref in refs.items():
        if not ref:
            continue
        try:
            found[flag] = resolve_run(ref, set_dir=set_dir, runs_dir=parent)
            if flag != "--eval-rejudge-from":
                run_view(read_compared(found[flag]))
            else:
                problems += _source_problems(flag, ref, found[flag])
        except ValueError as exc:
            problems.append(f"{flag}={ref}: {exc}")
    for flag in ("--baseline", "--baseline2"):
        if flag in found and not problems:
            problems += _pin_problems(flag, found[flag], settings, set_dir, config, user_supplies)
    if settings.gate != "off" and not problems:
        problems += _comparable_problems(settings, set_dir, found)
    base, second = found.get("--baseline"), found.get("--baseline2")
    if base is not None and second is not None and base.resolve() == second.resolve():
        problems.append(f"--baseline and --baseline2 both resolve to {second}: {REPEATED_ARM}")
    if settings.resume and second is not None:
        try:
            resumed = resolve_run(settings.resume, set_dir=set_dir, runs_dir=parent)
        except ValueError:
            resumed = None  # the resume check reports it
        if resumed is not None and resumed.resolve() == second.resolve():
            problems.append(
                f"--baseline2 and --eval-resume both resolve to {second}: {REPEATED_ARM}"
            )
    return problems


def _source_problems(flag: str, ref: str, run_dir: Path) -> list[str]:
    """A rejudge judges stored answers again: only those of a run as it was written (its chain
    intact, its seal too once it closed), or the rejudge would carry an edit as its own."""
    from pytest_evalloop.ledger import seal
    from pytest_evalloop.ledger.reader import read_run_info

    check = seal.verify(run_dir)
    if check.broken is not None:
        return [f"{flag}={ref}: {run_dir.name} changed after it was written ({check.broken})"]
    closed = read_run_info(run_dir).status not in (None, "running")
    if not check.chained or (closed and not check.sealed):
        return [
            f"{flag}={ref}: {run_dir.name} carries no seal or no chain (written before them, "
            "or they were removed): its answers cannot be checked; rejudge a run as it closed"
        ]
    return []


def _comparable_problems(settings: Settings, set_dir: Path, found: dict[str, Path]) -> list[str]:
    """What the comparability rule (`measure.comparable`) can refuse before the first request:
    this session's own narrowing, and each stored arm alone (its status, selection, seal,
    model), its harness, its design against this session's, and a rejudge of it."""
    from pytest_evalloop.measure import comparable
    from pytest_evalloop.measure.comparison import read_compared, run_view
    from pytest_evalloop.session import selection

    gate = f"--eval-gate={settings.gate}"
    problems = []
    narrowing = [
        flag
        for flag in selection.narrowed_by(
            settings, selection.selected_paths(settings.args, set_dir)
        )
        if flag != "--ff"  # reorders, leaves nothing out
    ]
    if settings.shard is not None and settings.shard.count > 1:
        narrowing.append(f"--eval-shard={settings.shard}")
    if narrowing:
        problems.append(
            f"{gate} decides on whole runs, and this session narrows its selection or may stop "
            f"early ({', '.join(narrowing)}): drop {'it' if len(narrowing) == 1 else 'them'} "
            "(name the cases a fix aims at with --eval-targets instead; gate a sharded run "
            "once merged, with `evalloop gate`)"
        )
    design = selection.design(settings, set_dir)
    views = {}
    for flag in ("--baseline", "--baseline2"):
        if flag not in found:
            continue
        read = read_compared(found[flag])
        view = views[flag] = run_view(read)
        assert view.facts is not None
        side = "baseline" if flag == "--baseline" else "second post arm"
        why = [r.text for r in comparable.alone(view.facts, side)]
        if view.withheld:
            why.append(f"its pass rate is withheld ({view.withheld})")
        why += [
            r.text
            for r in comparable.design_refusals(view.facts.selection, design, side, "session")
        ]
        problems += [f"{flag}={found[flag].name}: {w}" for w in why]
    source = found.get("--eval-rejudge-from")
    if source is not None and "--baseline" in views:
        from pytest_evalloop.ledger.reader import read_run_info

        info = read_run_info(source)
        base = views["--baseline"].facts
        assert base is not None
        if (info.answers_from or info.session_id) == base.answer_origin:
            problems.append(
                f"--eval-rejudge-from={source.name} judges again the answers of --baseline="
                f"{found['--baseline'].name}: a rejudge pair measures the judge's noise, never "
                "a change; compare it with `evalloop noise`, or gate an independent run"
            )
    if len(views) == 2:
        a, b = views["--baseline"].facts, views["--baseline2"].facts
        assert a is not None and b is not None
        problems += [
            f"--baseline2={found['--baseline2'].name}: {r.text}"
            for r in comparable.refusals(a, b)
            if r.rule in ("independent",)
        ]
    return list(dict.fromkeys(problems))


def _pin_problems(
    flag: str,
    run_dir: Path,
    settings: Settings,
    set_dir: Path,
    config: SetConfig,
    user_supplies: Supplies,
) -> list[str]:
    """A gated comparison whose breaking pins already differ would only be refused after the
    run: say so before it (unless the user allowed the mismatch or does not gate)."""
    if settings.gate == "off" or settings.allow_pin_mismatch:
        return []
    from pytest_evalloop.answer.backends import default_role_pins
    from pytest_evalloop.ledger.reader import read_run_info
    from pytest_evalloop.measure import pins as pin_rules
    from pytest_evalloop.sets import cases as sets

    builtin = {r for r in ("answerer", "judge", "target") if not user_supplies(r)}
    try:
        configured = default_role_pins(settings, set_dir, config, roles=builtin)
    except ValueError:
        return []  # a target that cannot be pinned yet is reported when it is opened
    configured["datasetSha"] = sets.dataset_sha(set_dir)
    recorded = read_run_info(run_dir).model_dump(by_alias=True)
    # Before the run only the configured ids are known: compare the baseline's configured ones
    # (its served ones, when another was served, are what the gate compares after the run).
    for key in ("judgeModel", "answererModel"):
        recorded[key] = recorded.get(f"{key}Configured") or recorded.get(key)
    stored = pin_rules.pins_of(recorded)
    differ = pin_rules.classify({name: stored.get(name) for name in configured}, configured)
    if not differ.breaking:
        return []
    return [
        f"{flag}={run_dir.name}: its breaking pins differ from this session's "
        f"({pin_rules.describe(differ.breaking)}): the gate would refuse the comparison after "
        f"the run; re-run the baseline under the current configuration, or pass "
        f"{pin_rules.OVERRIDE_FLAG} to compare them anyway"
    ]
