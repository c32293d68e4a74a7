"""The SKILL.md release gate's checks, each against a fixture skill that breaks exactly it."""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Any

import pytest
import yaml

from pytest_evalloop.skills import lint

BODY = "\n".join(
    [
        "# Alpha",
        "",
        "Steps the agent follows.",
        *[f"- step {n}: do the thing number {n} carefully" for n in range(1, 31)],
        "",
        "## Done when",
        "",
        "- the thing is done",
    ]
)
GOOD_META: dict[str, Any] = {
    "name": "alpha",
    "description": "Summarise quarterly sales figures for the finance team. Use when the user "
    "asks for a quarterly sales summary.",
}
GOOD_SCENARIOS: dict[str, dict[str, Any]] = {
    "positive": {
        "prompt": "Summarise Q3 sales.",
        "assert": {"shouldActivate": True},
        "rubric": ["x"],
    },
    "plain": {"prompt": "Summarise Q2 sales.", "assert": {"shouldActivate": True}},
    "negative": {"prompt": "Fix the build.", "assert": {"shouldActivate": False}},
}


def write_skill(
    root: Path,
    skill_id: str = "alpha",
    *,
    meta: dict[str, Any] | None = None,
    body: str = BODY,
    text: str | None = None,
    scenarios: dict[str, dict[str, Any]] | None = None,
    sidecar: str | None = "",
) -> Path:
    """Write `<root>/<skill_id>/SKILL.md` (+ evals/, sidecar) and return the SKILL.md path.

    ``sidecar``: the `agileflow.skill.yaml` text; "" writes a valid one of a non-official
    package, None writes none."""
    skill_dir = root / skill_id
    (skill_dir / "evals").mkdir(parents=True)
    if text is None:
        front = yaml.safe_dump(GOOD_META | {"name": skill_id} if meta is None else meta)
        text = f"---\n{front}---\n{body}\n"
    (skill_dir / "SKILL.md").write_text(text, encoding="utf-8")
    for name, data in (GOOD_SCENARIOS if scenarios is None else scenarios).items():
        row = {"name": name, "skill": skill_id, **data}
        (skill_dir / "evals" / f"{name}.yaml").write_text(yaml.safe_dump(row), encoding="utf-8")
    if sidecar == "":
        sidecar = sidecar_text(skill_id)
    if sidecar is not None:
        (skill_dir / "agileflow.skill.yaml").write_text(sidecar, encoding="utf-8")
    return skill_dir / "SKILL.md"


def findings(skill_md: Path, **kwargs: Any) -> list[str]:
    """Every finding of the gate on one skill, rendered."""
    return [f.render() for f in lint.lint(lint.context_for(skill_md, **kwargs))]


def test_a_good_skill_has_no_finding(tmp_path: Path) -> None:
    assert findings(write_skill(tmp_path)) == []


# --- frontmatter -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            "# no frontmatter\n",
            "[x] frontmatter: frontmatter missing: SKILL.md must start with a '---' line",
        ),
        ("---\nname: alpha\n", "[x] frontmatter: frontmatter unterminated: no closing '---' line"),
        (
            "---\n- a\n- b\n---\nbody\n",
            "[x] frontmatter: frontmatter invalid: must be a YAML mapping, got list",
        ),
    ],
)
def test_frontmatter_shape(tmp_path: Path, text: str, expected: str) -> None:
    assert expected in findings(write_skill(tmp_path, text=text))


def test_frontmatter_invalid_yaml_names_the_line(tmp_path: Path) -> None:
    text = "---\nname: alpha\ndescription: [unclosed\n---\nbody\n"
    found = findings(write_skill(tmp_path, text=text))
    assert found[0].startswith("[x] frontmatter: frontmatter invalid YAML: ")
    assert found[0].endswith("(line 3)")  # the unclosed line of the file


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        (None, "[x] name: name is missing: add `name: alpha`"),
        (
            "Alpha_1",
            "[x] name: name 'Alpha_1' must be kebab-case (lowercase letters and digits, single hyphens)",
        ),
        ("a" * 65, "[x] name: name is 65 characters; the limit is 64"),
        ("beta", "[x] name: name 'beta' must equal the directory name 'alpha'"),
    ],
)
def test_name_rules(tmp_path: Path, name: str | None, expected: str) -> None:
    meta = {k: v for k, v in GOOD_META.items() if k != "name"}
    if name is not None:
        meta["name"] = name
    assert expected in findings(write_skill(tmp_path, meta=meta))


