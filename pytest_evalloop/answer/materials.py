"""The judge's materials for one prediction, and the model files they are read from.

What the judge is shown of a case (:func:`materials_for`: the question, the golden, the
re-execution as `reexecution.reexecution_state` decides it, the answer) and the definitions of
the model the answerer's final call queried (:func:`model_definitions`): the entities a case
expects, from the embedded target's model file; any other target's model source, read by the
conductor from the files beside the set (:func:`served_model_file`). The same files are the
model under test that a file tool must not read (:func:`model_paths`, contamination's).
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

from pytest_evalloop.answer.reexecution import reexecution_state, shown_call
from pytest_evalloop.judge.judge import JudgeMaterials
from pytest_evalloop.roles.contract import QueryOutcome
from pytest_evalloop.sets import cases as sets

MODEL_ARGS = ("packageName", "modelPath")
"""Query-call arguments that name the model queried (Publisher's): the judge is shown that
model's definitions."""


def materials_for(
    case: sets.Case,
    golden_value: Any,
    *,
    final_query: str | None,
    prediction: QueryOutcome | None,
    answer_text: str | None,
    definitions: str,
    definitions_shared: bool = False,
    ran: bool = True,
    decided: tuple[Any, str | None] | None = None,
) -> Any:
    """The judge's materials for one prediction of a case (a run's, or a stored fixture's).

    What the judge is told about the re-execution is decided once, by
    `reexecution.reexecution_state`: rows (`ok`, `unran`, `literal`), `failed` (the target's
    error), `not_run` (why rows are unavailable) or `no_query`. ``ran``: whether the answerer
    itself ran the final query. ``decided``: that rule's decision for this prediction, when the
    caller has made it already (a pipeline makes it once per attempt).
    """

    golden = case.golden
    assert golden is not None
    state, detail = decided or reexecution_state(final_query, prediction, ran=ran)
    rows = prediction if state in ("ok", "unran", "literal") else None
    return JudgeMaterials(
        qid=case.qid,
        question=case.question,
        golden_kind=golden.kind,
        golden_value=golden_value,
        canonical_query=golden.canonical_query,
        rubric=golden.rubric,
        must_state=golden.must_state,
        must_not_use=golden.must_not_use,
        alternates=[a.model_dump(by_alias=True, exclude_none=True) for a in golden.alternates],
        tags=case.tags,
        coverage=case.coverage,
        prediction_rows=rows.rows if rows else None,
        prediction_columns=rows.columns if rows else None,
        prediction_truncated=bool(rows and rows.truncated),
        final_query=final_query,
        answer_text=answer_text,
        model_definitions=definitions,
        definitions_shared=definitions_shared,
        reexecution=state,
        reexecution_detail=detail,
        reexecution_call=shown_call(prediction.call if prediction else None),
    )


def definitions_for_call(
    set_dir: Path,
    config: sets.SetConfig | None,
    case: sets.Case,
    arguments: dict[str, Any] | None,
    default: str,
) -> str:
    """The definitions of the model the final call queried: `default` (the set's model's, read
    once) unless the call names another model (:data:`MODEL_ARGS`)."""
    arguments = arguments or {}
    if config is None or not any(arguments.get(k) for k in MODEL_ARGS):
        return default
    return model_definitions(set_dir, config, case, call_arguments=arguments)


def _embedded_model_path(set_dir: Path, config: sets.SetConfig) -> Path | None:
    target = config.target or {}
    if target.get("kind") != "embedded" or not target.get("model"):
        return None
    return set_dir / str(target["model"])


def definitions_shared(set_dir: Path, config: sets.SetConfig) -> bool:
    """Whether the judge's model definitions are the same for every case of the set: a
    target's model source is; the embedded target's are the entities each case expects."""
    return _embedded_model_path(set_dir, config) is None


def model_paths(set_dir: Path, config: sets.SetConfig) -> list[Path]:
    """Files of the model under test (a file tool touching them is contamination)."""
    paths = []
    embedded = _embedded_model_path(set_dir, config)
    if embedded is not None:
        paths.append(embedded.resolve())
    extra = config.model_extra or {}
    for key in ("modelFile", "targetModelFile"):
        if isinstance(extra.get(key), str):
            paths.append((set_dir / extra[key]).resolve())
    served = served_model_file(set_dir, config)
    if served is not None and served.resolve() not in paths:
        paths.append(served.resolve())
    return paths


@functools.lru_cache(maxsize=16)
def _load_model(path: Path) -> Any:
    from pytest_evalloop.targets.embedded.model import SemanticModel

    return SemanticModel.load(path)


MODEL_SOURCE_CHARS = 60_000
"""The judge is shown at most this much of a model's source (the real ecommerce.malloy is 14 KB)."""
PACKAGE_SEARCH_LEVELS = 3
"""How far above the set directory `<targetPackage>/<targetModelPath>` is looked for."""


def model_definitions(
    set_dir: Path,
    config: sets.SetConfig,
    case: sets.Case,
    call_arguments: dict[str, Any] | None = None,
) -> str:
    """The model's definitions relevant to a case, for the judge (docs, SQL, joins).

    Embedded target: the entities the case expects, from the set's model file. Any other
    target: the source of the model the answerer's final call queried (its `packageName` /
    `modelPath`, else the set's `targetPackage` / `targetModelPath`), read by the conductor
    from the files beside the set; when there is none, a note saying why, which the judge
    is shown in place of definitions.
    """
    embedded = _embedded_model_path(set_dir, config)
    if embedded is not None:
        if not embedded.is_file():
            return ""
        expected = case.expected_entities
        ids: list[str] = []
        if expected is not None:
            ids = [*expected.required, *(i for g in expected.required_any_of for i in g)]
            ids += expected.acceptable
        text: str = _load_model(embedded).definitions_for(dict.fromkeys(ids))
        return text
    package, model_path = _model_named(config, call_arguments)
    if not model_path:
        return (
            "(not available: set.json names no targetModelPath, so the harness does not know "
            "which model file the target serves)"
        )
    found = served_model_file(set_dir, config, call_arguments)
    where = f"{package}/{model_path}" if package else model_path
    if found is None:
        return (
            f"(not available: the harness found no file for the model {where} beside the set; "
            "set.json can name it with targetModelFile, relative to the set)"
        )
    return _model_source(found, where, str(_display(found, set_dir)))


def _model_named(
    config: sets.SetConfig, call_arguments: dict[str, Any] | None
) -> tuple[str | None, str | None]:
    """The package and model path a call named, else the set's."""
    extra = config.model_extra or {}
    block = config.publisher or {}
    default_package = block.get("packageName") or extra.get("targetPackage")
    default_path = block.get("modelPath") or extra.get("targetModelPath")
    called = call_arguments or {}
    package = called.get("packageName") or default_package
    model_path = called.get("modelPath") or default_path
    return (
        str(package) if package else None,
        str(model_path) if model_path else None,
    )


def served_model_file(
    set_dir: Path, config: sets.SetConfig, call_arguments: dict[str, Any] | None = None
) -> Path | None:
    """The `.malloy` file of the model a non-embedded target serves, when it sits beside the set.

    `targetModelFile` (relative to the set) names the set's own model; otherwise the file is
    looked for as `<package>/<modelPath>` in the set directory and up to three levels above it
    (the malloy-samples layout: `evals/<set>/` beside the `<package>/` it evaluates). A path
    that leaves its package directory or is not a `.malloy` file is never read: the names can
    come from the answerer's call.
    """
    package, model_path = _model_named(config, call_arguments)
    extra = config.model_extra or {}
    default = _model_named(config, None)
    explicit = extra.get("targetModelFile")
    if isinstance(explicit, str) and (package, model_path) == default:
        path = set_dir / explicit
        return path if path.is_file() else None
    if not model_path or not model_path.endswith(".malloy"):
        return None
    if package is not None and (package in ("", ".", "..") or "/" in package or "\\" in package):
        return None
    roots = [set_dir, *list(set_dir.parents)[:PACKAGE_SEARCH_LEVELS]]
    for root in roots:
        home = root / package if package else root
        candidate = home / model_path
        try:
            inside = candidate.resolve().is_relative_to(home.resolve())
        except OSError:
            continue
        if inside and candidate.is_file():
            return candidate
    return None


@functools.lru_cache(maxsize=32)
def _read_source(path: Path, mtime_ns: int) -> str:
    return path.read_text(encoding="utf-8", errors="replace")


def _model_source(path: Path, name: str, display: str) -> str:
    try:
        text = _read_source(path, path.stat().st_mtime_ns)
    except OSError as exc:
        return f"(not available: the model file {display} could not be read: {exc.strerror})"
    head = f"Source of the model {name}, read by the harness from {display}:\n\n"
    if len(text) > MODEL_SOURCE_CHARS:
        cut = len(text) - MODEL_SOURCE_CHARS
        text = text[:MODEL_SOURCE_CHARS] + f"\n... ({cut} more characters not shown)"
    return head + text


def _display(path: Path, set_dir: Path) -> Path:
    # Relative to the set where possible: the judge needs no absolute paths of this machine.
    import os

    try:
        return Path(os.path.relpath(path, set_dir))
    except ValueError:
        return path
