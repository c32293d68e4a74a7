"""Collection: a set's `cases.jsonl` becomes one pytest item per selected case and sample.

Items are `pytest.Function`s whose callable is a plain function of fixture names, so pytest's
public fixture machinery resolves them and a user's conftest can override
`evalloop_answerer` / `evalloop_judge` / `evalloop_target` like any fixture.
"""

from __future__ import annotations

import gc
import os
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from pytest_evalloop.failures import EvalFailure
from pytest_evalloop.ledger import gcpolicy
from pytest_evalloop.ledger.files import EVENTS_FILE, RUN_FILE
from pytest_evalloop.stash import SETTINGS_KEY

if TYPE_CHECKING:
    # The set models pull in pydantic; a pytest run that collects no set never pays for them.
    from pytest_evalloop.sets import cases as sets


HEAP_KEY = pytest.StashKey["CollectedHeap"]()


def named_sets(config: pytest.Config) -> list[Path]:
    """The set directories the command line names: a set, a file in one, or a directory
    holding sets (walked as collection would, skipping what it skips)."""
    import os

    from pytest_evalloop.sets.pin import find_set_dir

    found: dict[Path, None] = {}
    for arg in config.args:
        path = arg_path(config, arg)
        if not path.exists() or not _may_be_a_set(path):
            continue
        own = find_set_dir(path)
        if own is not None:
            found[own.resolve()] = None
            continue
        if not path.is_dir():
            continue
        # As collection walks: through links (each folder once), past a run's folder (its
        # history is no set), into a folder that is merely named `runs`, and past what pytest
        # leaves out (`norecursedirs`, `--ignore`, `--ignore-glob`, `collect_ignore`, a
        # virtualenv): asked of pytest's own hook, so a set it will not collect never counts.
        ignored = config.hook.pytest_ignore_collect
        seen: set[str] = set()
        # Absolute, as collection's paths are: `--ignore` and `collect_ignore` name them so.
        for root, dirs, _files in os.walk(os.path.abspath(path), followlinks=True):
            real = os.path.realpath(root)
            if real in seen:
                dirs[:] = []
                continue
            seen.add(real)
            dirs[:] = sorted(
                d
                for d in dirs
                if not is_run_dir(Path(root, d))
                and not ignored(collection_path=Path(root, d), config=config)
            )
            here = find_set_dir(Path(root))
            if here is not None:
                found[here.resolve()] = None
    return list(found)


def names_a_set(config: pytest.Config) -> bool:
    """Whether a command-line argument is a set, or a file or case in one."""
    from pytest_evalloop.sets.pin import find_set_dir

    for arg in config.args:
        path = arg_path(config, arg)
        if path.exists() and _may_be_a_set(path) and find_set_dir(path) is not None:
            return True
    return False


def _may_be_a_set(path: Path) -> bool:
    """A folder, or a file collection makes case items of: another file in a set's folder (a
    Python test beside the cases) is not its set."""
    from pytest_evalloop.sets.pin import CASES_FILE, REGRESSIONS_FILE

    return path.name in (CASES_FILE, REGRESSIONS_FILE) or path.is_dir()


def arg_path(config: pytest.Config, arg: str) -> Path:
    """The path a command-line argument names, as collection reads it: under `--pyargs`, a
    dotted module or package name found on `sys.path` (pytest's own rule), else a path.

    Why: a set named by its package (`pytest --pyargs mypkg.evals`) was not seen before
    collection, so two sets sharing one run were refused only after the first was answered.
    """
    text = arg.split("::", 1)[0]
    if config.option.pyargs:
        found = _module_path(text, namespaces=bool(config.getini("consider_namespace_packages")))
        if found is not None:
            text = found
    return config.invocation_params.dir / text


