"""Command-line options and ini keys, and the settings object built from them once.

Every option lives in one group, `evalloop`. Each has an ini twin (`eval_*`), and the command line
wins over the ini file, which wins over the default. Bad values raise `pytest.UsageError` naming
the option, the value and the fix, before any item runs.
"""

from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import pytest

from pytest_evalloop.sets.names import name_problem
from pytest_evalloop.sets.partition import Shard, parse_shard, run_group

DEFAULT_ANSWERER_MODEL = "claude-sonnet-4-6"
DEFAULT_JUDGE_MODEL = "claude-opus-4-6"


@dataclass(frozen=True)
class Opt:
    """One option: its flag, ini twin, default and help."""

    flag: str
    default: Any
    help: str
    choices: tuple[str, ...] | None = None
    kind: type = str
    flag_only: bool = False
    path: bool = False
    """A file or folder: from an ini file, relative to that file's folder (pytest's rule)."""

    @property
    def dest(self) -> str:
        return self.flag.lstrip("-").replace("-", "_")

    @property
    def ini(self) -> str:
        """The ini twin: `eval_*` always, so a pytest.ini key never collides with another plugin's."""
        return self.dest if self.dest.startswith("eval_") else f"eval_{self.dest}"


OPTIONS: tuple[Opt, ...] = (
    Opt("--eval-split", "all", "Which split to collect", ("dev", "holdout", "all")),
    Opt("--eval-samples", 1, "Attempts per case (items get a [sN] suffix when > 1)", kind=int),
    Opt(
        "--eval-judge-samples",
        1,
        "Judge each answer this many times with fresh judges (no answerer cost); the majority "
        "counts, a split is needs_human (judge_split)",
        kind=int,
    ),
    Opt(
        "--eval-answerer",
        "anthropic",
        "Answerer backend: anthropic (Messages API tool loop) or claude-code (the claude CLI)",
        ("anthropic", "claude-code"),
    ),
    Opt("--eval-answerer-model", DEFAULT_ANSWERER_MODEL, "Model id the answerer uses"),
    Opt("--eval-judge-model", DEFAULT_JUDGE_MODEL, "Model id the judge uses"),
    Opt("--eval-max-turns", 16, "Answerer turn limit per attempt", kind=int),
    Opt(
        "--eval-attempt-timeout",
        300.0,
        "Answerer wall-clock limit per attempt, seconds",
        kind=float,
    ),
    Opt("--eval-max-tokens", 400_000, "Answerer token budget per attempt (input+output)", kind=int),
    Opt(
        "--eval-judge-timeout",
        300.0,
        "Judge wall-clock limit per attempt, all calls and retries included, seconds; "
        "exceeding it is a harness error",
        kind=float,
    ),
    Opt(
        "--eval-request-timeout",
        120.0,
        "Limit of each Messages API request, seconds (the SDK's timeout); a request that "
        "times out is retried, then a harness error",
        kind=float,
    ),
    Opt("--eval-phase", "baseline", "Phase recorded on the run and in its label"),
    Opt("--eval-label", None, "Run label (default <set>-<phase>-<nn>, nn the next free number)"),
    Opt("--eval-runs-dir", None, "Directory for run ledgers (default <set>/runs)", path=True),
    Opt("--eval-target", None, "External MCP target: an http(s) URL or a command line (stdio)"),
    Opt(
        "--eval-tool-profile",
        None,
        "Tool profile of the target: embedded, publisher, or a JSON profile file",
    ),
    Opt("--eval-concurrency", 16, "Items in flight at once in each process", kind=int),
    Opt("--eval-rpm", 0, "Requests per minute for the whole run (0: no limit)", kind=int),
    Opt("--eval-tpm", 0, "Tokens per minute for the whole run (0: no limit)", kind=int),
    Opt("--eval-retries", 6, "Endpoint retries per call on 429/529/5xx/timeouts", kind=int),
    Opt(
        "--eval-verify-goldens",
        False,
        "Collect one item per case that re-derives its golden on the truth connection (offline)",
        kind=bool,
        flag_only=True,
    ),
    Opt(
        "--eval-prices",
        None,
        "JSON file of extra model prices (USD per million tokens)",
        path=True,
    ),
    Opt(
        "--eval-max-cost",
        None,
        "Spend ceiling in USD for this session, never passed: each attempt reserves the most "
        "it can cost before it starts and starts only if that fits; the run stops before the "
        "ceiling (aborted) and --eval-resume can finish it",
        kind=float,
    ),
    Opt("--baseline", None, "Baseline run (label or run dir) to compare this run against"),
    Opt("--baseline2", None, "A second post arm (label or run dir) for targeted mode"),
    Opt(
        "--eval-gate",
        "off",
        "Gate the exit status on the comparison: bar, bar+significant (the bar and a paired "
        "test under --eval-alpha), no-regressions or off",
        ("bar", "bar+significant", "no-regressions", "off"),
    ),
    Opt(
        "--eval-alpha",
        0.05,
        "With --eval-gate=bar+significant: the paired test's p-value must be under this",
        kind=float,
    ),
    Opt(
        "--eval-allow-pin-mismatch",
        False,
        "Let the gate decide although a breaking pin (dataset, judge model/version, rubric, "
        "answerer model/backend, target) differs from the baseline's: a rebase, said so",
        kind=bool,
    ),
    Opt("--eval-targets", None, "Targeted mode: qids named before the run (q1,q2 or @file)"),
    Opt("--eval-noise-band", None, "Flip count an A/A pair showed (untargeted noise)", kind=int),
    Opt("--eval-rejudge-from", None, "Judge the stored answers of a run afresh (no answerer)"),
    Opt(
        "--eval-estimate",
        False,
        "Print the expected cost of the selected attempts under this design (from the newest "
        "complete comparable run, else a token model's range) and what each would reserve "
        "under --eval-max-cost; nothing is answered or paid, no endpoint needed, exit 0",
        kind=bool,
        flag_only=True,
    ),
    Opt(
        "--eval-judge-batch",
        False,
        "With --eval-rejudge-from: send the judge calls through the Message Batches API (half "
        "the price, no latency promise)",
        kind=bool,
    ),
    Opt("--eval-resume", None, "Finish an interrupted run, answering only unscored cases"),
    Opt(
        "--eval-check-judge",
        False,
        "Collect judge-regressions.jsonl fixtures instead of cases: the judge must agree",
        kind=bool,
        flag_only=True,
    ),
    Opt(
        "--eval-repeat",
        1,
        "With --eval-check-judge: judge each fixture N times; split verdicts are FLAKY",
        kind=int,
    ),
    Opt(
        "--eval-answer-unscorable",
        False,
        "Answer cases whose golden cannot be scored (provisional, invalid, ambiguous, missing) "
        "anyway, for a later rejudge; by default they are not answered",
        kind=bool,
    ),
    Opt(
        "--eval-allow-aborted",
        False,
        "Let a run that did not finish (aborted: the spend ceiling, four harness errors in a "
        "row; interrupted: Ctrl-C, -x) exit by its items as before; by default it exits 8",
        kind=bool,
    ),
    Opt(
        "--eval-allow-unmeasured",
        False,
        "Let a run that measured nothing (most attempts not submitted, or none decided) exit "
        "by its items; by default it exits 15 after a WARNING naming the most common cause",
        kind=bool,
    ),
    Opt(
        "--eval-allow-golden-drift",
        False,
        "Run even when the pre-run golden check finds a drifted golden (recorded in run.json "
        "goldenCheck); by default the session stops before answering",
        kind=bool,
    ),
    Opt(
        "--eval-report",
        "on",
        "Write runs/<runId>/report.html (and refresh runs/index.html) when a run closes",
        ("on", "off"),
    ),
    Opt(
        "--eval-report-charts",
        "on",
        "Draw the charts of report.html and runs/index.html (pygal, in a child process: "
        "about 0.1 s of CPU per run); off writes the same pages, every figure and case, "
        "without them (`evalloop report <run>` draws them later)",
        ("on", "off"),
    ),
    Opt(
        "--eval-shard",
        None,
        "Run only shard I of N of the cases (by a stable hash of the qid; every sample of a case "
        "in one shard): I/N, I from 1, or an environment variable with an offset, e.g. "
        "JOB_COMPLETION_INDEX+1/8; merge the shards with `evalloop merge`",
    ),
    Opt(
        "--eval-run-group",
        None,
        "The id every shard of one sharded run shares (default: the CI's run id, "
        "GITHUB_RUN_ID, CI_PIPELINE_ID, BUILDKITE_BUILD_ID, or EVALLOOP_RUN_GROUP)",
    ),
    Opt(
        "--eval-rate-share",
        "split",
        "Under --eval-shard: split (each shard takes 1/N of --eval-rpm and --eval-tpm, so N "
        "shards on one key keep its limit) or whole (each shard takes all of it)",
        ("split", "whole"),
    ),
    Opt(
        "--eval-summary-md",
        None,
        "Write the headline, flip table and gate decision as Markdown to this file "
        "(e.g. $GITHUB_STEP_SUMMARY)",
        path=True,
    ),
    Opt(
        "--eval-order",
        "file",
        "Order of eval items: file (as collected, whatever a reordering plugin such as "
        "pytest-randomly does to other tests) or plugins (reordering plugins order them too)",
        ("file", "plugins"),
    ),
)