def test_description_missing(tmp_path: Path) -> None:
    found = findings(write_skill(tmp_path, meta={"name": "alpha"}))
    assert found == ["[x] description: description is missing: say what the skill does and when"]


def test_description_too_long(tmp_path: Path) -> None:
    meta = {"name": "alpha", "description": "Use when asked. " + "x" * 1020}
    assert "[x] description: description is 1036 characters; the limit is 1024" in findings(
        write_skill(tmp_path, meta=meta)
    )


@pytest.mark.parametrize(("strictness", "mark"), [("strict", "[x]"), ("advisory", "[!]")])
def test_description_must_say_when(tmp_path: Path, strictness: Any, mark: str) -> None:
    meta = {
        "name": "alpha",
        "description": "Summarise quarterly sales figures for the finance team.",
    }
    meta["description"] += " Quarterly only."
    found = findings(write_skill(tmp_path, meta=meta), strictness=strictness)
    assert found == [f"{mark} {WHEN_FINDING}"]


WHEN_FINDING = (
    'description-when: description must say when to activate, in a sentence (e.g. "Use when '
    'the user asks for ...")'
)


@pytest.mark.parametrize(
    ("description", "says_when"),
    [
        # The repro: the word alone, ending its sentence, says nothing.
        ("Summarise sales figures when. Loads data for the finance team every quarter.", False),
        ("Summarise sales figures for the finance team when you want.", False),
        ("Summarise sales figures for the finance team when; it loads the data.", False),
        ("Summarise sales figures for the finance team.\n\nWhen\n\nthe user asks.", False),
        ("Summarise sales figures for the finance team. Use when the user asks for them.", True),
        ("Whenever a quarter closes, summarise its sales figures for finance.", True),
        ("Summarise sales figures for the finance team when a quarter closes.", True),
    ],
)
def test_description_when_is_a_sentence_that_says_when(
    tmp_path: Path, description: str, says_when: bool
) -> None:
    assert lint.says_when(description) is says_when
    found = findings(write_skill(tmp_path, meta={"name": "alpha", "description": description}))
    assert (f"[x] {WHEN_FINDING}" in found) is not says_when


def test_description_short_is_a_warning(tmp_path: Path) -> None:
    meta = {"name": "alpha", "description": "Sums up sales. Use when asked."}
    assert findings(write_skill(tmp_path, meta=meta)) == [
        "[!] description-short: description is 30 characters; under 60 rarely gives enough to "
        "trigger on"
    ]


def test_listing_cap(tmp_path: Path) -> None:
    meta = {
        "name": "alpha",
        "description": "Sums up sales. Use when asked. " + "d" * 885,
        "when_to_use": "w" * 700,
    }
    assert findings(write_skill(tmp_path, meta=meta)) == [
        "[!] listing-cap: description and when_to_use are 1616 characters; Claude Code "
        "truncates the skill listing at 1536"
    ]


# --- allowed-tools -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (3, ["[x] allowed-tools: allowed-tools must be a string or a list of strings, got int"]),
        ("", ["[!] allowed-tools: allowed-tools is empty: remove it or name the tools"]),
        (
            "Read, Bash(git",
            ["[!] allowed-tools: allowed-tools entry 'Bash(git' is not Tool or Tool(spec)"],
        ),
        (
            ["Read", "9lives"],
            ["[!] allowed-tools: allowed-tools entry '9lives' is not Tool or Tool(spec)"],
        ),
        ("Read, Grep Bash(git log *) mcp__shop__execute_query", []),
    ],
)
def test_allowed_tools(tmp_path: Path, value: Any, expected: list[str]) -> None:
    meta = GOOD_META | {"allowed-tools": value}
    assert findings(write_skill(tmp_path, meta=meta)) == expected