def _module_path(name: str, *, namespaces: bool) -> str | None:
    """Where `--pyargs` finds module `name`: a module's file, a package's folder (a namespace
    package's only under `consider_namespace_packages`), or None (then it is read as a path).

    Found by asking the import system's finders, part by part, without importing anything:
    `importlib.util.find_spec` imports a dotted name's parents, so a package's `__init__`
    would run at configure, before a conftest prepared what it needs (a crash there).
    """
    spec = None
    for depth, part in enumerate(name.split(".")):
        if not part.isidentifier():
            return None
        if depth and not (spec is not None and spec.submodule_search_locations):
            return None  # a module has no submodules
        where = list(spec.submodule_search_locations) if depth and spec is not None else None
        full = ".".join(name.split(".")[: depth + 1])
        spec = _found(full, where)
        if spec is None:
            return None
    if spec is None:
        return None
    if not spec.submodule_search_locations:
        return spec.origin
    if namespaces:
        return str(list(spec.submodule_search_locations)[0])
    return None if spec.origin is None else os.path.dirname(spec.origin)


def _found(full: str, where: list[str] | None) -> Any:
    """The first finder's spec of `full` (None: none finds it, or a finder failed)."""
    for finder in sys.meta_path:
        find = getattr(finder, "find_spec", None)
        if find is None:
            continue
        try:
            spec = find(full, where)
        except Exception:  # noqa: BLE001 -- never fails configure: pytest says what it finds
            # The path finder builds a namespace package's path from its parent's, which it
            # reads from the imported parent: here, from the folders themselves.
            return _namespace_portion(full, where)
        if spec is not None:
            return spec
    return None


def _namespace_portion(full: str, where: list[str] | None) -> Any:
    """A namespace package's spec from its folders under `where` (None: there is none)."""
    import importlib.machinery

    last = full.rpartition(".")[2]
    folders = [os.path.join(w, last) for w in where or [] if os.path.isdir(os.path.join(w, last))]
    if not folders:
        return None
    spec = importlib.machinery.ModuleSpec(full, None, is_package=True)
    spec.submodule_search_locations = folders
    return spec


def is_run_dir(path: Path) -> bool:
    """Whether `path` is a run's directory: its ledger (`events.jsonl`) beside its `run.json`.
    Decided by what the directory holds, not by its name or `--eval-runs-dir`: a set, a test
    or a folder named `runs` elsewhere is never hidden, and a link to a run is still one."""
    # A file costs one failed stat (ENOTDIR); a directory that is no run, the same.
    events = os.path.join(path, EVENTS_FILE)
    return os.path.isfile(events) and os.path.isfile(os.path.join(path, RUN_FILE))


class CollectedHeap:
    """Keeps what collection built out of the cyclic garbage collector's way.

    Why: 10,000 case items are ~400,000 objects that live until the session ends, and every
    full GC pass walks all of them: the automatic passes while collection allocates them,
    pytest's own passes at unconfigure, and the interpreter's at exit, which then frees them
    one by one (together more CPU than collecting the items: ~2 s of 3.5 for 10,000 cases).
    Why it is sound: freezing never frees anything early and never keeps alive an object that
    reference counting frees; it only stops the collector from looking for reference cycles
    among the frozen objects (collection leaves a few dozen cyclic objects behind). When the
    process goes on after the session (pytester's in-process runs, a script calling
    `pytest.main`), `release` hands the frozen objects back to the collector at cleanup, after
    pytest's final passes; when the session is the process's last work (the `pytest` command,
    an xdist worker), they stay frozen and the process exits without walking them again.
    """

    def __init__(self, config: pytest.Config) -> None:
        self.config = config
        self.frozen = False
        self.settled = False

    @classmethod
    def arm(cls, config: pytest.Config) -> CollectedHeap:
        """Register the release as a cleanup. Call it before other plugins configure, so it
        runs after their cleanups (the cleanup stack runs the last registered first)."""
        heap = cls(config)
        config.stash[HEAP_KEY] = heap
        config.add_cleanup(heap.release)
        return heap

    def freeze(self) -> None:
        """Move every object alive now into the collector's permanent generation; nothing
        when the host program froze objects of its own first (`gc.freeze` before
        `pytest.main`): the release would hand them back with ours, since `gc.unfreeze` takes
        every frozen object, and their freeze is the host's to undo."""
        if not self.frozen and gc.get_freeze_count():
            return
        gc.freeze()
        if not self.frozen:
            gcpolicy.session_froze()
        self.frozen = True

    def settle(self) -> None:
        """At the session's end: collect cycles once, then freeze what is still alive.

        Why: a run imports the SDKs and builds its target after collection, so the heap that
        pytest's unconfigure then walks with five full collections (to surface unraisable
        exceptions) is hundreds of thousands of objects larger; measured, ~1.5 s of CPU at
        the end of every run. One collection here frees every garbage cycle, so their
        finalizers and any unraisable exception still reach pytest; what survives is alive and
        stays so, so the later passes have nothing to find among it. Once: later calls do
        nothing (the close asks for it in more than one path).
        """
        if self.frozen and not self.settled:
            self.settled = True
            gc.collect()
            gc.freeze()

    def release(self) -> None:
        """Hand what `freeze` set aside back to the collector, unless the process is ending."""
        # Decided now, not when armed: xdist marks its worker's config only after startup.
        if self.frozen:
            gcpolicy.session_unfroze()
            if not session_ends_process(self.config):
                gc.unfreeze()
        self.frozen = False


