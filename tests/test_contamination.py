"""Contamination check over a host-side tool log (seed 001)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from pytest_evalloop.answer.contamination import ContaminationResult, ToolUse, check_contamination


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    """A repo with a set dir (cases, gold) and the model under test outside it."""
    set_dir = tmp_path / "evals" / "shop"
    (set_dir / "gold").mkdir(parents=True)
    (set_dir / "cases.jsonl").write_text("{}\n")
    (set_dir / "set.json").write_text("{}")
    (set_dir / "gold" / "q_rev.json").write_text("[]")
    (tmp_path / "models").mkdir()
    (tmp_path / "models" / "shop.malloy").write_text("source: x is y")
    return tmp_path


def _check(repo: Path, *uses: ToolUse, reported: int | None = None) -> ContaminationResult:
    return check_contamination(
        list(uses),
        reported_calls=reported,
        protected_paths=[repo / "evals" / "shop", repo / "evals" / "shop" / "gold" / "q_rev.json"],
        model_paths=[repo / "models" / "shop.malloy"],
    )


def shell(command: str) -> ToolUse:
    return ToolUse(tool="Bash", input={"command": command}, is_mcp=False)


def query(sql: str, **extra: Any) -> ToolUse:
    return ToolUse(tool="execute_query", input={"query": sql, **extra}, is_mcp=True)


def test_no_log_is_unknown(repo: Path) -> None:
    result = check_contamination(
        None, reported_calls=3, protected_paths=[repo / "evals"], model_paths=[]
    )
    assert result.contaminated == "unknown" and result.reasons


def test_clean_attempt(repo: Path) -> None:
    result = _check(
        repo,
        ToolUse(tool="get_context", input={"query": "revenue by status"}, is_mcp=True),
        query(
            "SELECT status, count(*) AS n FROM orders WHERE status = 'gold' "
            "AND json_extract(meta, '$.set.json') IS NULL GROUP BY status",
            modelPath=str(repo / "models" / "shop.malloy"),
        ),
        reported=2,
    )
    assert result == ContaminationResult(contaminated=False, reasons=[])


@pytest.mark.parametrize(
    "use",
    [
        ToolUse(tool="Read", input={"file_path": "ABS/evals/shop/cases.jsonl"}, is_mcp=False),
        shell("cat evals/shop/gold/q_rev.json"),
        shell("cd ABS && ls ./evals//shop/"),
        shell("head -3 cases.jsonl"),
        shell("python -c \"import json; json.load(open('gold/q_rev.json'))\""),
        ToolUse(tool="Grep", input={"pattern": "x", "paths": ["q_rev.json"]}, is_mcp=False),
        query("SELECT * FROM read_json('ABS/evals/shop/gold/q_rev.json')"),
        query("SELECT * FROM read_csv('evals/shop/cases.jsonl')"),
        ToolUse(tool="execute_query", input={"opts": {"nested": ["evals/shop"]}}, is_mcp=True),
    ],
)
def test_protected_path_references_are_contamination(repo: Path, use: ToolUse) -> None:
    use = ToolUse(
        tool=use.tool,
        input=_replace_abs(use.input, str(repo)),
        is_mcp=use.is_mcp,
    )
    result = _check(repo, use)
    assert result.contaminated is True
    # Worded by what was seen: a file tool touched the path, an MCP call's text named it.
    seen = "touched protected path" if not use.is_mcp else "named"
    assert any(r.startswith(f"{use.tool} {seen} ") for r in result.reasons)
    assert any(str(repo / "evals" / "shop") in r for r in result.reasons)


def _replace_abs(value: Any, root: str) -> Any:
    if isinstance(value, str):
        return value.replace("ABS", root)
    if isinstance(value, dict):
        return {k: _replace_abs(v, root) for k, v in value.items()}
    if isinstance(value, list):
        return [_replace_abs(v, root) for v in value]
    return value


@pytest.mark.parametrize(
    "text",
    [
        "SELECT cases, gold, status FROM shop",  # bare words, no file names
        "ls shop2/ && cat myevals/shop/x && echo evaluations",  # names sharing a prefix
        "SELECT 'cases.jsonlx', 'xq_rev.json'",  # names glued to other characters
        "duckdb -c 'SELECT * FROM t' && ls /tmp/*.malloy",  # wildcards naming no key file
    ],
)
def test_near_misses_are_clean(repo: Path, text: str) -> None:
    assert _check(repo, shell(text)).contaminated is False


def host(tool: str, **arguments: Any) -> ToolUse:
    return ToolUse(tool=tool, input=arguments, is_mcp=False)


# Issue 13 point 10: a host tool naming `evals` at all, or searching for the answer key's kind
# of file, is an attempt on the answer key, wherever it points (seed 001 rule 1; the reference
# harness's needles `evals/`, `gold/`, `cases.jsonl`, ...).
@pytest.mark.parametrize(
    ("use", "needle"),
    [
        (shell("ls evals/"), "evals/"),
        (shell("ls evals"), "evals"),
        (shell('ls "evals"'), "evals"),
        (shell("ls -R ./evals/ | head"), "evals/"),
        (shell("cat ../../evals/other_set/intents.jsonl"), "evals/"),
        (shell("cat ../other_set/gold/q9.csv"), "gold/"),
        (shell(r"type C:\repo\evals\shop2\README.md"), "evals/"),
        (shell("dir /s evals\\"), "evals/"),
        (shell("cat /other/checkout/events.jsonl"), "events.jsonl"),
        (shell("curl -s http://localhost:4811/api/evals%2Fshop2"), "evals/"),
        (host("Glob", pattern="evals/**"), "evals/"),
        (host("Glob", pattern="**/*", path="evals"), "evals"),
        (host("Grep", pattern="revenue", path="evals"), "evals"),
        (host("Grep", pattern="revenue", path="./evals/"), "evals/"),
        (host("LS", path="/somewhere/else/evals"), "evals"),
        (host("Read", file_path="/other/checkout/evals/shop2/notes.md"), "evals/"),
        (host("TodoWrite", todos=[{"content": "peek at gold/ for the answer"}]), "gold/"),
        # The set's own files by name: the reason names the set directory.
        (shell("find . -name cases.jsonl"), "SET"),
        (shell("cat ../../evals/other_set/cases.jsonl"), "SET"),
        (shell(r"type C:\repo\evals\shop2\set.json"), "SET"),
        (host("Read", file_path="/other/checkout/evals/shop2/cases.jsonl"), "SET"),
    ],
)
def test_a_host_tool_naming_the_eval_layout_is_contamination(
    repo: Path, use: ToolUse, needle: str
) -> None:
    result = _check(repo, use)
    assert result.contaminated is True
    needle = str(repo / "evals" / "shop") if needle == "SET" else needle
    assert result.reasons == [f"{use.tool} touched protected path {needle}"]


@pytest.mark.parametrize(
    ("use", "pattern", "name"),
    [
        (host("Glob", pattern="**/*.jsonl"), "**/*.jsonl", "cases.jsonl"),
        (host("Glob", pattern="**/cases*"), "**/cases*", "cases.jsonl"),
        (host("Glob", pattern="**/gold*/*.csv"), "**/gold*/*.csv", "gold"),
        (host("Glob", pattern="**/*"), "**/*", "cases.jsonl"),
        (host("Glob", pattern="**/*.{csv,jsonl}"), "**/*.{csv,jsonl}", "cases.jsonl"),
        (host("Grep", pattern="revenue", glob="*.jsonl"), "*.jsonl", "cases.jsonl"),
        (host("Grep", pattern="4712", type="json"), "*.json", "q_rev.json"),
        (shell("find . -name '*.jsonl'"), "*.jsonl", "cases.jsonl"),
        (shell('find / -iname "CASES*" 2>/dev/null'), "cases*", "cases.jsonl"),
        (shell("ls -la **/gold*"), "**/gold*", "gold"),
        (shell("ls */*.jsonl"), "*/*.jsonl", "cases.jsonl"),
        (shell("find .. -path '*/runs/*' -name 'run*.json'"), "run*.json", "run.json"),
        (
            ToolUse(tool="PowerShell", input={"command": "gci -r -Filter *.jsonl"}, is_mcp=False),
            "*.jsonl",
            "cases.jsonl",
        ),
    ],
)
def test_a_file_search_for_the_answer_keys_kind_is_contamination(
    repo: Path, use: ToolUse, pattern: str, name: str
) -> None:
    result = _check(repo, use)
    assert result.contaminated is True
    assert result.reasons == [
        f"{use.tool} searched for the answer key's files: {pattern!r} matches {name}"
    ]


def test_a_search_matching_only_the_model_is_left_to_the_model_rule(repo: Path) -> None:
    # The model is not the answer key: finding its name is not reading it.
    for pattern in ("**/*.malloy", "*/shop.*"):
        assert _check(repo, host("Glob", pattern=pattern)).contaminated is False


def test_the_set_dir_spelled_absolutely_or_relatively_names_the_set(repo: Path) -> None:
    set_dir = repo / "evals" / "shop"
    for command in (f"ls {set_dir}", f"ls '{set_dir}/'", "ls ../../evals/shop/gold"):
        assert _check(repo, shell(command)).reasons == [f"Bash touched protected path {set_dir}"]


@pytest.mark.parametrize(
    "use",
    [
        ToolUse(tool="get_context", input={"query": "how many evals ran last week"}, is_mcp=True),
        ToolUse(tool="get_context", input={"query": "gold/silver tier customers"}, is_mcp=True),
        query("SELECT count(*) AS evals FROM evals WHERE tier = 'gold' AND name GLOB 'cases*'"),
        query("SELECT * FROM orders", note="*.jsonl"),  # an MCP argument is not a file search
    ],
)
def test_mcp_text_mentioning_evals_is_not_contamination(repo: Path, use: ToolUse) -> None:
    """The reference checks MCP input for its needles (`evals/`, `cases.jsonl`...), never for
    the word `evals` or a wildcard: those are a question's words and a query's operators."""
    assert _check(repo, use) == ContaminationResult(contaminated=False, reasons=[])


@pytest.mark.parametrize(
    ("sql", "needle"),
    [
        ("SELECT * FROM read_csv('evals/other_set/answers.csv')", "evals/"),
        ("SELECT * FROM read_json('gold/q9.json')", "gold/"),
        ("SELECT * FROM read_text('/elsewhere/intents.jsonl')", "intents.jsonl"),
    ],
)
def test_mcp_text_naming_the_eval_layout_is_contamination(
    repo: Path, sql: str, needle: str
) -> None:
    # A query tool over DuckDB can read files: the reference's needles hold for MCP input too.
    result = _check(repo, query(sql))
    named = sql.split("'")[1]
    assert result.reasons == [f"execute_query named {named!r} (the eval layout: {needle})"]


def test_file_tool_on_the_model_is_contamination(repo: Path) -> None:
    result = _check(
        repo, ToolUse(tool="Read", input={"file_path": "models/shop.malloy"}, is_mcp=False)
    )
    assert result.contaminated is True
    assert result.reasons == [
        f"Read (a file tool) touched the model under test {repo / 'models' / 'shop.malloy'}"
    ]


def test_shell_grepping_the_model_by_name_is_contamination(repo: Path) -> None:
    assert _check(repo, shell("grep measure shop.malloy")).contaminated is True


def test_mcp_model_path_argument_is_not_contamination(repo: Path) -> None:
    use = query("SELECT 1", modelPath="models/shop.malloy")
    assert _check(repo, use).contaminated is False


def test_mcp_model_path_argument_naming_gold_is_contamination(repo: Path) -> None:
    use = query("SELECT 1", modelPath="evals/shop/gold/q_rev.json")
    result = _check(repo, use)
    assert result.contaminated is True
    assert result.reasons[0].startswith("execute_query named ")


def test_model_named_in_other_mcp_argument_keys_is_not_a_file_access(repo: Path) -> None:
    # Only file tools reading the model count; the server resolves MCP arguments itself.
    use = query("SELECT 1", source="models/shop.malloy")
    assert _check(repo, use).contaminated is False


def test_custom_model_arg_keys_exempt_only_those_keys(repo: Path) -> None:
    set_model = repo / "evals" / "shop" / "model.yaml"
    set_model.write_text("sources: []")
    use = query("SELECT 1", model="evals/shop/model.yaml")
    kwargs: dict[str, Any] = {
        "reported_calls": None,
        "protected_paths": [repo / "evals" / "shop"],
        "model_paths": [set_model],
    }
    # The model lives inside the protected set dir: named under the model key it is fine...
    ok = check_contamination([use], mcp_model_arg_keys=frozenset({"model"}), **kwargs)
    assert ok.contaminated is False
    # ...but under the default key set the same value is a reference into evals/.
    assert check_contamination([use], **kwargs).contaminated is True


def test_a_refused_mcp_read_is_worded_as_one(repo: Path) -> None:
    sql = "SELECT * FROM read_text('evals/shop/cases.jsonl')"
    use = query(sql)
    refused = ToolUse(tool=use.tool, input=use.input, is_mcp=True, refused=True)
    reasons = _check(repo, refused).reasons
    # The reason quotes the path the query named, and the protected path it lies in.
    assert reasons == [
        "a sandbox-refused read of 'evals/shop/cases.jsonl' "
        f"(execute_query; protected: {repo / 'evals' / 'shop'})"
    ]
    assert not any("answer key" in r for r in reasons)


def test_under_report_floor_counts_every_tool(repo: Path) -> None:
    uses = [query("SELECT 1"), shell("ls /tmp")]
    assert _check(repo, *uses, reported=2).contaminated is False
    result = _check(repo, *uses, reported=3)
    assert result.contaminated is True
    assert result.reasons == ["claimed 3 tool calls; the host logged 2"]


def test_reasons_name_each_offending_use(repo: Path) -> None:
    result = _check(
        repo,
        shell("cat evals/shop/set.json"),
        ToolUse(tool="Read", input={"file_path": "models/shop.malloy"}, is_mcp=False),
        reported=5,
    )
    assert len(result.reasons) == 3
    assert result.reasons[0] == f"Bash touched protected path {repo / 'evals' / 'shop'}"


def test_model_served_from_the_set_dir_may_be_named_to_mcp_by_bare_name(repo: Path) -> None:
    set_model = repo / "evals" / "shop" / "model.yaml"
    set_model.write_text("sources: []")
    kwargs: dict[str, Any] = {
        "reported_calls": None,
        "protected_paths": [repo / "evals" / "shop"],
        "model_paths": [set_model],
    }
    mcp = query("SELECT 1", modelPath="model.yaml", note="model.yaml")
    assert check_contamination([mcp], **kwargs).contaminated is False
    read = ToolUse(tool="Read", input={"file_path": "model.yaml"}, is_mcp=False)
    assert check_contamination([read], **kwargs).reasons == [
        f"Read (a file tool) touched the model under test {set_model}"
    ]


def test_a_file_added_to_a_protected_directory_is_protected_at_once(repo: Path) -> None:
    """The needles are cached between attempts; a new file in the set dir still counts."""
    read_it = shell("cat answers_key.json")
    assert _check(repo, read_it).contaminated is False
    # Some file systems stamp mtimes coarsely: make sure the directory's stamp moves.
    set_dir = repo / "evals" / "shop"
    before = set_dir.stat().st_mtime_ns
    (set_dir / "answers_key.json").write_text("{}")
    if set_dir.stat().st_mtime_ns == before:
        import os

        os.utime(set_dir, ns=(before + 1_000_000, before + 1_000_000))
    result = _check(repo, read_it)
    assert result.contaminated is True
    assert any("answers_key.json" in r or str(set_dir) in r for r in result.reasons)


# --------------------------------------------------------------------------- a whole run


def test_rule_3_fires_in_a_whole_run_and_a_missing_report_is_recorded_as_missing(
    pytester: pytest.Pytester, fake: Any
) -> None:
    """Issue 13 point 9: through the plugin, the SDK and the fake endpoint. Two tool calls
    each; the answers report them honestly, claim 9, or say nothing."""
    from pytest_evalloop.ledger import contract as ledger
    from pytest_evalloop.ledger import reader as ledger_reader
    from pytest_evalloop.sets import cases as sets
    from tests.test_run import ORACLE, make_set, only_run, run, spec

    qids = ["ecom_accounts_never_ordered", "ecom_order_count", "ecom_sales_2022"]
    set_dir = make_set(pytester.path, qids)
    question = {c.qid: c.question for _, c in sets.load_cases(set_dir).rows}
    calls, final = ORACLE[:2], ORACLE[2]
    scripts = {
        question[qids[0]]: [*calls, [final, {"report_calls": "honest"}]],
        question[qids[1]]: [*calls, [final, {"report_calls": 9}]],
        question[qids[2]]: [*calls, final],
    }
    fake.policy = spec(set_dir, answerer={"by_question": scripts}).policy()
    result = run(pytester, set_dir)
    out = result.stdout.str()
    assert result.parseoutcomes().get("passed") == 2, out
    assert result.parseoutcomes().get("errors") == 1, out
    inflated = "claimed 9 MCP calls; the host logged 2"
    assert f"contaminated: {inflated}" in out

    read = ledger_reader.read_run(only_run(set_dir))
    assert read.errors == []
    attempts = {key[0]: a for key, a in read.attempts().items()}
    recorded = {
        qid: (a.host_tool_uses, a.reported_calls, a.reported_calls_status, a.contaminated)
        for qid, a in attempts.items()
    }
    assert recorded == {
        qids[0]: (2, 2, "reported", False),
        qids[1]: (2, 9, "reported", True),
        qids[2]: (2, None, "missing", False),
    }
    assert attempts[qids[1]].contamination_reasons == [inflated]
    assert attempts[qids[0]].answer_text is not None
    assert attempts[qids[0]].answer_text.endswith("\n\nTool calls: 2")
    # On disk the missing report is null plus its state, never a count.
    lines = (only_run(set_dir) / ledger.EVENTS_FILE).read_text(encoding="utf-8").splitlines()
    raw = [json.loads(line) for line in lines]
    missing = next(e for e in raw if e["kind"] == "attempt" and e["qid"] == qids[2])
    assert (missing["reported_calls"], missing["reported_calls_status"]) == (None, "missing")