def add_options(parser: pytest.Parser) -> None:
    """Register the `evalloop` option group and the ini twins."""
    group = parser.getgroup("evalloop", "LLM evaluation loop (pytest-evalloop)")
    for opt in OPTIONS:
        ini = opt.ini
        if opt.kind is bool:
            group.addoption(
                opt.flag, action="store_true", default=None, dest=opt.dest, help=opt.help
            )
            if not opt.flag_only:
                parser.addini(ini, help=opt.help + " (true/false)", default=None)
            continue
        shown = "" if opt.default is None else f" (default: {opt.default})"
        group.addoption(
            opt.flag, action="store", default=None, dest=opt.dest, help=opt.help + shown
        )
        if not opt.flag_only:
            parser.addini(ini, help=opt.help, default=None)


@dataclass(frozen=True)
class Settings:
    """Every evalloop setting, resolved once per process and kept in `config.stash`."""

    split: Literal["dev", "holdout", "all"]
    samples: int
    answerer: str
    answerer_model: str
    judge_model: str
    max_turns: int
    attempt_timeout: float
    max_tokens: int
    phase: str
    label: str | None
    runs_dir: Path | None
    target: str | None
    tool_profile: str | None
    concurrency: int
    rpm: int
    tpm: int
    retries: int
    verify_goldens: bool
    prices: Path | None
    baseline: str | None = None
    baseline2: str | None = None
    judge_samples: int = 1
    gate: str = "off"
    alpha: float = 0.05
    allow_pin_mismatch: bool = False
    targets: str | None = None
    noise_band: int | None = None
    rejudge_from: str | None = None
    resume: str | None = None
    check_judge: bool = False
    repeat: int = 1
    judge_timeout: float = 300.0
    request_timeout: float = 120.0
    answer_unscorable: bool = False
    allow_golden_drift: bool = False
    allow_aborted: bool = False
    """`--eval-allow-aborted`: a run that did not finish exits by its items, not 8."""
    allow_unmeasured: bool = False
    """`--eval-allow-unmeasured`: a run that measured nothing exits by its items, not 15."""
    report: bool = True
    report_charts: bool = True
    summary_md: Path | None = None
    keyword: str = ""
    """pytest's `-k`: which cases are measured (part of the run's design)."""
    markexpr: str = ""
    """pytest's `-m`."""
    args: tuple[str, ...] = ()
    """The files and node ids named on the command line, each path made absolute (which cases
    of a set are measured: part of the run's design, `selection.selected_paths`)."""
    narrowing: tuple[str, ...] = ()
    """pytest's own flags that can leave cases of the split out (`--lf`, `--sw`, `--deselect`,
    `-x`/`--maxfail`; `--ff` reorders): recorded in run.json `selection.narrowedBy`."""
    shard: Shard | None = None
    run_group: str | None = None
    rate_share: str = "split"
    max_cost: float | None = None
    judge_batch: bool = False
    estimate: bool = False
    """`--eval-estimate`: print the expected cost and exit."""
    """`--eval-judge-batch`: the judge's calls go through the Message Batches API."""
    """`--eval-max-cost`: this session's spend ceiling in USD (None: no ceiling)."""
    order: str = "file"
    """`--eval-order`: `file` keeps eval items in collection order under reordering plugins."""

    @property
    def limiter_rates(self) -> tuple[int, int]:
        """This process's rpm and tpm: the run's, or under `--eval-shard` its shard's share."""
        from pytest_evalloop.model_api.ratelimit import share

        if self.shard is None or self.rate_share == "whole":
            return self.rpm, self.tpm
        return share(self.rpm, self.shard.count), share(self.tpm, self.shard.count)