def session_ends_process(config: pytest.Config) -> bool:
    """Whether this pytest session is the last work of its process.

    True for the `pytest` command (`pytest`, `python -m pytest`) and an xdist worker; False
    when pytest was started in-process with plugin objects (pytester's in-process runs) or
    from any other program, which may go on after the session.
    """
    if config.invocation_params.plugins:
        return False
    if hasattr(config, "workerinput"):
        return True
    main = sys.modules.get("__main__")
    spec = getattr(main, "__spec__", None)
    if spec is not None and spec.name == "pytest.__main__":
        return True
    return Path(sys.argv[0]).name in ("pytest", "py.test") if sys.argv else False


class CasesFile(pytest.File):
    """A set's `cases.jsonl`: yields one :class:`CaseItem` per selected case and sample."""

    _shared_words: dict[str, str] | None = None

    def words(self, words: tuple[str, ...]) -> list[str]:
        """`words`, each as the one string of this file's cases that have it."""
        if self._shared_words is None:
            self._shared_words = {}
        return [self._shared_words.setdefault(word, word) for word in words]

    def collect(self) -> Iterator[pytest.Item | pytest.Collector]:
        from pytest_evalloop.sets import cases as sets

        set_dir = self.path.parent
        settings = self.config.stash[SETTINGS_KEY]
        try:
            config = sets.load_set_config(set_dir)
        except sets.SetError as exc:
            raise self.CollectError(str(exc)) from exc
        loaded = sets.load_cases(set_dir)
        # Each bad row is its own collection error, so one never hides another, and the good
        # rows still collect beside them (pytest then refuses to run a session with errors
        # unless --continue-on-collection-errors).
        for error in loaded.errors:
            yield BadRow.from_parent(self, name=f"line-{error.line}", error=error)
        if settings.verify_goldens:
            yield from self._golden_items(config, loaded.rows)
            return
        fixtureinfo = None
        for lineno, case in loaded.rows:
            if not _selected(case, settings.split):
                continue
            for sample in range(1, settings.samples + 1):
                item = CaseItem.build(
                    self,
                    config,
                    case,
                    lineno,
                    sample,
                    settings.samples,
                    fixtureinfo,
                    loaded.lines.get(lineno),
                )
                # Every item of a file has the same function and parent, so the same fixture
                # closure: resolve it once, not once per case (10,000 cases collect in seconds).
                fixtureinfo = item._fixtureinfo
                yield item

    def _golden_items(
        self, config: sets.SetConfig, rows: list[tuple[int, Any]]
    ) -> Iterator[pytest.Item | pytest.Collector]:
        # Imported here: goldens_items pulls in the set models, which a run without sets skips.
        from pytest_evalloop.goldens.items import GoldenItem

        for lineno, case in rows:
            if case.state != "excluded":
                yield GoldenItem.from_parent(self, name=case.qid, case=case, lineno=lineno)