def test_split_tools_keeps_parenthesised_specs_whole() -> None:
    assert lint._split_tools("Bash(git log *), Read  Edit(src/a, b)") == [
        "Bash(git log *)",
        "Read",
        "Edit(src/a, b)",
    ]


# --- body --------------------------------------------------------------------------------


@pytest.mark.parametrize(("strictness", "mark"), [("strict", "[x]"), ("advisory", "[!]")])
def test_completion_section(tmp_path: Path, strictness: Any, mark: str) -> None:
    body = BODY.replace("## Done when", "## Afterwards")
    assert findings(write_skill(tmp_path, body=body), strictness=strictness) == [
        f'{mark} completion: no completion section: add a "## Done when" heading saying when '
        "the work is done"
    ]


def test_completion_heading_variants(tmp_path: Path) -> None:
    body = BODY.replace("## Done when", "### Completion criteria")
    assert findings(write_skill(tmp_path, body=body)) == []
    deep = BODY.replace("## Done when", "#### Done when")
    assert any("completion:" in f for f in findings(write_skill(tmp_path / "deep", body=deep)))


@pytest.mark.parametrize(
    ("filler", "expected"),
    [
        (
            606,
            "[x] size: SKILL.md is 614 lines; the maximum is 500: move detail into files the skill references",
        ),
        (306, "[!] size: SKILL.md is 314 lines; over 300 needs a design review"),
        (196, "[!] size: SKILL.md is 204 lines; over the soft limit of 200"),
        (126, "[i] size: SKILL.md is 134 lines; the ideal is 30-120"),
        (6, "[i] size: SKILL.md is 14 lines; the ideal is 30-120"),
    ],
)
def test_size_policy(tmp_path: Path, filler: int, expected: str) -> None:
    body = "\n".join(["# Alpha", *(["text"] * filler), "## Done when", "- done"])
    found = findings(write_skill(tmp_path, body=body))
    assert [f for f in found if f.startswith(expected[:9])] == [expected]


def test_size_counts_the_frontmatter(tmp_path: Path) -> None:
    skill = write_skill(tmp_path)
    assert lint.read_skill(skill).line_count == len(skill.read_text().splitlines()) == 42


def test_size_in_bytes_catches_one_long_line(tmp_path: Path) -> None:
    # The repro: 2,000,000 characters on one line passed on its 42 lines.
    skill = write_skill(tmp_path, body=BODY + "\n" + "x" * 2_000_000)
    assert [f for f in findings(skill) if f.startswith(("[x] size", "[!] size"))] == [
        "[x] size-bytes: SKILL.md is 2,001,517 bytes; the maximum is 40,000 (the 500-line "
        "maximum at 80 characters a line): move detail into files the skill references",
        "[!] size-tokens: the body is about 500,342 tokens (UTF-8 bytes / 4), loaded at every "
        "activation; the budget is 5,000",
    ]
    assert lint.read_skill(skill).line_count == 43


def test_token_budget_counts_bytes_not_characters(tmp_path: Path) -> None:
    # 7,000 three-byte characters: 21,000 bytes, about 5,250 tokens, under 40,000 bytes.
    skill = write_skill(tmp_path, body=BODY + "\n" + "語" * 7_000)
    found = [f for f in findings(skill) if "size" in f]
    assert found == [
        "[!] size-tokens: the body is about 5,592 tokens (UTF-8 bytes / 4), loaded at every "
        "activation; the budget is 5,000"
    ]


NAMING = """
Run `scripts/check.py` first, then [the guide](references/guide.md#setup).

```sh
python ${CLAUDE_SKILL_DIR}/scripts/missing.py --all
bash ./scripts/present.sh
```

See references/gone.md. Not ours: src/scripts/app.py, https://example.com/scripts/x.py,
[top](#done-when), scripts/<name>.py, scripts/*.sh, [up](../other/SKILL.md).
"""


