"""Contamination check over the host-side tool log of one answerer attempt (seed 001).

An attempt is contaminated when its log shows any of:

1. a tool naming a protected path: the set's ``evals/`` tree, a gold artifact, the run's
   ledger. Any tool (file tool, shell, or the text of an MCP query, which can read files) is
   checked for the concrete paths and for the reference harness's path needles (``evals/``,
   ``gold/``, ``cases.jsonl``, ``set.json``...). A non-MCP tool is held to more: naming
   ``evals`` at all, or searching the file system (a glob of Glob, Grep, ``find``, ``ls``...)
   for names of the answer key's kinds (``*.jsonl``, ``cases*``, ``gold*``), is an attempt on
   the answer key;
2. a non-MCP (file or shell) tool referencing the model file under test; the model path as an
   argument of an MCP call is not contamination, because the server resolves it and the
   answerer never reads the file;
3. more tool calls reported by the answerer than the host logged (every tool, MCP included).

With no host log the answer is ``"unknown"``, never a clean pass. A missing report leaves rule
3 unchecked; the attempt records that itself (``reported_calls_status``).

An MCP call's text is read twice: as written, and with its string concatenation folded
(``'ec' || 'om/cas' || 'es.jsonl'``, ``concat('evals/', 'shop')``), so a path spelled in pieces
is the path it spells. A string of it that names a protected path, or a file pattern
(``glob('/tmp/x/**')``) that would reach one, is quoted in the reason as the call named it.
"""

from __future__ import annotations

import fnmatch
import functools
import re
import shlex
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any, Literal, NamedTuple
from urllib.parse import unquote

from pydantic import BaseModel

# Characters that continue a path component or identifier. A needle only matches where it is
# not glued to one of these, so `status` in SQL never matches a protected `set.json`, and
# `evals/shop` never matches inside `evals/shop2`.
_WORDISH = r"A-Za-z0-9_\-"
# A bare file name is only a needle when it is distinctive enough not to occur in ordinary
# SQL or prose: it must have an extension and some length.
_MIN_NAME_LEN = 6
_BEFORE = rf"(?<![{_WORDISH}.$])"
_AFTER = rf"(?![{_WORDISH}])"

# The reference harness's needles: how any eval set's layout is spelled, whichever set it is and
# wherever it lies (a shell in another checkout, a copy of the set, the file under another
# root). Checked in every tool's input: a query naming `evals/` or `cases.jsonl` reads a file.
_LAYOUT_NEEDLES: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("evals/", re.compile(_BEFORE + "evals/")),
    # In MCP text only a file under `gold/` counts: "gold/silver tiers" is a question's words.
    ("gold/", re.compile(_BEFORE + r"gold/[^\s'\"`]*\.[a-z0-9]+" + _AFTER)),
) + tuple(
    (needle, re.compile(_BEFORE + re.escape(needle) + _AFTER))
    for needle in ("cases.jsonl", "intents.jsonl", "set.json", "events.jsonl", "judge-regressions")
)
# A non-MCP tool is held to more: any `gold/` and `evals` as a bare word (`ls evals`, a Grep
# over `evals`). Not in MCP input, where `evals` is as likely a table or a word of the question.
_HOST_NEEDLES: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("gold/", re.compile(_BEFORE + "gold/")),
    ("evals", re.compile(_BEFORE + "evals" + rf"(?![{_WORDISH}.])")),
)
# What the answer key's files and directories are called in any set. A file search (a glob)
# whose pattern would match one of these, or a file of a protected directory, is an attempt
# on the answer key even when it finds nothing.
_KEY_NAMES = (
    "evals",
    "gold",
    "runs",
    "cases.jsonl",
    "set.json",
    "intents.jsonl",
    "events.jsonl",
    "judge-regressions.jsonl",
    "run.json",
)
_GLOB_CHARS = re.compile(r"[*?\[]")
# A pattern part with no literal character in it (`*`, `**`, `*.*`) names no kind of file: in
# a shell command it is as likely SQL's `SELECT *` as a listing, so only a Glob tool's own
# pattern counts it.
_LITERAL = re.compile(r"[^*?\[\]{}.,!/-]")
_BRACES = re.compile(r"\{([^{}]*)\}")
_SHELL_TOOLS = ("bash", "shell", "sh", "zsh", "powershell", "pwsh", "cmd")


