"""A set's model files, a working copy an edit lands in first, and what the edit changed.

Only local targets can be improved (seed 004, "pick the target first"): the embedded target (its
model file, `model.json`) and a local Malloy package (every `.malloy` file of it). An edit is a
list of exact replacements; it is applied to a scratch copy of the set first, where the target
must load it (the embedded model validates; Malloy's real compiler compiles every model file of
the package) and one query per touched source must run, before any byte of the working tree
moves.
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field

from pytest_evalloop.sets import cases as sets

Kind = Literal["embedded", "malloy"]
DOC_KEYS = frozenset({"doc", "aliases", "grain"})
"""Fields of an embedded model part that say what it is without changing what it computes."""
_MALLOY_SOURCE = re.compile(r"^\s*source:\s*([A-Za-z_][A-Za-z0-9_]*)\s+is\b")
_MALLOY_DOC_LINE = re.compile(r"^\s*(#|//|--)")


class ImproveRefused(ValueError):
    """Improve will not run as asked: the message says why and where the work goes instead."""


class Edit(BaseModel):
    """One exact replacement in one model file (`old` must occur exactly once)."""

    file: str = Field(min_length=1)
    """Relative to the set directory, as `ModelFiles.names` lists it."""
    old: str = Field(min_length=1)
    new: str


@dataclass(frozen=True)
class ModelFiles:
    """The files an improver may edit, and the kind of target that serves them."""

    set_dir: Path
    kind: Kind
    files: tuple[Path, ...]
    package_root: Path | None = None
    """Malloy: the package directory (copied whole into a working copy)."""

    @property
    def names(self) -> list[str]:
        """The files relative to the set directory (how edits and candidates name them)."""
        return [rel(self.set_dir, p) for p in self.files]

    def path(self, name: str) -> Path | None:
        """The model file an edit names, or None when it names no model file."""
        return next((p for p in self.files if rel(self.set_dir, p) == name), None)


def rel(base: Path, path: Path) -> str:
    return path.resolve().relative_to(base.resolve()).as_posix()


def model_files(set_dir: Path, config: sets.SetConfig, run_target: str | None) -> ModelFiles:
    """The set's editable model files; refuses a remote target, naming why.

    `run_target` is the baseline run's `target` pin: the edit must be measured on the same
    target the baseline answered against, and only a local one can be edited and re-tested.
    """
    kind = (config.target or {}).get("kind")
    if kind == "malloy":
        from pytest_evalloop.targets.malloy.package import MalloyError, malloy_spec

        try:
            spec = malloy_spec(set_dir, config, None)
        except MalloyError as exc:
            raise ImproveRefused(str(exc)) from exc
        if run_target is not None and run_target != spec.name:
            raise ImproveRefused(_remote(run_target))
        files = tuple(sorted(spec.root.rglob("*.malloy")))
        return ModelFiles(set_dir, "malloy", files, package_root=spec.root)
    if kind == "embedded":
        if run_target is not None and run_target != f"embedded:{config.name}":
            raise ImproveRefused(_remote(run_target))
        model = (config.target or {}).get("model") or "model.json"
        return ModelFiles(set_dir, "embedded", (set_dir / str(model),))
    if run_target is not None:
        raise ImproveRefused(_remote(run_target))
    raise ImproveRefused(
        f"{set_dir / sets.SET_FILE} declares no local target (target.kind {kind!r}); improve "
        "edits only an embedded model or a local Malloy package"
    )


def _remote(target: str) -> str:
    return (
        f"the baseline answered against {target}, a target whose model is not files here: "
        "improve edits only a local target (the embedded model, a local Malloy package), "
        "because the acceptance check needs to load, compile and re-answer between edits; "
        "publishing to score an edit is not something this loop does. Pick the target first: "
        "run the baseline against the local package, then improve"
    )


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


# --- applying an edit --------------------------------------------------------------------


def apply_edits(texts: dict[str, str], edits: list[Edit]) -> tuple[dict[str, str], list[str]]:
    """The files' texts after the edits, or the problems (pure: nothing touches the disk)."""
    out = dict(texts)
    problems = []
    for n, edit in enumerate(edits, 1):
        if edit.file not in out:
            problems.append(
                f"edit {n}: {edit.file!r} is not a model file (model files: {', '.join(texts)})"
            )
            continue
        count = out[edit.file].count(edit.old)
        if count != 1:
            where = "does not occur" if count == 0 else f"occurs {count} times"
            problems.append(
                f"edit {n}: the text to replace {where} in {edit.file}; quote it exactly, with "
                "enough around it to be unique"
            )
            continue
        out[edit.file] = out[edit.file].replace(edit.old, edit.new, 1)
    return out, problems