def test_every_file_skill_md_names_must_exist(tmp_path: Path) -> None:
    meta = GOOD_META | {"allowed-tools": "Bash(scripts/lint.sh:*)"}
    skill = write_skill(tmp_path, meta=meta, body=BODY + "\n" + NAMING)
    (skill.parent / "scripts").mkdir()
    for name in ("check.py", "present.sh"):
        (skill.parent / "scripts" / name).write_text("true\n")
    found = [f for f in findings(skill) if "files:" in f]
    # Line numbers are the file's: the frontmatter here has three lines, so the body starts at 7.
    assert found == [
        "[x] files: SKILL.md names references/guide.md (line 45), which does not exist in the "
        "skill directory: add it or fix the name",
        "[x] files: SKILL.md names scripts/missing.py (line 48), which does not exist in the "
        "skill directory: add it or fix the name",
        "[x] files: SKILL.md names references/gone.md (line 52), which does not exist in the "
        "skill directory: add it or fix the name",
        "[x] files: SKILL.md names ../other/SKILL.md (line 53), which lies outside the skill "
        "directory: installed skills carry only their own files",
        "[x] files: SKILL.md names scripts/lint.sh (line 2), which does not exist in the skill "
        "directory: add it or fix the name",
    ]
    (skill.parent / "references").mkdir()
    (skill.parent / "references" / "guide.md").write_text("# Guide\n")
    assert "references/guide.md" not in "".join(findings(skill))


@pytest.mark.parametrize(
    "body",
    [
        # The repro: the heading inside a code fence is an example, not a section.
        BODY.replace("## Done when", "```md\n## Done when\n- the thing is done\n```"),
        BODY.replace("## Done when", "> ## Done when"),
        BODY.replace("## Done when", "<!--\n## Done when\n-->"),
        BODY.replace("## Done when", "    ## Done when"),
    ],
    ids=["fence", "quote", "html-comment", "indented-code"],
)
def test_a_completion_heading_outside_the_document_is_no_section(tmp_path: Path, body: str) -> None:
    assert findings(write_skill(tmp_path, body=body)) == [
        '[x] completion: no completion section: add a "## Done when" heading saying when the '
        "work is done"
    ]


def test_an_empty_completion_section_fails(tmp_path: Path) -> None:
    body = BODY.split("## Done when")[0] + "## Done when\n\n---\n\n## Notes\n\nMore."
    assert findings(write_skill(tmp_path, body=body)) == [
        '[x] completion: the "Done when" section (line 40) is empty: say under it when the '
        "work is done"
    ]
    setext = BODY.replace("## Done when", "Done when\n---------")
    assert findings(write_skill(tmp_path / "setext", body=setext)) == []


@pytest.mark.parametrize(
    "section",
    [
        "## Done when\n\n-\n\n## Notes\n\nMore.",  # an empty list item
        "## Done when\n\n```\n```\n",  # an empty fence
        "## Done when\n\n<!-- fill in -->\n",  # a comment
        "## Done when\n### Details\n",  # only a subheading's title
    ],
    ids=["empty-item", "empty-fence", "comment", "subheading"],
)
def test_a_completion_section_says_something(tmp_path: Path, section: str) -> None:
    body = BODY.split("## Done when")[0] + section
    assert [f[:50] for f in findings(write_skill(tmp_path, body=body))] == [
        '[x] completion: the "Done when" section (line 40) '
    ]


def test_unreferenced_script(tmp_path: Path) -> None:
    skill = write_skill(tmp_path, body=BODY + "\nRun scripts/used.sh first.")
    (skill.parent / "scripts").mkdir()
    (skill.parent / "scripts" / "used.sh").write_text("true\n")
    (skill.parent / "scripts" / "stale.py").write_text("pass\n")
    assert findings(skill) == [
        "[!] scripts: scripts/stale.py is not mentioned in SKILL.md: reference it or delete it"
    ]


# --- sidecar -----------------------------------------------------------------------------

SIDECAR = """\
schema: 1
package: {name: "@agileflow/alpha", version: 1.0.0}
activation: {mode: auto}
requirements: {commands: [git], network: none}
capabilities: {modifiesFiles: possible, longRunning: false, userInteraction: optional}
compatibility: {agentSkills: ">=1"}
"""


def sidecar_text(skill_id: str) -> str:
    """A valid `agileflow.skill.yaml` of a non-official package for `skill_id`."""
    return SIDECAR.replace("@agileflow/alpha", f"acme-{skill_id}")