class ToolUse(BaseModel):
    """One row of the host-side tool log: which tool, with what input, MCP or not."""

    tool: str
    input: dict[str, Any]
    is_mcp: bool
    refused: bool = False
    """The target refused the call (a sandbox refusal): worded as such in a reason."""


class ContaminationResult(BaseModel):
    """The check's finding; ``contaminated`` is ``"unknown"`` when there was no host log."""

    contaminated: bool | Literal["unknown"]
    reasons: list[str]


class _Needle(NamedTuple):
    text: str  # normalised, lower-cased
    path: str  # the protected or model path it stands for, for the reason


def _normalise(text: str) -> str:
    # Percent-decoded too: a path can reach a REST endpoint or a URL as `evals%2Fshop`.
    text = unquote(text).replace("\\", "/").lower()
    text = re.sub(r"/+", "/", text)
    while "/./" in text:
        text = text.replace("/./", "/")
    return text


def _distinctive_name(name: str) -> bool:
    return "." in name.strip(".") and len(name) >= _MIN_NAME_LEN


def _path_forms(path: Path) -> set[str]:
    """Every way a tool input is likely to spell ``path``: absolute, and tails of 2+ parts."""
    forms: set[str] = set()
    for variant in {path.absolute(), path.resolve()}:
        forms.add(str(variant))
        parts = variant.parts[1:]  # drop the root
        for start in range(len(parts) - 1):
            forms.add("/".join(parts[start:]))
    if _distinctive_name(path.name):
        forms.add(path.name)
    return forms


class _Needles(NamedTuple):
    protected: tuple[_Needle, ...]
    model: tuple[_Needle, ...]
    key_names: frozenset[str]
    """Lower-cased names a file search must not aim at (see ``_KEY_NAMES``)."""
    reachable: tuple[tuple[str, str], ...] = ()
    """(normalised absolute path, the protected path it is or lies in): each protected path
    and each entry directly inside one, for a file pattern to be matched against."""


def _needles(paths: list[Path], model_paths: list[Path]) -> _Needles:
    """The protected and model needles, built once per distinct state of the paths.

    Every attempt of a run checks the same paths, and building the needles means resolving
    paths and listing directories. A directory's mtime changes whenever an entry is added or
    removed, so keying on it keeps the cached bare-name needles as true as a fresh listing.
    """
    return _cached_needles(
        tuple(paths), tuple(model_paths), tuple(_listing_stamp(p) for p in paths)
    )


def _listing_stamp(path: Path) -> int | None:
    try:
        return path.stat().st_mtime_ns if path.is_dir() else None
    except OSError:
        return None


@functools.lru_cache(maxsize=64)
def _cached_needles(
    paths: tuple[Path, ...], model_paths: tuple[Path, ...], stamps: tuple[int | None, ...]
) -> _Needles:
    del stamps  # part of the cache key only
    return _Needles(
        protected=tuple(_protected_needles(list(paths), list(model_paths))),
        model=tuple(_model_needles(list(model_paths))),
        key_names=_key_names(paths, model_paths),
        reachable=_reachable(paths),
    )


def _reachable(paths: Iterable[Path]) -> tuple[tuple[str, str], ...]:
    out: list[tuple[str, str]] = []
    for path in paths:
        for variant in dict.fromkeys([path.absolute(), path.resolve()]):
            out.append((_normalise(str(variant)), str(path)))
            if variant.is_dir():
                out += [(_normalise(str(child)), str(path)) for child in variant.iterdir()]
    return tuple(out)


