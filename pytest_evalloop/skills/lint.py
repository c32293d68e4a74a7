"""The SKILL.md release gate as pure checks: each takes a :class:`SkillContext`, yields findings.

Three levels. An *error* fails the skill. A *warning* is reported but never fails it (pytest's
`-W error::pytest_evalloop.skills.lint.SkillLintWarning` hardens them). *Info* is shown only.
"Gate" checks (description says when, completion section, scenario coverage) are errors under
strictness `strict` and warnings under `advisory`; the other checks keep their fixed level.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from pydantic import ValidationError

from pytest_evalloop.skills.frontmatter import SIDECAR_FILE, SKILL_FILE, SkillDoc, read_skill
from pytest_evalloop.skills.scenarios import Scenario, ScenarioError, load_scenario, scenario_files
from pytest_evalloop.skills.settings import Strictness as Strictness
from pytest_evalloop.skills.sidecar import Sidecar

Level = Literal["error", "warning", "info"]
MARKS: dict[str, str] = {"error": "[x]", "warning": "[!]", "info": "[i]"}

NAME_RE = re.compile(r"^[a-z0-9]+(?:-[a-z0-9]+)*$")
NAME_MAX = 64
DESCRIPTION_MAX = 1024
DESCRIPTION_MIN = 60
LISTING_CAP = 1536
"""Claude Code truncates `description` + `when_to_use` at this many characters per skill."""
SIZE_IDEAL = (30, 120)
SIZE_SOFT = 200
SIZE_REVIEW = 300
SIZE_MAX = 500
SIZE_MAX_BYTES = 40_000
"""The line maximum in bytes (500 lines of 80 characters): a file cannot pass the size policy by
putting its text on few lines. UTF-8 bytes of the whole file, frontmatter included."""
TOKEN_BUDGET = 5_000
"""Estimated tokens of the body, which the agent loads at every activation: the Agent Skills
specification recommends instructions under 5,000 tokens."""
MIN_SCENARIOS = 3
OFFICIAL_PREFIX = "@agileflow/"
OFFICIAL_KEYS = frozenset({"name", "description"})


class SkillLintWarning(UserWarning):
    """A release-gate warning about a skill (`-W error::…SkillLintWarning` makes it fail)."""


@dataclass(frozen=True)
class Finding:
    """One thing the gate found: its level, a stable code, and what to do about it."""

    level: Level
    code: str
    message: str

    def render(self) -> str:
        """`[x] code: message` (error), `[!] …` (warning) or `[i] …` (info)."""
        return f"{MARKS[self.level]} {self.code}: {self.message}"


@dataclass
class LoadedScenario:
    """A scenario file and what reading it gave: the scenario, or the error."""

    path: Path
    scenario: Scenario | None = None
    error: str | None = None


@dataclass
class SkillContext:
    """Everything the checks look at for one skill."""

    doc: SkillDoc
    scenarios: list[LoadedScenario] = field(default_factory=list)
    catalog: dict[str, str] = field(default_factory=dict)
    """Skill id → description for every skill of the catalog (this one included)."""
    strictness: Strictness = "strict"
    fixtures_dir: Path | None = None

    @property
    def gate(self) -> Level:
        """The level of a gate finding under this strictness."""
        return "error" if self.strictness == "strict" else "warning"

    @property
    def valid_scenarios(self) -> list[Scenario]:
        """The scenarios that parsed."""
        return [s.scenario for s in self.scenarios if s.scenario is not None]

    @property
    def official(self) -> bool:
        """An agileflow official skill: its sidecar names the package `@agileflow/<id>`."""
        return _package_name(self.doc) == f"{OFFICIAL_PREFIX}{self.doc.skill_id}"

    @property
    def manual(self) -> bool:
        """The model may not invoke it on its own: positives must invoke it explicitly."""
        sidecar_mode = ((self.doc.sidecar or {}).get("activation") or {}).get("mode")
        return sidecar_mode == "manual" or self.doc.meta.get("disable-model-invocation") is True


def _package_name(doc: SkillDoc) -> Any:
    package = (doc.sidecar or {}).get("package")
    return package.get("name") if isinstance(package, dict) else None


# --- frontmatter -------------------------------------------------------------------------


def check_frontmatter(ctx: SkillContext) -> Iterator[Finding]:
    """The frontmatter exists and is a YAML mapping."""
    if ctx.doc.frontmatter_error:
        yield Finding("error", "frontmatter", f"frontmatter {ctx.doc.frontmatter_error}")


def check_name(ctx: SkillContext) -> Iterator[Finding]:
    """`name`: present, kebab-case, at most 64 characters, equal to the directory name."""
    if ctx.doc.frontmatter is None:
        return
    name = ctx.doc.meta.get("name")
    if name is None:
        yield Finding("error", "name", f"name is missing: add `name: {ctx.doc.skill_id}`")
        return
    if not isinstance(name, str) or not NAME_RE.match(name):
        yield Finding(
            "error",
            "name",
            f"name {name!r} must be kebab-case (lowercase letters and digits, single hyphens)",
        )
        return
    if len(name) > NAME_MAX:
        yield Finding("error", "name", f"name is {len(name)} characters; the limit is {NAME_MAX}")
    if name != ctx.doc.skill_id:
        yield Finding(
            "error", "name", f"name {name!r} must equal the directory name {ctx.doc.skill_id!r}"
        )


WHAT_MIN_WORDS = 2
"""Words (3+ letters, not stop words) the "what it does" half of a description needs."""


def _what_words(text: str) -> list[str]:
    return [w for w in re.findall(r"[a-z]{3,}", text.lower()) if w not in STOP_WORDS]


_WHEN_SENTENCE = re.compile(
    r"^\s*(?:(?:use|used|invoke|invoked|activate|trigger|load|apply|run)\b(?:\s+\w+){0,3}?\s+)?"
    r"(?:when|whenever|if)\b",
    re.IGNORECASE,
)


def sentences(text: str) -> list[str]:
    """`text` cut into sentences: after `.`, `!`, `?` or `;` followed by a space, and at blank
    lines."""
    return [p for p in re.split(r"(?<=[.!?;])\s+|\n\s*\n", text.strip()) if p.strip()]


def says_when(description: str) -> bool:
    """Some sentence of the description says when: "when" (or "whenever") followed, in the same
    sentence, by at least one word that says something ("Use when the user asks for sales"
    does; "Summarise sales figures when." and "... when you want." do not)."""
    for sentence in sentences(description):
        for match in re.finditer(r"\bwhen(?:ever)?\b", sentence, re.IGNORECASE):
            clause = _what_words(sentence[match.end() :])
            if any(w not in _FILLER for w in clause):
                return True
    return False


_FILLER = frozenset("the and you are for any one needed wanted want need".split())
"""Words that leave a "when" clause saying nothing ("when the.", "when you want.")."""


def what_it_does(description: str) -> str:
    """The part of a description that says what the skill does: every sentence but those that
    only say when to use it ("Use when ...", "Activate this skill when ..."), each cut at its
    own "when" ("Summarise sales when asked" keeps "Summarise sales")."""
    kept = []
    for sentence in sentences(description):
        if _WHEN_SENTENCE.match(sentence):
            continue
        kept.append(re.split(r"\bwhen(?:ever)?\b", sentence, maxsplit=1, flags=re.IGNORECASE)[0])
    return " ".join(kept)


def check_description(ctx: SkillContext) -> Iterator[Finding]:
    """`description`: present, ≤ 1024 chars, says when to activate, not too short to match on."""
    if ctx.doc.frontmatter is None:
        return
    text = ctx.doc.meta.get("description")
    if not isinstance(text, str) or not text.strip():
        yield Finding(
            "error", "description", "description is missing: say what the skill does and when"
        )
        return
    if len(text) > DESCRIPTION_MAX:
        yield Finding(
            "error",
            "description",
            f"description is {len(text)} characters; the limit is {DESCRIPTION_MAX}",
        )
    if not says_when(text):
        yield Finding(
            ctx.gate,
            "description-when",
            'description must say when to activate, in a sentence (e.g. "Use when the user '
            'asks for ...")',
        )
    if len(_what_words(what_it_does(text))) < WHAT_MIN_WORDS:
        yield Finding(
            ctx.gate,
            "description-what",
            "description must say what the skill does, not only when to use it (e.g. "
            '"Summarise quarterly sales for finance. Use when ...")',
        )
    if len(text) < DESCRIPTION_MIN:
        yield Finding(
            "warning",
            "description-short",
            f"description is {len(text)} characters; under {DESCRIPTION_MIN} rarely gives "
            "enough to trigger on",
        )
    listing = len(text) + len(str(ctx.doc.meta.get("when_to_use") or ""))
    if listing > LISTING_CAP:
        yield Finding(
            "warning",
            "listing-cap",
            f"description and when_to_use are {listing} characters; Claude Code truncates "
            f"the skill listing at {LISTING_CAP}",
        )


def check_official_keys(ctx: SkillContext) -> Iterator[Finding]:
    """An official skill keeps its frontmatter to `name` and `description`."""
    if not ctx.official or ctx.doc.frontmatter is None:
        return
    extra = sorted(set(ctx.doc.meta) - OFFICIAL_KEYS)
    if extra:
        yield Finding(
            "error",
            "frontmatter-keys",
            f"official skills keep frontmatter to name and description; remove {extra}",
        )


def _split_tools(value: str) -> list[str]:
    """Split on whitespace or commas that sit outside parentheses: `Bash(git log *)` stays one."""
    entries, depth, current = [], 0, ""
    for char in value:
        depth += (char == "(") - (char == ")")
        if depth <= 0 and (char.isspace() or char == ","):
            if current:
                entries.append(current)
            current = ""
            continue
        current += char
    return [*entries, current] if current else entries


TOOL_ENTRY = re.compile(r"^[A-Za-z_][\w.:*-]*(\([^()]*\))?$")


def check_allowed_tools(ctx: SkillContext) -> Iterator[Finding]:
    """`allowed-tools`: a string or a list of strings, each entry `Tool` or `Tool(spec)`."""
    if "allowed-tools" not in ctx.doc.meta:
        return
    value = ctx.doc.meta["allowed-tools"]
    if isinstance(value, str):
        entries = _split_tools(value)
    elif isinstance(value, list) and all(isinstance(v, str) for v in value):
        entries = [e for v in value for e in _split_tools(v)]
    else:
        kind = type(value).__name__
        yield Finding(
            "error",
            "allowed-tools",
            f"allowed-tools must be a string or a list of strings, got {kind}",
        )
        return
    if not entries:
        yield Finding(
            "warning", "allowed-tools", "allowed-tools is empty: remove it or name the tools"
        )
    for entry in entries:
        if not TOOL_ENTRY.match(entry):
            yield Finding(
                "warning",
                "allowed-tools",
                f"allowed-tools entry {entry!r} is not Tool or Tool(spec)",
            )


# --- body --------------------------------------------------------------------------------

COMPLETION_HEADING = re.compile(r"^(done when|completion)\b", re.IGNORECASE)
COMPLETION_LEVELS = range(1, 4)


def check_completion(ctx: SkillContext) -> Iterator[Finding]:
    """A level 1-3 heading of the document (not one inside a code fence, a quote or a list)
    starting `Done when` or `Completion`, with something under it, says when the work is done."""
    from pytest_evalloop.skills.body import outline

    sections = [
        h
        for h in outline(ctx.doc.body).headings
        if h.level in COMPLETION_LEVELS and COMPLETION_HEADING.match(h.text)
    ]
    if not sections:
        yield Finding(
            ctx.gate,
            "completion",
            'no completion section: add a "## Done when" heading saying when the work is done',
        )
    elif not any(h.has_content for h in sections):
        line = ctx.doc.body_line + sections[0].line - 1
        yield Finding(
            ctx.gate,
            "completion",
            f'the "{sections[0].text}" section (line {line}) is empty: say under it when the '
            "work is done",
        )


def check_size(ctx: SkillContext) -> Iterator[Finding]:
    """Size policy over the whole file: ideal 30-120, soft 200, review 300, maximum 500 lines."""
    lines = ctx.doc.line_count
    if lines > SIZE_MAX:
        yield Finding(
            "error",
            "size",
            f"SKILL.md is {lines} lines; the maximum is {SIZE_MAX}: move detail into files "
            "the skill references",
        )
    elif lines > SIZE_REVIEW:
        yield Finding(
            "warning",
            "size",
            f"SKILL.md is {lines} lines; over {SIZE_REVIEW} needs a design review",
        )
    elif lines > SIZE_SOFT:
        yield Finding(
            "warning", "size", f"SKILL.md is {lines} lines; over the soft limit of {SIZE_SOFT}"
        )
    elif not SIZE_IDEAL[0] <= lines <= SIZE_IDEAL[1]:
        low, high = SIZE_IDEAL
        yield Finding("info", "size", f"SKILL.md is {lines} lines; the ideal is {low}-{high}")


def check_size_bytes(ctx: SkillContext) -> Iterator[Finding]:
    """Size in bytes (whole file) and estimated tokens (the body the agent loads): lines alone
    let a file of any length pass on one line."""
    size = ctx.doc.size_bytes
    if size > SIZE_MAX_BYTES:
        yield Finding(
            "error",
            "size-bytes",
            f"SKILL.md is {size:,} bytes; the maximum is {SIZE_MAX_BYTES:,} (the {SIZE_MAX}-line "
            "maximum at 80 characters a line): move detail into files the skill references",
        )
    tokens = ctx.doc.body_tokens
    if tokens > TOKEN_BUDGET:
        yield Finding(
            "warning",
            "size-tokens",
            f"the body is about {tokens:,} tokens (UTF-8 bytes / 4), loaded at every activation; "
            f"the budget is {TOKEN_BUDGET:,}",
        )


def check_named_files(ctx: SkillContext) -> Iterator[Finding]:
    """Every file SKILL.md names (a relative link, or a path into `scripts/`, `references/` or
    `assets/`, in prose, code or frontmatter) exists in the skill directory: an agent told to
    run a script that is not there fails at the step."""
    from pytest_evalloop.skills.body import Named, outline, resource_paths

    doc = ctx.doc
    named = [Named(n.path, doc.body_line + n.line - 1) for n in outline(doc.body).named]
    if doc.frontmatter is not None:
        head = doc.text.splitlines()[: doc.body_line - 1]
        named += [Named(p, i) for i, text in enumerate(head, start=1) for p in resource_paths(text)]
    root = doc.directory.resolve()
    reported = set()
    for item in named:
        if item.path in reported:
            continue
        target = (doc.directory / item.path).resolve()
        if not target.is_relative_to(root):
            reported.add(item.path)
            yield Finding(
                "error",
                "files",
                f"SKILL.md names {item.path} (line {item.line}), which lies outside the skill "
                "directory: installed skills carry only their own files",
            )
        elif not target.exists():
            reported.add(item.path)
            yield Finding(
                "error",
                "files",
                f"SKILL.md names {item.path} (line {item.line}), which does not exist in the "
                "skill directory: add it or fix the name",
            )


def check_scripts(ctx: SkillContext) -> Iterator[Finding]:
    """Every file in `scripts/` is named in SKILL.md, or nothing will ever run it."""
    scripts = ctx.doc.directory / "scripts"
    if not scripts.is_dir():
        return
    for path in sorted(p for p in scripts.rglob("*") if p.is_file()):
        relative = path.relative_to(ctx.doc.directory).as_posix()
        if relative not in ctx.doc.text and path.name not in ctx.doc.text:
            yield Finding(
                "warning",
                "scripts",
                f"{relative} is not mentioned in SKILL.md: reference it or delete it",
            )


# --- sidecar -----------------------------------------------------------------------------


def check_sidecar(ctx: SkillContext) -> Iterator[Finding]:
    """`agileflow.skill.yaml`: present (the release gate asks for one), valid against the strict
    schema, package named."""
    doc = ctx.doc
    if doc.sidecar_error:
        yield Finding("error", "sidecar", f"{SIDECAR_FILE} {doc.sidecar_error}")
        return
    if doc.sidecar is None:
        yield Finding(
            ctx.gate,
            "sidecar",
            f"{SIDECAR_FILE} is missing: add one beside SKILL.md (schema: 1, package name and "
            "version, activation mode, requirements, capabilities, compatibility)",
        )
        return
    try:
        sidecar = Sidecar.model_validate(doc.sidecar)
    except ValidationError as exc:
        for err in exc.errors():
            key = ".".join(str(p) for p in err["loc"])
            what = "unknown key" if err["type"] == "extra_forbidden" else err["msg"]
            yield Finding("error", "sidecar", f"{SIDECAR_FILE}: {key}: {what}")
        return
    name = sidecar.package.name
    if name.startswith(OFFICIAL_PREFIX) and name != f"{OFFICIAL_PREFIX}{doc.skill_id}":
        yield Finding(
            "error",
            "sidecar",
            f"{SIDECAR_FILE}: package.name {name!r} must be {OFFICIAL_PREFIX}{doc.skill_id}",
        )


# --- scenarios ---------------------------------------------------------------------------


def check_scenario_files(ctx: SkillContext) -> Iterator[Finding]:
    """Every scenario file parses, and fits its skill: `skill`, `name`, invocation, forbid."""
    for loaded in ctx.scenarios:
        where = f"evals/{loaded.path.name}"
        if loaded.scenario is None:
            yield Finding("error", "scenario", f"{where}: {loaded.error}")
            continue
        yield from _scenario_problems(ctx, where, loaded.path, loaded.scenario)


def _scenario_problems(
    ctx: SkillContext, where: str, path: Path, scenario: Scenario
) -> Iterator[Finding]:
    skill_id = ctx.doc.skill_id
    if scenario.skill != skill_id:
        yield Finding(
            "error", "scenario", f"{where}: skill {scenario.skill!r} must be {skill_id!r}"
        )
    if scenario.name != path.stem:
        yield Finding(
            "error", "scenario", f"{where}: name {scenario.name!r} must equal the file stem"
        )
    if ctx.manual and scenario.positive and scenario.invocation != "explicit":
        yield Finding(
            "error",
            "scenario",
            f"{where}: a manual skill's positive scenario needs invocation: explicit",
        )
    if scenario.kind == "adversarial" and scenario.forbid is None:
        yield Finding("error", "scenario", f"{where}: kind adversarial needs a forbid block")
    yield from _neighbor_problems(ctx, where, scenario)
    if scenario.fixture and ctx.fixtures_dir is not None:
        if not (ctx.fixtures_dir / scenario.fixture).is_dir():
            yield Finding(
                "error",
                "scenario",
                f"{where}: fixture {scenario.fixture!r} is not a directory in {ctx.fixtures_dir}",
            )


def _neighbor_problems(ctx: SkillContext, where: str, scenario: Scenario) -> Iterator[Finding]:
    neighbor = scenario.neighbor
    if neighbor is None:
        return
    if neighbor == ctx.doc.skill_id:
        yield Finding(
            "error", "scenario", f"{where}: neighbor {neighbor!r} is this skill; name another"
        )
        return
    if scenario.positive:
        yield Finding(
            "warning",
            "scenario",
            f"{where}: neighbor is set on a positive scenario; it belongs on negatives",
        )
    if ctx.catalog and neighbor not in ctx.catalog:
        yield Finding(
            "warning", "scenario", f"{where}: neighbor {neighbor!r} is not a skill of the catalog"
        )


def check_scenario_coverage(ctx: SkillContext) -> Iterator[Finding]:
    """At least three scenarios, a negative, a positive, and a positive that can be graded."""
    if any(s.scenario is None for s in ctx.scenarios):
        return  # the load error is the finding; counting the rest would mislead
    scenarios = ctx.valid_scenarios
    positives = [s for s in scenarios if s.positive]
    if len(scenarios) < MIN_SCENARIOS:
        yield Finding(
            ctx.gate,
            "scenarios",
            f"{len(scenarios)} scenario(s) in evals/; the gate needs at least {MIN_SCENARIOS}",
        )
    if not any(not s.positive for s in scenarios):
        yield Finding(ctx.gate, "scenarios", "no negative scenario (assert: shouldActivate: false)")
    if not positives:
        yield Finding(ctx.gate, "scenarios", "no positive scenario (assert: shouldActivate: true)")
    elif not any(s.rubric or s.interaction for s in positives):
        yield Finding(ctx.gate, "scenarios", "no positive scenario has a rubric or interaction")


STOP_WORDS = frozenset(
    "about after also another before does each from have into just more most only other over same "
    "skill some such than that their them then there these they this those through under "
    "user very what when where whether which while will with would your".split()
)


def content_words(text: str) -> set[str]:
    """Description words for similarity: lowercased, `ing|ed|es|s` stripped, ≥ 4 chars, no stop."""
    words = set()
    for word in re.findall(r"[a-z0-9]+", text.lower()):
        if word in STOP_WORDS:
            continue
        stem = re.sub(r"(ing|ed|es|s)$", "", word)
        if len(stem) >= 4 and stem not in STOP_WORDS:
            words.add(stem)
    return words


def neighbours(skill_id: str, catalog: dict[str, str], top: int = 2) -> list[str]:
    """The `top` other skills whose descriptions are most similar (Jaccard ≥ 0.1), best first."""
    mine = content_words(catalog.get(skill_id, ""))
    scored = []
    for other, text in catalog.items():
        theirs = content_words(text)
        if other == skill_id or not (mine | theirs):
            continue
        similarity = len(mine & theirs) / len(mine | theirs)
        if similarity >= 0.1:
            scored.append((-similarity, other))
    return [other for _, other in sorted(scored)[:top]]


def check_neighbour_coverage(ctx: SkillContext) -> Iterator[Finding]:
    """A negative scenario names one of the skill's nearest neighbours in the catalog."""
    near = neighbours(ctx.doc.skill_id, ctx.catalog)
    if not near:
        return
    named = {s.neighbor for s in ctx.valid_scenarios if not s.positive}
    if not named & set(near):
        choices = " or ".join(near)
        yield Finding(
            "warning",
            "neighbors",
            f"no negative scenario names a nearest neighbour (neighbor: {choices}); add one so "
            "a trigger overlap shows up",
        )


