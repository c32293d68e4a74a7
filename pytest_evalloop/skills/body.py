"""What a SKILL.md body says, read as Markdown: its sections and the files it names.

Parsed with markdown-it-py (CommonMark), so a `## Done when` inside a code fence, an HTML
comment or a blockquote is not a section, and a link is told from a link-shaped string in code.
Imported by the lint checks only when a skill is linted (the parser costs ~25 ms to import).
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING
from urllib.parse import unquote

if TYPE_CHECKING:
    from markdown_it.token import Token

RESOURCE_DIRS = ("scripts", "references", "assets")
"""The skill's own directories (the Agent Skills layout): a path starting with one of them,
anywhere in SKILL.md, names a file of the skill."""

# A path into one of the skill's directories, standing alone (not the tail of a longer path such
# as `src/scripts/x`): bare, `./`-relative, or under a skill-dir variable (`${CLAUDE_SKILL_DIR}/`,
# `$SKILL_DIR/`, `{baseDir}/`). It ends at whitespace, quotes, brackets or `:`, `,`, `;`.
_RESOURCE = re.compile(
    r"(?<![\w.~/$}-])(?:\./|\$\{?\w+\}?/|\{\w+\}/)?"
    rf"((?:{'|'.join(RESOURCE_DIRS)})/[^\s`'\"()<>\[\]{{}}|,;:]*)"
)
_SCHEME = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*:")
_TEMPLATED = re.compile(r"[*?<>{}$]")
_CONTENT = frozenset({"inline", "fence", "code_block"})


@dataclass(frozen=True)
class Heading:
    """A section heading of the document itself (not inside a list, quote or code)."""

    level: int
    text: str
    line: int
    """1-based, in the body."""
    has_content: bool
    """Something other than a heading comes before the next heading of its level or above."""


@dataclass(frozen=True)
class Named:
    """A file the body names: a relative link target, or a path into the skill's directories."""

    path: str
    line: int
    """1-based, in the body."""


@dataclass(frozen=True)
class Outline:
    """The body's headings and the files it names."""

    headings: tuple[Heading, ...]
    named: tuple[Named, ...]


@functools.lru_cache(maxsize=64)
def outline(body: str) -> Outline:
    """Read `body` as CommonMark: its top-level headings and every file it names."""
    from markdown_it import MarkdownIt

    tokens = MarkdownIt("commonmark").parse(body)
    return Outline(headings=tuple(_headings(tokens)), named=tuple(_named(tokens)))


def _headings(tokens: list[Token]) -> list[Heading]:
    found = []
    for i, token in enumerate(tokens):
        if token.type != "heading_open" or token.level != 0:
            continue
        level = int(token.tag[1])
        text = tokens[i + 1].content.strip() if i + 1 < len(tokens) else ""
        content = False
        for j in range(i + 3, len(tokens)):  # past heading_open, inline, heading_close
            later = tokens[j]
            if later.type == "heading_open" and later.level == 0 and int(later.tag[1]) <= level:
                break
            # Text under it, not a subheading's title: an empty list item, an empty fence, a rule
            # or an HTML comment says nothing a reader (or an agent) can act on.
            titled = tokens[j - 1].type == "heading_open"
            if later.type in _CONTENT and later.content.strip() and not titled:
                content = True
                break
        found.append(Heading(level, text, _line(token), content))
    return found


def _named(tokens: list[Token]) -> list[Named]:
    found: list[Named] = []
    for token in tokens:
        if token.type in ("fence", "code_block", "html_block"):
            # A fence's content starts on the line after its opening ```.
            first = _line(token) + (token.type == "fence")
            found += _in_text(token.content, first)
        line = _line(token)
        for child in token.children or ():
            if child.type in ("softbreak", "hardbreak"):
                line += 1
            if child.type in ("text", "code_inline", "html_inline"):
                found += _in_text(child.content, line)
            target = child.attrs.get("href") or child.attrs.get("src")
            if isinstance(target, str) and (path := _local_target(target)):
                found.append(Named(path, line))
    return found


def _in_text(text: str, first_line: int) -> list[Named]:
    return [
        Named(path, first_line + text.count("\n", 0, start))
        for path, start in _resource_matches(text)
    ]


def _resource_matches(text: str) -> list[tuple[str, int]]:
    out = []
    for match in _RESOURCE.finditer(text):
        path = match[1].rstrip(".")
        if path.rstrip("/") not in RESOURCE_DIRS and not _TEMPLATED.search(path):
            out.append((path, match.start(1)))
    return out


def resource_paths(text: str) -> list[str]:
    """Every path into the skill's directories that `text` names (templated ones left out:
    `scripts/<name>.py` or `scripts/*.sh` name no one file)."""
    return [path for path, _ in _resource_matches(text)]


def _local_target(target: str) -> str | None:
    """A link target that names a file of the skill: relative, not a URL or an anchor."""
    if not target or target.startswith(("#", "/", "~")) or _SCHEME.match(target):
        return None
    path = unquote(target.split("#", 1)[0].split("?", 1)[0])
    return path if path and not _TEMPLATED.search(path) else None


def _line(token: Token) -> int:
    return token.map[0] + 1 if token.map else 1