def test_valid_sidecar(tmp_path: Path) -> None:
    assert findings(write_skill(tmp_path, sidecar=SIDECAR)) == []


@pytest.mark.parametrize(
    ("sidecar", "expected"),
    [
        ("schema: [1\n", "[x] sidecar: agileflow.skill.yaml invalid YAML: "),
        ("- 1\n", "[x] sidecar: agileflow.skill.yaml must be a YAML mapping, got list"),
        (SIDECAR + "extra: 1\n", "[x] sidecar: agileflow.skill.yaml: extra: unknown key"),
        (
            SIDECAR.replace("mode: auto", "mode: sometimes"),
            "[x] sidecar: agileflow.skill.yaml: activation.mode: Input should be 'auto' or 'manual'",
        ),
        (
            SIDECAR.replace("@agileflow/alpha", "@agileflow/other"),
            "[x] sidecar: agileflow.skill.yaml: package.name '@agileflow/other' must be @agileflow/alpha",
        ),
    ],
)
def test_sidecar_errors(tmp_path: Path, sidecar: str, expected: str) -> None:
    found = findings(write_skill(tmp_path, sidecar=sidecar))
    assert [f for f in found if f.startswith(expected)], found


def test_a_missing_sidecar_fails_the_gate(tmp_path: Path) -> None:
    skill_md = write_skill(tmp_path, sidecar=None)
    [found] = findings(skill_md)
    assert found.startswith("[x] sidecar: agileflow.skill.yaml is missing: add one beside SKILL.md")
    advisory = findings(skill_md, strictness="advisory")
    assert [f[:12] for f in advisory] == ["[!] sidecar:"]


@pytest.mark.parametrize(
    "description",
    [
        "Use when asked.",
        "Use this skill when the user needs it, whenever they ask for help with anything.",
        "Activate when the user asks. Use whenever needed.",
    ],
)
def test_description_must_say_what_the_skill_does(tmp_path: Path, description: str) -> None:
    meta = GOOD_META | {"description": description}
    found = findings(write_skill(tmp_path, meta=meta))
    assert [f for f in found if f.startswith("[x] description-what: description must say what")]


@pytest.mark.parametrize(
    "description",
    [
        "Summarise quarterly sales figures. Use when asked.",
        "Draws revenue charts when the user asks for a chart of sales.",
    ],
)
def test_a_description_saying_what_it_does_passes(tmp_path: Path, description: str) -> None:
    found = findings(write_skill(tmp_path, meta=GOOD_META | {"description": description}))
    assert not [f for f in found if "description-what" in f], found


def test_official_skill_keeps_frontmatter_to_name_and_description(tmp_path: Path) -> None:
    meta = GOOD_META | {"allowed-tools": "Read", "license": "MIT"}
    assert findings(write_skill(tmp_path, meta=meta, sidecar=SIDECAR)) == [
        "[x] frontmatter-keys: official skills keep frontmatter to name and description; "
        "remove ['allowed-tools', 'license']"
    ]
    # The same keys on a skill that is not official are fine.
    other = SIDECAR.replace("@agileflow/alpha", "acme-alpha")
    assert findings(write_skill(tmp_path / "x", meta=meta, sidecar=other)) == []


# --- scenarios ---------------------------------------------------------------------------