def _raw(config: pytest.Config, opt: Opt) -> Any:
    value = config.getoption(opt.dest, default=None)
    if value is not None and opt.path:
        # `--eval-runs-dir=~/runs`: no shell expands a `~` after `=`. An empty one
        # (`--eval-runs-dir=$UNSET`) names no folder: the ini's, else the default.
        value = os.path.expanduser(str(value)) or None
    if value is None and not opt.flag_only:
        value = config.getini(opt.ini)
        if value in ("", [], None):
            value = None
        elif opt.path:
            value = ini_path(config, str(value))
    return opt.default if value is None else value


def ini_path(config: pytest.Config, value: str) -> str:
    """A path an ini key gives, as pytest reads its own: from the ini file's folder (without
    one, from where pytest started), so the same folder is meant wherever under the project
    pytest starts; `~` is the home folder."""
    base = config.inipath.parent if config.inipath else config.invocation_params.dir
    return str(base / os.path.expanduser(value))


def _convert(opt: Opt, value: Any) -> Any:
    if value is None or opt.kind is str:
        if opt.choices and value not in opt.choices:
            choices = "|".join(opt.choices)
            raise pytest.UsageError(
                f"{opt.flag}={value!r} is not one of {choices}; pick one of those"
            )
        return value
    if opt.kind is bool:
        return value if isinstance(value, bool) else _ini_bool(opt, value)
    try:
        return opt.kind(value)
    except (TypeError, ValueError):
        # An option off by default (None) has no default to show: a plain number stands in.
        example = opt.default if opt.default is not None else opt.kind(5)
        raise pytest.UsageError(
            f"{opt.flag}={value!r} is not a valid {opt.kind.__name__}; give e.g. {opt.flag}={example}"
        ) from None