def working_copy(files: ModelFiles, texts: dict[str, str], scratch: Path) -> Path:
    """A copy of the set under `scratch` holding `texts` for the model files; its set dir.

    Only what the target reads is copied: set.json, the model files (the whole package for
    Malloy, its data linked, not copied); never cases.jsonl or runs/.
    """
    target = scratch / files.set_dir.name
    target.mkdir(parents=True)
    shutil.copy(files.set_dir / sets.SET_FILE, target / sets.SET_FILE)
    if files.package_root is not None:
        package = target / rel(files.set_dir, files.package_root)
        shutil.copytree(
            files.package_root, package, ignore=shutil.ignore_patterns("data", "*.lock")
        )
        if (files.package_root / "data").exists():
            (package / "data").symlink_to((files.package_root / "data").resolve())
        from pytest_evalloop.targets.malloy.setpackages import setting, truth_package

        config = sets.load_set_config(files.set_dir)
        truth = truth_package(files.set_dir, config, files.package_root)
        if truth is not None:  # linked beside the copy, where set.json's name finds it first
            (target / str(setting(files.set_dir, config, "truthPackage"))).symlink_to(truth.root)
    for name, text in texts.items():
        path = target / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    return target


# --- what an edit changed ----------------------------------------------------------------


def touched_sources(kind: Kind, before: dict[str, str], after: dict[str, str]) -> list[str]:
    """Sources an edit touched, on either side of a changed line (each gets one query on the
    working copy; a source that no longer exists fails that query, as it should)."""
    if kind == "embedded":
        old, new = _embedded_parts(before), _embedded_parts(after)
        keys = {k for k in set(old) | set(new) if old.get(k) != new.get(k)}
        return sorted({k.split(":")[1] for k in keys if k.count(":") >= 1})
    names: set[str] = set()
    for file in sorted(set(before) | set(after)):
        was, now = before.get(file, ""), after.get(file, "")
        gone, added = _changed_lines(was, now, lambda line: line.strip())
        names |= {s for n in gone if (s := _malloy_source_at(was, n))}
        names |= {s for n in added if (s := _malloy_source_at(now, n))}
    return sorted(names)


def meaning_changed(kind: Kind, before: dict[str, str], after: dict[str, str]) -> list[str]:
    """Entities whose meaning moved (`kind:source:name`), mechanically; [] for a docs-only edit.

    Embedded: a part whose fields other than doc, aliases and grain differ (added and removed
    parts included). Malloy: every source with a line whose code (comments and annotations
    stripped) differs, read on both sides: a line deleted, commented out or edited counts where
    it was, a line added where it is (coarse on purpose: the improver names the entities, this
    catches what it missed).
    """
    if kind == "embedded":
        old = _embedded_parts(before, meaning_only=True)
        new = _embedded_parts(after, meaning_only=True)
        return sorted(k for k in set(old) | set(new) if old.get(k) != new.get(k))
    out: set[str] = set()
    for file in sorted(set(before) | set(after)):
        was, now = before.get(file, ""), after.get(file, "")
        gone, added = _changed_lines(was, now, malloy_code)
        for text, numbers in ((was, gone), (now, added)):
            for line_no in numbers:
                source = _malloy_source_at(text, line_no)
                out.add(f"source:{source}" if source else f"file:{file}")
    return sorted(out)