class BadRow(pytest.Collector):
    """A row of `cases.jsonl` that cannot become an item; collecting it reports why."""

    def __init__(self, *, error: sets.RowError, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.error = error

    def collect(self) -> list[pytest.Item]:
        raise self.CollectError(f"{self.error}\n{self.error.hint}")


class NotASet(pytest.File):
    """A `cases.jsonl` (or `judge-regressions.jsonl`) with no `set.json` beside it.

    Why an error and not silence: the file says its directory is meant to be a set, and without
    this pytest would only say "no tests collected" (exit 5), leaving the user to guess.
    """

    def collect(self) -> list[pytest.Item]:
        from pytest_evalloop.sets import cases as sets

        raise self.CollectError(sets.missing_set_file_text(self.path.parent))


def _selected(case: sets.Case, split: str) -> bool:
    if case.state != "selected":
        return False
    return split == "all" or case.split == split


# On the function, so pytest.Function gives every item the mark as it builds it (one mark object
# shared by all items, instead of one add_marker call per item).
@pytest.mark.evalloop
def run_case(evalloop_case: Any, evalloop_runtime: Any) -> None:
    """The body of every case item: turn the attempt's verdict into a pytest outcome.

    The attempt itself ran during setup (the `evalloop_runtime` fixture): match passes,
    no_match fails with a short domain report, and what is neither (near_match, needs_human,
    not scorable, a golden the judge showed wrong) is skipped with its own status word and reason.
    """
    result = evalloop_runtime
    if result.status == "no_match":
        raise EvalFailure(result.report, result.status)
    skipped = verdict_skip_text(result)
    if skipped is not None:
        pytest.skip(skipped)


def decided_by(result: Any, report: pytest.TestReport, call: pytest.CallInfo[None]) -> bool:
    """Whether a case's call phase ended as its verdict decided: passed, or skipped by
    `run_case` for an undecided verdict (not by a plugin's hook: its skip is its own)."""
    if report.passed:
        return True
    raised = None if call.excinfo is None else call.excinfo.value
    return report.skipped and getattr(raised, "msg", None) == verdict_skip_text(result)


def verdict_skip_text(result: Any) -> str | None:
    """The reason `run_case` skips an undecided verdict with; None for match and no_match.

    Only this skip of a case's call phase carries the verdict to its report (`decided_by`): a
    skip a plugin's call hook raised is that plugin's (a verdict shown on it made pytest count a
    skipped case as passed)."""
    if result.status in ("match", "no_match"):
        return None
    reason = gold_wrong_reason(result) if result.status == "gold_wrong" else skip_reason(result)
    return with_outcome(result.status, reason)


def with_outcome(status: str, reason: str) -> str:
    """A skip reason led by the outcome word (`near_match: rounded to tens`).

    A skip is how pytest carries near_match, needs_human, unscored and gold_wrong, and a junit
    reader sees only `<skipped message=...>`: without the word every one of them reads as a
    plain skip. The terminal's own short summary, which prints the word already, drops it
    again (`shortsummary.skip_text`).
    """
    return f"{status}: {reason}" if reason else status


def gold_wrong_reason(result: Any) -> str:
    """Why a gold_wrong item was skipped: the judge's evidence against the key, and its verdict."""
    note = " ".join(str(result.gold_note or "no note").split())
    return (
        f"the judge showed the golden wrong: {note}; judge said {result.verdict}; out of every "
        "aggregate until the golden is repaired"
    )


def skip_reason(result: Any) -> str:
    """Why an undecided item was skipped, in one line (`with_outcome` puts the outcome word
    before it): `-v` shows it beside the status word, `-rs` after the id."""
    parts: list[str] = []
    explained = result.reason == "aborted" or not getattr(result, "answered", True)
    for part in (result.reason, result.why, result.report if explained else ""):
        part = " ".join(str(part or "").split())
        if part and part not in parts:
            parts.append(part)
    text = ": ".join(parts)
    return text if len(text) <= 300 else text[:299] + "…"


class CaseItem(pytest.Function):
    """One attempt at one case: `…/cases.jsonl::<qid>` (with `[sN]` when samples > 1)."""

    set_config: sets.SetConfig
    sample: int | None
    _case: sets.Case | None = None
    _line: sets.LineRef | None = None

    @classmethod
    def build(
        cls,
        parent: CasesFile,
        config: sets.SetConfig,
        case: sets.Case,
        lineno: int,
        sample: int,
        samples: int,
        fixtureinfo: Any = None,
        line: sets.LineRef | None = None,
    ) -> CaseItem:
        name = case.qid if samples == 1 else f"{case.qid}[s{sample}]"
        item = cls.from_parent(parent, name=name, callobj=run_case, fixtureinfo=fixtureinfo)
        item.case = case
        item._line = line
        item.set_config = config
        item.sample = sample if samples > 1 else None
        item.lineno = lineno
        # -k matches names and these extra words, so `-k holdout` or `-k fanout` select cases.
        # One string per word for the whole file: pytest keeps every item's set to the end.
        item.extra_keyword_matches.update(parent.words((case.split, *case.tags)))
        return item

    @property
    def case(self) -> sets.Case:
        """The item's row of `cases.jsonl`; read back from its line if it was let go
        (`sets.CaseChanged` when that line was changed or removed since collection)."""
        if self._case is None:
            from pytest_evalloop.sets import cases as sets

            assert self._line is not None  # let go only when it can be read back
            self._case = sets.case_at(self.path, self._line, self.lineno, self.qid)
        return self._case

    @case.setter
    def case(self, case: sets.Case) -> None:
        self._case = case

    @property
    def qid(self) -> str:
        """The case's qid (the item's name without its sample), known without the row."""
        return self.name.split("[", 1)[0]

    def let_case_go(self) -> None:
        """Drop the parsed row once the item has run (the run's memory stays flat in its size:
        pytest keeps every item to the session's end, and a row with its golden is ~8 KB)."""
        if self._line is not None:
            self._case = None

    @property
    def set_dir(self) -> Path:
        """The directory of the set this case belongs to."""
        return self.path.parent

    def reportinfo(self) -> tuple[Path, int | None, str]:
        return self.path, self.lineno - 1, f"case {self.qid}"

    def repr_failure(self, excinfo: pytest.ExceptionInfo[BaseException], style: Any = None) -> Any:
        if isinstance(excinfo.value, EvalFailure):
            return excinfo.value.report
        return super().repr_failure(excinfo)

    lineno: int


def drop_repeats(config: pytest.Config, items: list[pytest.Item]) -> None:
    """A set reached twice (its folder and a link to it): each case is answered once. pytest
    collects a file once per path it is named by, and both copies went into the one run of
    the set, every case answered and paid for twice."""
    real: dict[Path, Path] = {}
    seen: set[tuple[Path, str, int | None]] = set()

    def first(item: pytest.Item) -> bool:
        if not isinstance(item, CaseItem):
            return True
        set_dir = item.set_dir
        where = real.get(set_dir) or real.setdefault(set_dir, set_dir.resolve())
        key = (where, item.qid, item.sample)
        if key in seen:
            return False
        seen.add(key)
        return True

    _deselect_unless(config, items, first)


def keep_shard(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Under `--eval-shard=I/N`, deselect the case items of the other shards."""
    shard = config.stash[SETTINGS_KEY].shard
    if shard is not None:
        _deselect_unless(
            config, items, lambda item: not isinstance(item, CaseItem) or shard.holds(item.qid)
        )


def _deselect_unless(
    config: pytest.Config, items: list[pytest.Item], keep: Callable[[pytest.Item], bool]
) -> None:
    """Deselect (as pytest's own `-k` does) the items `keep` turns down, in place."""
    kept: list[pytest.Item] = []
    other: list[pytest.Item] = []
    for item in items:
        (kept if keep(item) else other).append(item)
    if other:
        config.hook.pytest_deselected(items=other)
        items[:] = kept