def _key_names(paths: Iterable[Path], model_paths: Iterable[Path]) -> frozenset[str]:
    """The layout's names, each protected path's own name and its directory's entries; the
    model's files are left to the model rule (a search for them is not a read)."""
    models = {p.resolve() for p in model_paths}
    names = set(_KEY_NAMES)
    for path in paths:
        names.add(path.name)
        if path.is_dir():
            names |= {child.name for child in path.iterdir() if child.resolve() not in models}
    return frozenset(n.lower() for n in names if n)


def _protected_needles(paths: list[Path], model_paths: list[Path]) -> list[_Needle]:
    models = {p.resolve() for p in model_paths}
    needles: list[_Needle] = []
    for path in paths:
        forms = _path_forms(path)
        if path.is_dir():
            # Files directly in the set directory (cases.jsonl, set.json...) can be reached by a
            # bare name from a shell whose working directory is the set itself. A model file
            # served from the set is left to the model rule, so naming it to MCP stays legal.
            forms |= {
                child.name
                for child in path.iterdir()
                if child.is_file()
                and _distinctive_name(child.name)
                and child.resolve() not in models
            }
        needles += [_Needle(text=_normalise(f), path=str(path)) for f in forms]
    return needles


def _model_needles(paths: list[Path]) -> list[_Needle]:
    return [_Needle(text=_normalise(f), path=str(p)) for p in paths for f in _path_forms(p)]


def _strings(value: Any) -> Iterator[str]:
    """Every string inside a tool input, recursively (dict values, list items)."""
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for item in value.values():
            yield from _strings(item)
    elif isinstance(value, list | tuple):
        for item in value:
            yield from _strings(item)


def _matches(needle: str, haystack: str) -> bool:
    if needle not in haystack:
        return False  # the common case, and a plain substring test is far cheaper than a regex
    pattern = rf"(?<![{_WORDISH}.$]){re.escape(needle)}(?![{_WORDISH}])"
    return re.search(pattern, haystack) is not None


def _first_hit(needles: tuple[_Needle, ...], haystack: str) -> _Needle | None:
    return next((n for n in needles if _matches(n.text, haystack)), None)


def _mcp_model_arg(use: ToolUse, keys: frozenset[str], model: tuple[_Needle, ...]) -> set[str]:
    """Top-level MCP argument keys whose value names the model under test: exempt."""
    if not use.is_mcp:
        return set()
    return {
        key
        for key, value in use.input.items()
        if key in keys and isinstance(value, str) and _first_hit(model, _normalise(value))
    }


def _use_reasons(use: ToolUse, needles: _Needles, model_keys: frozenset[str]) -> list[str]:
    exempt = _mcp_model_arg(use, model_keys, needles.model)
    values = {k: v for k, v in use.input.items() if k not in exempt}
    named = _named(values) if use.is_mcp else []
    haystack = "\n".join(_normalise(s) for s in [*_strings(values), *named])
    reasons = _quoted_reasons(use, named, needles)
    if not reasons:
        for path in dict.fromkeys(n.path for n in needles.protected if _matches(n.text, haystack)):
            reasons.append(_seen(use, path))
    if not reasons:
        # One reason is enough for a use that names no concrete protected path.
        found = _layout_reason(use, haystack, named) or _search_reason(
            use, values, needles.key_names
        )
        reasons += [found] if found else []
    if not use.is_mcp:
        hit = _first_hit(needles.model, haystack)
        if hit is not None:
            reasons.append(f"{use.tool} (a file tool) touched the model under test {hit.path}")
    return reasons


# A string literal of a query, in single or double quotes (a doubled quote escapes one).
_QUOTED = r"'(?:[^']|'')*'|\"(?:[^\"]|\"\")*\""
_CHAIN = re.compile(rf"(?:{_QUOTED})(?:\s*\|\|\s*(?:{_QUOTED}))+")
_CONCAT = re.compile(rf"\bconcat\s*\(\s*((?:{_QUOTED})(?:\s*,\s*(?:{_QUOTED}))*)\s*\)", re.I)
_PARENS = re.compile(rf"\(\s*({_QUOTED})\s*\)")
_ONE = re.compile(_QUOTED)
_FOLD_ROUNDS = 8


