"""The packages a Malloy set names, and where they are: one reading of set.json.

A set names the package that answers it (`target.package` in a malloy target block, or the
malloy-samples shape's top-level `targetPackage`/`targetModelPath`) and the truth package its
goldens come from (`truthPackage`, `truthModelPath`, `truthTableRewrite`, at the top level or in
the block). `setting` reads a key from either place; `locate_package` finds a named package
beside the set, beside the answerer's package, or above the set; `truth_package` is the one
reading of a set's truth that every route uses (`targets.choice.truth_source`).
Layer: targets (no import of the server or the generator, which both read this).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict

from pytest_evalloop.sets.cases import SetConfig

DEFAULT_ENVIRONMENT = "local"


class MalloyError(ValueError):
    """A package that cannot be served: the message names the file, the line and the fix."""


class PackageNotFound(MalloyError):
    """set.json names a package that is in none of the places looked in (the message lists
    them)."""


class ServedPackage(BaseModel):
    """One Malloy package as a server serves it: its folder, the model queries run against, and
    whether `duckdb.table('<path>')` in query text is rewritten to the model's source over it."""

    model_config = ConfigDict(frozen=True)

    root: Path
    model_path: str
    environment: str = DEFAULT_ENVIRONMENT
    table_rewrite: bool = False


def setting(set_dir: Path, set_config: SetConfig, key: str) -> Any:
    """A Malloy key of set.json, wherever the set writes it: at the top level (the shape of the
    malloy-samples sets: `truthPackage`, `truthModelPath`, `truthTableRewrite`,
    `targetModelPath`) or inside a `"target": {"kind": "malloy", ...}` block (`modelPath`
    there). Given in both places with different values is an error naming both. (`targetPackage`
    names a package to look for; a block's `package` is a path: they are not one key.)"""
    block = set_config.target or {}
    inner = block.get(_BLOCK_NAMES.get(key, key)) if block.get("kind") == "malloy" else None
    top = (set_config.model_extra or {}).get(key)
    if inner is not None and top is not None and inner != top:
        raise MalloyError(
            f"{set_dir / 'set.json'}: {key} is given twice, {top!r} at the top level and "
            f"{inner!r} in target; keep one"
        )
    return inner if inner is not None else top


_BLOCK_NAMES = {"targetModelPath": "modelPath"}


def locate_package(set_dir: Path, name: str, *, key: str, beside: Path | None = None) -> Path:
    """The folder of a package set.json names: the set's own `<name>`, else `<name>` beside the
    answerer's package (Publisher serves sibling packages), else `<name>` in a folder above the
    set (malloy-samples keeps `ecommerce-truth/` two levels above `evals/ecommerce`)."""
    set_dir = Path(set_dir).resolve()
    places = [set_dir / name]
    if beside is not None:
        places.append(beside / name)
    places += [parent / name for parent in set_dir.parents]
    # A package is a folder of .malloy files, never the set itself (`evals/ecommerce` is both
    # the set and, seen from `evals/`, a folder named like the `ecommerce` package).
    found = next(
        (p for p in places if p.resolve() != set_dir and p.is_dir() and any(p.rglob("*.malloy"))),
        None,
    )
    if found is None:
        looked = ", ".join(str(p) for p in places[:3])
        raise PackageNotFound(
            f"{set_dir / 'set.json'}: {key} {name!r} is no folder beside the set or above it "
            f"(looked in {looked}, ...); fix {key} or put the package there"
        )
    return found.resolve()


def truth_package(
    set_dir: Path, set_config: SetConfig, package_root: Path | None = None
) -> ServedPackage | None:
    """The truth package set.json names (`truthPackage`, `truthModelPath`,
    `truthTableRewrite`), or None: the one reading of a Malloy set's truth, whatever serves
    the answerer (`package_root`, when known, is searched beside too)."""
    name = setting(set_dir, set_config, "truthPackage")
    if not isinstance(name, str) or not name:
        return None
    beside = package_root.parent if package_root is not None else None
    root = locate_package(set_dir, name, key="truthPackage", beside=beside)
    model = setting(set_dir, set_config, "truthModelPath") or only_model(root)
    return ServedPackage(
        root=root,
        model_path=str(model),
        environment=str(setting(set_dir, set_config, "environmentName") or DEFAULT_ENVIRONMENT),
        table_rewrite=bool(setting(set_dir, set_config, "truthTableRewrite")),
    )


def set_packages(set_dir: Path, set_config: SetConfig) -> list[Path]:
    """The folders of the packages set.json names (the answerer's, then the truth package)."""
    roots = []
    block = set_config.target or {}
    name = (set_config.model_extra or {}).get("targetPackage")
    if block.get("kind") == "malloy" and isinstance(block.get("package"), str):
        roots.append((Path(set_dir) / block["package"]).resolve())
    elif isinstance(name, str) and name:
        roots.append(locate_package(set_dir, name, key="targetPackage"))
    truth = truth_package(set_dir, set_config, roots[0] if roots else None)
    if truth is not None:
        roots.append(truth.root)
    return roots


def only_model(root: Path) -> str:
    models = sorted(p.relative_to(root).as_posix() for p in root.rglob("*.malloy"))
    if len(models) != 1:
        found = ", ".join(models) or "none"
        raise MalloyError(
            f"{root}: say which model the answerer queries (set.json target.modelPath); the "
            f"package holds {found}"
        )
    return models[0]