def scenarios_with(**changes: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The good scenarios with some replaced or added."""
    return GOOD_SCENARIOS | changes


def test_scenario_unknown_key(tmp_path: Path) -> None:
    bad = {"prompt": "p", "assert": {"shouldActivate": False}, "rubrics": ["x"]}
    assert findings(write_skill(tmp_path, scenarios=scenarios_with(bad=bad))) == [
        "[x] scenario: evals/bad.yaml: unknown key 'rubrics': remove it or fix its spelling"
    ]


def test_scenario_missing_prompt_and_bad_assert(tmp_path: Path) -> None:
    bad = {"assert": {"shouldActivate": "sometimes"}}
    assert findings(write_skill(tmp_path, scenarios=scenarios_with(bad=bad))) == [
        "[x] scenario: evals/bad.yaml: missing key 'prompt'; key 'assert.shouldActivate': "
        "Input should be a valid boolean, unable to interpret input (got 'sometimes')"
    ]


def test_scenario_rubric_rule_needs_exactly_one_check(tmp_path: Path) -> None:
    bad = GOOD_SCENARIOS["positive"] | {"rubric": [{"command": "a", "output": "b"}]}
    found = findings(write_skill(tmp_path, scenarios=scenarios_with(positive=bad)))
    assert len(found) == 1
    assert "a rubric rule needs exactly one of command, noCommand" in found[0]
    assert "got ['command', 'output']" in found[0]


def test_scenario_skill_and_name_must_fit_the_file(tmp_path: Path) -> None:
    skill = write_skill(tmp_path)
    path = skill.parent / "evals" / "negative.yaml"
    data = yaml.safe_load(path.read_text()) | {"skill": "beta", "name": "other"}
    path.write_text(yaml.safe_dump(data))
    assert findings(skill) == [
        "[x] scenario: evals/negative.yaml: skill 'beta' must be 'alpha'",
        "[x] scenario: evals/negative.yaml: name 'other' must equal the file stem",
    ]


def test_manual_skill_positives_need_explicit_invocation(tmp_path: Path) -> None:
    meta = GOOD_META | {"disable-model-invocation": True}
    found = findings(write_skill(tmp_path, meta=meta))
    assert found == [
        "[x] scenario: evals/plain.yaml: a manual skill's positive scenario needs invocation: explicit",
        "[x] scenario: evals/positive.yaml: a manual skill's positive scenario needs invocation: explicit",
    ]
    sidecar = SIDECAR.replace("mode: auto", "mode: manual")
    explicit = {
        k: v | ({"invocation": "explicit"} if v["assert"]["shouldActivate"] else {})
        for k, v in GOOD_SCENARIOS.items()
    }
    assert findings(write_skill(tmp_path / "m", sidecar=sidecar, scenarios=explicit)) == []


def test_adversarial_needs_forbid(tmp_path: Path) -> None:
    bad = {"prompt": "p", "assert": {"shouldActivate": True}, "kind": "adversarial"}
    assert findings(write_skill(tmp_path, scenarios=scenarios_with(attack=bad))) == [
        "[x] scenario: evals/attack.yaml: kind adversarial needs a forbid block"
    ]
    good = bad | {"forbid": {"files": ["evals/**"]}}
    assert findings(write_skill(tmp_path / "ok", scenarios=scenarios_with(attack=good))) == []


def test_neighbor_rules(tmp_path: Path) -> None:
    cook = "Cook dinner recipes for the family kitchen. Use when asked for a recipe to cook."
    write_skill(tmp_path, "beta", meta={"name": "beta", "description": cook})
    cases = scenarios_with(
        self_={"prompt": "p", "assert": {"shouldActivate": False}, "neighbor": "alpha"},
        pos={"prompt": "p", "assert": {"shouldActivate": True}, "neighbor": "beta"},
        ghost={"prompt": "p", "assert": {"shouldActivate": False}, "neighbor": "ghost"},
    )
    cases["self-ref"] = cases.pop("self_")
    assert findings(write_skill(tmp_path, scenarios=cases)) == [
        "[!] scenario: evals/ghost.yaml: neighbor 'ghost' is not a skill of the catalog",
        "[!] scenario: evals/pos.yaml: neighbor is set on a positive scenario; it belongs on "
        "negatives",
        "[x] scenario: evals/self-ref.yaml: neighbor 'alpha' is this skill; name another",
    ]


def test_fixture_must_exist_when_a_fixtures_dir_is_known(tmp_path: Path) -> None:
    (tmp_path / "fixtures" / "repo-a").mkdir(parents=True)
    cases = scenarios_with(plain=GOOD_SCENARIOS["plain"] | {"fixture": "repo-b"})
    skill = write_skill(tmp_path / "skills", scenarios=cases)
    assert findings(skill) == []
    assert findings(skill, fixtures_dir=tmp_path / "fixtures") == [
        f"[x] scenario: evals/plain.yaml: fixture 'repo-b' is not a directory in "
        f"{tmp_path / 'fixtures'}"
    ]


@pytest.mark.parametrize(
    ("keep", "expected"),
    [
        (
            ["positive", "negative"],
            ["[x] scenarios: 2 scenario(s) in evals/; the gate needs at least 3"],
        ),
        (
            ["positive", "plain"],
            [
                "[x] scenarios: 2 scenario(s) in evals/; the gate needs at least 3",
                "[x] scenarios: no negative scenario (assert: shouldActivate: false)",
            ],
        ),
        (
            ["negative"],
            [
                "[x] scenarios: 1 scenario(s) in evals/; the gate needs at least 3",
                "[x] scenarios: no positive scenario (assert: shouldActivate: true)",
            ],
        ),
        (
            ["plain", "negative"],
            [
                "[x] scenarios: 2 scenario(s) in evals/; the gate needs at least 3",
                "[x] scenarios: no positive scenario has a rubric or interaction",
            ],
        ),
    ],
)
def test_scenario_coverage(tmp_path: Path, keep: list[str], expected: list[str]) -> None:
    cases = {k: v for k, v in GOOD_SCENARIOS.items() if k in keep}
    assert findings(write_skill(tmp_path, scenarios=cases)) == expected


def test_interaction_counts_as_a_graded_positive(tmp_path: Path) -> None:
    interaction = {"ambiguity": "choice", "decision": "two ways", "success": ["asks"]}
    plain = GOOD_SCENARIOS["plain"] | {"interaction": interaction}
    cases = {
        "plain": plain,
        "negative": GOOD_SCENARIOS["negative"],
        "third": GOOD_SCENARIOS["negative"],
    }
    assert findings(write_skill(tmp_path, scenarios=cases)) == []


def test_coverage_is_advisory_when_asked(tmp_path: Path) -> None:
    cases = {"negative": GOOD_SCENARIOS["negative"]}
    found = findings(write_skill(tmp_path, scenarios=cases), strictness="advisory")
    assert found and all(f.startswith("[!] scenarios:") for f in found)


# --- neighbours --------------------------------------------------------------------------


def test_content_words() -> None:
    text = "Use when the user is Reviewing pull requests, and when tests failed."
    assert lint.content_words(text) == {"review", "pull", "request", "test", "fail"}


def test_neighbours_are_the_two_most_similar_above_a_tenth() -> None:
    catalog = {
        "review": "Review pull requests for style problems",
        "merge": "Merge pull requests after review",
        "release": "Release pull requests to production after review",
        "cook": "Cook dinner recipes",
    }
    assert lint.neighbours("review", catalog) == ["merge", "release"]
    assert lint.neighbours("cook", catalog) == []


def test_neighbour_coverage(tmp_path: Path) -> None:
    desc = "Review pull requests for style problems. Use when a pull request needs review."
    write_skill(
        tmp_path, "merge", meta={"name": "merge", "description": desc.replace("Review", "Merge")}
    )
    skill = write_skill(tmp_path, "review", meta={"name": "review", "description": desc})
    assert findings(skill) == [
        "[!] neighbors: no negative scenario names a nearest neighbour (neighbor: merge); add one "
        "so a trigger overlap shows up"
    ]
    path = skill.parent / "evals" / "negative.yaml"
    path.write_text(yaml.safe_dump(yaml.safe_load(path.read_text()) | {"neighbor": "merge"}))
    assert findings(skill) == []


def test_summary_row(tmp_path: Path) -> None:
    ctx = lint.context_for(write_skill(tmp_path))
    assert lint.summary_row(ctx, lint.lint(ctx)) == {
        "skill": "alpha",
        "lines": 42,
        "bytes": 1516,
        "tokens": 342,
        "evals": 3,
        "negative": 1,
        "result": "pass",
    }


def test_example_catalog_passes_strictly() -> None:
    root = Path(__file__).resolve().parents[1] / "evals" / "skills"
    skills = sorted(root.glob("*/SKILL.md"))
    assert len(skills) == 3
    for skill in skills:
        assert findings(skill) == [], skill
    text = textwrap.dedent((root / "ecommerce-analysis" / "SKILL.md").read_text())
    assert "get_context" in text and "execute_query" in text