CHECKS: tuple[Callable[[SkillContext], Iterator[Finding]], ...] = (
    check_frontmatter,
    check_name,
    check_description,
    check_official_keys,
    check_allowed_tools,
    check_completion,
    check_size,
    check_size_bytes,
    check_named_files,
    check_scripts,
    check_sidecar,
    check_scenario_files,
    check_scenario_coverage,
    check_neighbour_coverage,
)


def lint(ctx: SkillContext) -> list[Finding]:
    """Every finding of every check, in check order."""
    return [finding for check in CHECKS for finding in check(ctx)]


def passed(findings: list[Finding]) -> bool:
    """A skill passes the gate when nothing is an error."""
    return not any(f.level == "error" for f in findings)


# --- loading -----------------------------------------------------------------------------


def load_scenarios(skill_dir: Path) -> list[LoadedScenario]:
    """Every scenario file of a skill, parsed; a bad file keeps its error instead of raising."""
    loaded = []
    for path in scenario_files(skill_dir):
        try:
            loaded.append(LoadedScenario(path, scenario=load_scenario(path)))
        except ScenarioError as exc:
            # The path is already in the finding's `where`; keep only the problem.
            loaded.append(LoadedScenario(path, error=str(exc).removeprefix(f"{path}: ")))
    return loaded