_TRUE = ("true", "yes", "on", "1")
_FALSE = ("false", "no", "off", "0")


def _ini_bool(opt: Opt, value: Any) -> bool:
    # An ini value is text, and bool("false") is True: read the words, refuse anything else.
    word = str(value).strip().lower()
    if word in _TRUE or word in _FALSE:
        return word in _TRUE
    raise pytest.UsageError(
        f"ini {opt.ini} = {value!r} is not a boolean; write {opt.ini} = true or false"
    )


def _positive(name: str, value: float, minimum: float = 1) -> None:
    if not math.isfinite(value):
        # NaN passed `value < minimum` (every comparison with it is false), and no limit of
        # either can be kept in run.json, which holds JSON numbers only.
        raise pytest.UsageError(f"{name}={value} must be a finite number, at least {minimum}")
    if value < minimum:
        raise pytest.UsageError(f"{name}={value} must be at least {minimum}")


def _absolute_args(config: pytest.Config) -> tuple[str, ...]:
    """`config.args` with each path part absolute (`path::node` keeps its node part)."""
    base = Path(config.invocation_params.dir)
    out = []
    for arg in config.args:
        path, sep, node = str(arg).partition("::")
        out.append(str((base / path).resolve()) + sep + node)
    return tuple(out)


def build_settings(config: pytest.Config) -> Settings:
    """Resolve CLI > ini > default for every option, validating as it goes."""
    values = {opt.dest: _convert(opt, _raw(config, opt)) for opt in OPTIONS}
    if values["eval_rejudge_from"] and values["eval_phase"] == "baseline":
        values["eval_phase"] = "rejudge"
    _positive("--eval-samples", values["eval_samples"])
    _positive("--eval-judge-samples", values["eval_judge_samples"])
    _positive("--eval-max-turns", values["eval_max_turns"])
    _positive("--eval-attempt-timeout", values["eval_attempt_timeout"], 0.001)
    _positive("--eval-max-tokens", values["eval_max_tokens"])
    _positive("--eval-judge-timeout", values["eval_judge_timeout"], 0.001)
    _positive("--eval-request-timeout", values["eval_request_timeout"], 0.001)
    _positive("--eval-concurrency", values["eval_concurrency"])
    _positive("--eval-rpm", values["eval_rpm"], 0)
    _positive("--eval-tpm", values["eval_tpm"], 0)
    _positive("--eval-retries", values["eval_retries"], 0)
    _positive("--eval-repeat", values["eval_repeat"])
    if not 0 < values["eval_alpha"] < 1:
        raise pytest.UsageError(
            f"--eval-alpha={values['eval_alpha']} must be between 0 and 1 (exclusive), e.g. 0.05"
        )
    if values["eval_max_cost"] is not None and not 0 < values["eval_max_cost"] < float("inf"):
        raise pytest.UsageError(
            f"--eval-max-cost={values['eval_max_cost']} must be a positive amount of USD, "
            "e.g. --eval-max-cost=5"
        )
    if values["eval_noise_band"] is not None:
        _positive("--eval-noise-band", values["eval_noise_band"], 0)
    if values["eval_judge_batch"] and not values["eval_rejudge_from"]:
        raise pytest.UsageError(
            "--eval-judge-batch needs --eval-rejudge-from: only a rejudge has no answerer "
            "waiting on each verdict"
        )
    if values["eval_rejudge_from"] and values["eval_resume"]:
        raise pytest.UsageError(
            "--eval-rejudge-from and --eval-resume cannot be combined; pick one"
        )
    if values["baseline2"] and not values["baseline"]:
        raise pytest.UsageError("--baseline2 needs --baseline (the pre-change run)")
    for flag, key in (("--eval-label", "eval_label"), ("--eval-phase", "eval_phase")):
        problem = values[key] is not None and name_problem(flag, str(values[key]))
        if problem:
            raise pytest.UsageError(problem)
    prices = values["eval_prices"]
    if prices is not None and not Path(prices).is_file():
        what = "not a regular file" if Path(prices).exists() else "no such file"
        raise pytest.UsageError(
            f"--eval-prices (ini eval_prices) {prices}: {what}; give a JSON price file"
        )
    if prices is not None:
        from pytest_evalloop.model_api.pricing import price_table

        try:
            price_table(Path(prices))  # read now: a bad price is a usage error, not a traceback
        except ValueError as exc:
            raise pytest.UsageError(f"--eval-prices: {exc}") from None
    runs_dir = values["eval_runs_dir"]
    shard, group = _shard(values)
    return Settings(
        split=values["eval_split"],
        samples=values["eval_samples"],
        judge_samples=values["eval_judge_samples"],
        answerer=values["eval_answerer"],
        answerer_model=values["eval_answerer_model"],
        judge_model=values["eval_judge_model"],
        max_turns=values["eval_max_turns"],
        attempt_timeout=values["eval_attempt_timeout"],
        max_tokens=values["eval_max_tokens"],
        judge_timeout=values["eval_judge_timeout"],
        request_timeout=values["eval_request_timeout"],
        phase=values["eval_phase"],
        label=values["eval_label"],
        runs_dir=Path(runs_dir).resolve() if runs_dir else None,
        target=values["eval_target"],
        tool_profile=values["eval_tool_profile"],
        concurrency=values["eval_concurrency"],
        rpm=values["eval_rpm"],
        tpm=values["eval_tpm"],
        retries=values["eval_retries"],
        verify_goldens=values["eval_verify_goldens"],
        prices=Path(prices) if prices else None,
        baseline=values["baseline"],
        baseline2=values["baseline2"],
        gate=values["eval_gate"],
        alpha=values["eval_alpha"],
        allow_pin_mismatch=values["eval_allow_pin_mismatch"],
        targets=values["eval_targets"],
        noise_band=values["eval_noise_band"],
        rejudge_from=values["eval_rejudge_from"],
        resume=values["eval_resume"],
        check_judge=values["eval_check_judge"],
        repeat=values["eval_repeat"],
        answer_unscorable=values["eval_answer_unscorable"],
        allow_golden_drift=values["eval_allow_golden_drift"],
        allow_aborted=values["eval_allow_aborted"],
        allow_unmeasured=values["eval_allow_unmeasured"],
        report=values["eval_report"] == "on",
        report_charts=values["eval_report_charts"] == "on",
        summary_md=Path(values["eval_summary_md"]) if values["eval_summary_md"] else None,
        keyword=getattr(config.option, "keyword", "") or "",
        markexpr=getattr(config.option, "markexpr", "") or "",
        args=_absolute_args(config),
        narrowing=narrowing_flags(config),
        shard=shard,
        run_group=group,
        rate_share=values["eval_rate_share"],
        max_cost=values["eval_max_cost"],
        judge_batch=values["eval_judge_batch"],
        estimate=values["eval_estimate"],
        order=values["eval_order"],
    )