def fold_literals(text: str) -> list[str]:
    """The string literals of a query's text with their concatenation folded: `'ec' || 'om'`,
    `concat('ec', 'om')` and `('ec')` become `'ecom'`, over a few rounds (nested pieces).
    What string functions beyond concatenation compute is not folded."""
    for _ in range(_FOLD_ROUNDS):
        folded = _CONCAT.sub(lambda m: _quote(_joined(m.group(1))), text)
        folded = _CHAIN.sub(lambda m: _quote(_joined(m.group(0))), folded)
        folded = _PARENS.sub(lambda m: m.group(1), folded)
        if folded == text:
            break
        text = folded
    return [_unquote(m.group(0)) for m in _ONE.finditer(text)]


def _joined(pieces: str) -> str:
    return "".join(_unquote(m.group(0)) for m in _ONE.finditer(pieces))


def _quote(value: str) -> str:
    return "'" + value.replace("'", "''") + "'"


def _unquote(literal: str) -> str:
    mark = literal[0]
    return literal[1:-1].replace(mark * 2, mark)


def _named(values: dict[str, Any]) -> list[str]:
    """What an MCP call's text names: its strings' literals with concatenation folded, and a
    string that is one path-like word itself (an argument holding a path)."""
    out: list[str] = []
    for text in _strings(values):
        out += fold_literals(text)
        if text and len(text) <= 1_000 and not any(c.isspace() for c in text):
            out.append(text)
    return list(dict.fromkeys(out))


def _quoted_reasons(use: ToolUse, named: list[str], needles: _Needles) -> list[str]:
    """A reason per string of an MCP call that names a protected path, or is a file pattern
    that would reach one, quoting the string as the call named it."""
    reasons: list[str] = []
    for text in named:
        norm = _normalise(text)
        hit = _first_hit(needles.protected, norm)
        if hit is not None:
            reasons.append(_seen(use, repr(text), f"protected: {hit.path}"))
            continue
        reached = _pattern_reaches(norm, needles.reachable)
        if reached is not None:
            reasons.append(_seen(use, repr(text), f"the pattern reaches {reached}"))
    return list(dict.fromkeys(reasons))


def _pattern_reaches(pattern: str, reachable: tuple[tuple[str, str], ...]) -> str | None:
    """The protected path a file pattern (`/tmp/x/**`, `/tmp/*/shop/*.jsonl`) would match, or
    None; only a pattern with a directory part and a literal character counts."""
    if "/" not in pattern or not _GLOB_CHARS.search(pattern) or not _LITERAL.search(pattern):
        return None
    return next((p for path, p in reachable if fnmatch.fnmatchcase(path, pattern)), None)


def _layout_reason(use: ToolUse, haystack: str, named: list[str]) -> str | None:
    layout = _LAYOUT_NEEDLES if use.is_mcp else _LAYOUT_NEEDLES + _HOST_NEEDLES
    found = next(((n, pattern) for n, pattern in layout if pattern.search(haystack)), None)
    if found is None:
        return None
    needle, pattern = found
    # Quote the string that named it, when one string of the call did.
    text = next((t for t in named if pattern.search(_normalise(t))), None)
    if text is None:
        return _seen(use, needle)
    return _seen(use, repr(text), f"the eval layout: {needle}")


def _seen(use: ToolUse, path: Any, note: str = "") -> str:
    """A reason worded by what was seen: a file tool touched the path; an MCP call named it
    (its text reads files); a call the target refused was a refused read, nothing more.
    ``note`` says what the named path is (the protected path it lies in)."""
    if not use.is_mcp:
        return f"{use.tool} touched protected path {path}"
    if use.refused:
        return f"a sandbox-refused read of {path} ({use.tool}{'; ' + note if note else ''})"
    return f"{use.tool} named {path}" + (f" ({note})" if note else "")