def malloy_code(line: str) -> str:
    """The code of one Malloy line: an annotation line (`#`) has none; a comment (`//` or
    `--` outside a string) is cut off; whitespace around it does not count."""
    if line.lstrip().startswith("#"):
        return ""
    out: list[str] = []
    quote: str | None = None
    escaped = False
    for i, ch in enumerate(line):
        if quote is not None:
            out.append(ch)
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == quote:
                quote = None
            continue
        if line.startswith("//", i) or line.startswith("--", i):
            break
        if ch in "'\"`":
            quote = ch
        out.append(ch)
    return " ".join("".join(out).split())


def _embedded_parts(texts: dict[str, str], *, meaning_only: bool = False) -> dict[str, str]:
    parts: dict[str, str] = {}
    for text in texts.values():
        try:
            model = json.loads(text)
        except ValueError:
            continue
        for source in model.get("sources") or []:
            name = source.get("name", "?")
            head = {k: v for k, v in source.items() if not isinstance(v, list)}
            parts[f"source:{name}"] = _digest(head, meaning_only)
            for key, kind in (
                ("dimensions", "dimension"),
                ("measures", "measure"),
                ("joins", "join"),
                ("views", "view"),
            ):
                for part in source.get(key) or []:
                    parts[f"{kind}:{name}:{part.get('name', '?')}"] = _digest(part, meaning_only)
    return parts


def _digest(part: dict[str, Any], meaning_only: bool) -> str:
    kept = {k: v for k, v in part.items() if not (meaning_only and k in DOC_KEYS)}
    return json.dumps(kept, sort_keys=True)


def _changed_lines(
    before: str, after: str, key: Callable[[str], str]
) -> tuple[list[int], list[int]]:
    """(line numbers of `before`, of `after`) whose `key` differs, lines whose key is empty
    left out of the comparison: a diff of what `key` keeps of each line, on both sides."""
    import difflib

    old = [(n, k) for n, line in enumerate(before.splitlines()) if (k := key(line))]
    new = [(n, k) for n, line in enumerate(after.splitlines()) if (k := key(line))]
    matcher = difflib.SequenceMatcher(
        None, [k for _, k in old], [k for _, k in new], autojunk=False
    )
    gone: list[int] = []
    added: list[int] = []
    for tag, i1, i2, j1, j2 in matcher.get_opcodes():
        if tag != "equal":
            gone += [old[i][0] for i in range(i1, i2)]
            added += [new[j][0] for j in range(j1, j2)]
    return gone, added


def _malloy_source_at(text: str, line_no: int) -> str | None:
    lines = text.splitlines()
    for line in reversed(lines[: line_no + 1]):
        found = _MALLOY_SOURCE.match(line)
        if found:
            return found.group(1)
    return None


def diff_summary(before: dict[str, str], after: dict[str, str]) -> list[str]:
    """One line per touched file: lines added and removed, and the first changed line."""
    import difflib

    out = []
    for file in sorted(after):
        if before.get(file) == after[file]:
            continue
        diff = list(
            difflib.unified_diff(before.get(file, "").splitlines(), after[file].splitlines(), n=0)
        )
        added = [d[1:] for d in diff if d.startswith("+") and not d.startswith("+++")]
        removed = [d for d in diff if d.startswith("-") and not d.startswith("---")]
        first = next((a.strip() for a in added if a.strip()), "")
        out.append(f"{file}: +{len(added)} -{len(removed)} lines; {first[:120]}")
    return out


def added_text(before: str, after: str) -> str:
    """The words the edit put in (inserted or replacing), joined: what the expert test reads."""
    import difflib

    old, new = before.split(), after.split()
    spans = []
    for tag, _i1, _i2, j1, j2 in difflib.SequenceMatcher(
        None, old, new, autojunk=False
    ).get_opcodes():
        if tag in ("insert", "replace"):
            spans.append(" ".join(new[j1:j2]))
    return "\n".join(spans)