def narrowing_flags(config: pytest.Config) -> tuple[str, ...]:
    """pytest's flags on this command line that can leave cases out or stop the run early, as
    the user would type them (`-k` and `-m` are recorded apart, as `keyword`/`markexpr`)."""
    option = config.option
    found = []
    if getattr(option, "lf", False):
        found.append("--lf")
    if getattr(option, "failedfirst", False):
        found.append("--ff")
    if getattr(option, "stepwise", False) or getattr(option, "stepwise_skip", False):
        found.append("--sw")
    found += [f"--deselect={node}" for node in getattr(option, "deselect", None) or ()]
    maxfail = int(getattr(option, "maxfail", 0) or 0)
    if maxfail:
        exitfirst = maxfail == 1 and _last_stop_flag(config) != "--maxfail"
        found.append("-x" if exitfirst else f"--maxfail={maxfail}")
    return tuple(found)


def _last_stop_flag(config: pytest.Config) -> str | None:
    """`-x` or `--maxfail`, whichever pytest read last (both set one option, the last wins):
    the ini file's addopts, then PYTEST_ADDOPTS, then the command line, as pytest reads them."""
    import shlex

    try:
        ini = [str(arg) for arg in config.getini("addopts")]
    except (ValueError, TypeError):
        ini = []
    words = [
        *ini,
        *shlex.split(os.environ.get("PYTEST_ADDOPTS", "")),
        *config.invocation_params.args,
    ]
    last = None
    for word in map(str, words):
        if word.startswith("--maxfail"):
            last = "--maxfail"
        elif word == "--exitfirst" or _short_flags_hold_x(word):
            last = "-x"
    return last