def load_catalog(root: Path) -> dict[str, str]:
    """Skill id → description for every `<root>/<id>/SKILL.md` (description '' when unreadable)."""
    catalog = {}
    for path in sorted(root.glob(f"*/{SKILL_FILE}")):
        description = read_skill(path).meta.get("description")
        catalog[path.parent.name] = description if isinstance(description, str) else ""
    return catalog


def context_for(
    skill_md: Path,
    *,
    strictness: Strictness = "strict",
    catalog: dict[str, str] | None = None,
    fixtures_dir: Path | None = None,
) -> SkillContext:
    """Read a skill and everything its checks need (the catalog defaults to its siblings)."""
    return SkillContext(
        doc=read_skill(skill_md),
        scenarios=load_scenarios(skill_md.parent),
        catalog=load_catalog(skill_md.parent.parent) if catalog is None else catalog,
        strictness=strictness,
        fixtures_dir=fixtures_dir,
    )


def summary_row(ctx: SkillContext, findings: list[Finding]) -> dict[str, Any]:
    """The gate table's row: SKILL LINES BYTES TOKENS EVALS NEGATIVE RESULT."""
    scenarios = ctx.valid_scenarios
    return {
        "skill": ctx.doc.skill_id,
        "lines": ctx.doc.line_count,
        "bytes": ctx.doc.size_bytes,
        "tokens": ctx.doc.body_tokens,
        "evals": len(ctx.scenarios),
        "negative": sum(1 for s in scenarios if not s.positive),
        "result": "pass" if passed(findings) else "fail",
    }