def _search_reason(use: ToolUse, values: dict[str, Any], key_names: frozenset[str]) -> str | None:
    """A file search by a non-MCP tool whose pattern would find the answer key's files."""
    if use.is_mcp:
        return None
    tool = use.tool.lower()
    own_glob = tool.endswith("glob")
    for pattern in _search_patterns(tool, values):
        name = _pattern_hit(pattern, key_names, bare_wildcards=own_glob)
        if name is not None:
            return f"{use.tool} searched for the answer key's files: {pattern!r} matches {name}"
    return None


def _search_patterns(tool: str, values: dict[str, Any]) -> Iterator[str]:
    """The glob patterns in a non-MCP tool's input (normalised): every wildcard word of a
    shell command or any other value; for Grep, its file filters, not its content regex."""
    for key, value in values.items():
        if tool.endswith("grep") and key == "pattern":
            continue
        if tool.endswith("grep") and key == "type" and isinstance(value, str):
            yield f"*.{_normalise(value)}"
            continue
        for text in _strings(value):
            for word in _words(_normalise(text), shell=tool.endswith(_SHELL_TOOLS)):
                if _GLOB_CHARS.search(word):
                    yield word


def _words(text: str, *, shell: bool) -> list[str]:
    if shell:
        try:
            lexer = shlex.shlex(text, posix=True, punctuation_chars=";&|()<>")
            lexer.whitespace_split = True
            return list(lexer)
        except ValueError:  # an unbalanced quote: fall back to the plain words
            pass
    return [w.strip("'\"`") for w in text.split()]


def _pattern_hit(pattern: str, names: frozenset[str], *, bare_wildcards: bool) -> str | None:
    """The first key name some part of ``pattern`` matches, as a file-name glob. A directory
    part of wildcards only (`**`, `*/`) means "anywhere" and names nothing."""
    parts = pattern.split("/")
    for position, part in enumerate(parts):
        if not _GLOB_CHARS.search(part):
            continue
        last = position == len(parts) - 1
        if not _LITERAL.search(part) and not (bare_wildcards and last):
            continue
        for alternative in _expand_braces(part):
            found = next((n for n in sorted(names) if fnmatch.fnmatchcase(n, alternative)), None)
            if found is not None:
                return found
    return None


def _expand_braces(part: str) -> list[str]:
    """``*.{jsonl,csv}`` as ``*.jsonl`` and ``*.csv`` (fnmatch knows no braces)."""
    match = _BRACES.search(part)
    if match is None:
        return [part]
    head, tail = part[: match.start()], part[match.end() :]
    return [x for option in match.group(1).split(",") for x in _expand_braces(head + option + tail)]


def check_contamination(
    log: list[ToolUse] | None,
    *,
    reported_calls: int | None,
    protected_paths: list[Path],
    model_paths: list[Path],
    mcp_model_arg_keys: frozenset[str] = frozenset({"modelPath"}),
) -> ContaminationResult:
    """Check one attempt's host-side tool log; reasons name the tool and the path."""
    if log is None:
        return ContaminationResult(
            contaminated="unknown",
            reasons=["no host-side tool log: the attempt cannot be shown clean"],
        )
    needles = _needles(protected_paths, model_paths)
    reasons: list[str] = []
    for use in log:
        reasons += _use_reasons(use, needles, mcp_model_arg_keys)
    if reported_calls is not None and reported_calls > len(log):
        # Worded by what was seen: with only MCP tools in the log, the claim was of MCP calls.
        what = "MCP calls" if all(use.is_mcp for use in log) else "tool calls"
        reasons.append(f"claimed {reported_calls} {what}; the host logged {len(log)}")
    return ContaminationResult(contaminated=bool(reasons), reasons=reasons)