# pytest's (and xdist's) short options that take a value: in `-rx` or `-kx` the x is the value.
_SHORT_WITH_VALUE = frozenset("kmpcoWrn")


def _short_flags_hold_x(word: str) -> bool:
    """Whether a cluster of short flags (`-x`, `-xvs`, `-vx`) sets -x."""
    if not re.fullmatch(r"-[A-Za-z]+", word):
        return False
    for letter in word[1:]:
        if letter == "x":
            return True
        if letter in _SHORT_WITH_VALUE:
            return False  # the rest is that flag's value
    return False


def answers_no_case(option: Any) -> bool:
    """Whether pytest's own flags make this a session that runs no test, so answers no case:
    `--collect-only`, `--setup-plan` and `--setup-only`. An attempt runs in a fixture's setup
    (`evalloop_runtime`), so `--setup-only`, which sets every fixture up, would otherwise
    answer and pay for every case it shows."""
    return bool(
        option.collectonly
        or getattr(option, "setuponly", False)
        or getattr(option, "setupplan", False)
    )


def gate_settings(**gate: Any) -> Settings:
    """Every option at its default but the gate's: what `evalloop gate` hands the in-run gate."""
    defaults = {opt.dest: opt.default for opt in OPTIONS}
    return Settings(
        split=defaults["eval_split"],
        samples=defaults["eval_samples"],
        answerer=defaults["eval_answerer"],
        answerer_model=defaults["eval_answerer_model"],
        judge_model=defaults["eval_judge_model"],
        max_turns=defaults["eval_max_turns"],
        attempt_timeout=defaults["eval_attempt_timeout"],
        max_tokens=defaults["eval_max_tokens"],
        phase=defaults["eval_phase"],
        label=None,
        runs_dir=None,
        target=None,
        tool_profile=None,
        concurrency=defaults["eval_concurrency"],
        rpm=defaults["eval_rpm"],
        tpm=defaults["eval_tpm"],
        retries=defaults["eval_retries"],
        verify_goldens=False,
        prices=None,
        **gate,
    )


def _shard(values: dict[str, Any]) -> tuple[Shard | None, str | None]:
    """`--eval-shard` and the run group it belongs to (a shard needs one, or no merge can tell
    its siblings from another run's)."""
    spec = values["eval_shard"]
    group = run_group(values["eval_run_group"])
    if spec is None:
        return None, group
    try:
        shard = parse_shard(str(spec))
    except ValueError as exc:
        raise pytest.UsageError(str(exc)) from None
    if group is None:
        raise pytest.UsageError(
            f"--eval-shard={spec}: no run group; pass --eval-run-group=<id> (the same for every "
            "shard of this run), or run under a CI that sets GITHUB_RUN_ID, CI_PIPELINE_ID or "
            "BUILDKITE_BUILD_ID, or set EVALLOOP_RUN_GROUP"
        )
    return shard, group


def endpoint_missing() -> str | None:
    """Why the Anthropic endpoint is not configured, or None when it is."""
    names = ("ANTHROPIC_API_KEY", "ANTHROPIC_AUTH_TOKEN", "ANTHROPIC_BASE_URL")
    if any(os.environ.get(name) for name in names):
        return None
    return (
        "no Anthropic endpoint configured: set ANTHROPIC_API_KEY (and ANTHROPIC_BASE_URL for an "
        "Anthropic-compatible endpoint other than the default); to see a run without a key, "
        "`evalloop demo` answers the example set against a loopback fake; the offline parts "
        "still run: --eval-verify-goldens and --collect-only"
    )
