"""The host log cannot be declined (issue 41, point 4).

Only the plugin's own backends vouch for their logs, never a class attribute; the session an
answerer of your own is handed exposes only calls it logs; a refused read spelled in pieces is
read folded, a file pattern that reaches a protected path counts, and the reason quotes what
the call named.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from pytest_evalloop.answer.answerer import AnthropicAnswerer
from pytest_evalloop.answer.contamination import ToolUse, check_contamination, fold_literals
from pytest_evalloop.answer.hostlog import HostLoggedSession, vouches
from pytest_evalloop.answer.replay import ReplayAnswerer
from pytest_evalloop.roles.contract import FinalCall, QueryOutcome, ToolOutcome, ToolSpec
from tests.test_contamination import repo  # noqa: F401 - the fixture

# --- who vouches -----------------------------------------------------------------------------


def anthropic_answerer() -> AnthropicAnswerer:
    return AnthropicAnswerer(model="m", client_factory=lambda: None)  # type: ignore[arg-type,return-value]


def test_only_the_plugins_own_backends_vouch_for_their_logs() -> None:
    class Claims:
        backend, model = "mine", "m"
        host_side_tool_log = True

    class Subclass(AnthropicAnswerer):
        async def answer(self, question: str, session: Any) -> Any:
            raise AssertionError("never called")

    assert vouches(anthropic_answerer()) and vouches(ReplayAnswerer("m"))
    assert not vouches(Claims())
    assert not vouches(Subclass(model="m", client_factory=lambda: None))  # type: ignore[arg-type,return-value]
    replaced = anthropic_answerer()
    replaced.answer = Claims  # type: ignore[method-assign,assignment]
    assert not vouches(replaced)


# --- the session an answerer of your own is handed ---------------------------------------------


class Session:
    """A target session that records what reached it."""

    name = "t"
    instructions = "Start with get_context."

    def __init__(self) -> None:
        self.calls: list[tuple[str, Any]] = []
        self._client = object()

    async def list_tools(self) -> list[ToolSpec]:
        return [ToolSpec(name="execute_query")]

    async def call(self, tool: str, arguments: dict[str, Any]) -> ToolOutcome:
        self.calls.append((tool, arguments))
        return ToolOutcome(text="[]", payload={"rows": []})

    def role_of(self, tool: str) -> Any:
        return "query" if tool == "execute_query" else None

    def query_of(self, tool: str, arguments: dict[str, Any]) -> str | None:
        return arguments.get("sql")

    def context_results(self, outcome: ToolOutcome) -> list[Any]:
        return []

    async def execute(self, query: str, call: FinalCall | None = None) -> QueryOutcome:
        self.calls.append(("execute", query))
        return (
            QueryOutcome(error="query refused: file access") if "read_" in query else QueryOutcome()
        )

    def mcp_server_config(self) -> dict[str, Any]:
        return {"type": "http", "url": "http://127.0.0.1:1/mcp"}


def test_the_logged_session_forwards_only_what_it_logs_or_describes() -> None:
    inner = Session()
    logged = HostLoggedSession(inner)
    for name in ("_session", "_client", "mcp_server_config", "calls", "profile"):
        assert not hasattr(logged, name), name
    with pytest.raises(AttributeError):
        logged.anything = 1  # type: ignore[attr-defined]
    assert logged.name == "t" and logged.instructions == "Start with get_context."
    assert logged.role_of("execute_query") == "query"

    async def use() -> None:
        await logged.call("execute_query", {"sql": "SELECT 1"})
        await logged.execute("SELECT * FROM read_text('x')")

    asyncio.run(use())
    assert [(u.tool, u.role, u.query, u.ok) for u in logged.log] == [
        ("execute_query", "query", "SELECT 1", True),
        ("execute", "query", "SELECT * FROM read_text('x')", False),
    ]
    assert logged.log[1].error == "query refused: file access"
    assert inner.calls == [
        ("execute_query", {"sql": "SELECT 1"}),
        ("execute", "SELECT * FROM read_text('x')"),
    ]


# --- reads spelled in pieces, and file patterns -----------------------------------------------


@pytest.mark.parametrize(
    ("text", "literals"),
    [
        ("read_text('ec' || 'om/cas' || 'es.jsonl')", ["ecom/cases.jsonl"]),
        ("read_text(concat('evals/', 'shop', ('/x' || '.json')))", ["evals/shop/x.json"]),
        ("SELECT 'it''s' || ' here'", ["it's here"]),
        ("SELECT \"col\" FROM t WHERE a = 'b'", ["col", "b"]),
        ("SELECT 1", []),
    ],
)
def test_concatenation_is_folded(text: str, literals: list[str]) -> None:
    assert fold_literals(text) == literals


def _refused(sql: str) -> ToolUse:
    return ToolUse(tool="execute_query", input={"sql": sql}, is_mcp=True, refused=True)


def _check(repo: Path, use: ToolUse) -> Any:  # noqa: F811 - the fixture is a parameter
    return check_contamination(
        [use], reported_calls=None, protected_paths=[repo / "evals" / "shop"], model_paths=[]
    )


def test_a_refused_read_spelled_in_pieces_is_contamination_quoting_the_path(repo: Path) -> None:  # noqa: F811
    sql = "SELECT * FROM read_text('ev' || 'als/sh' || concat('op/cas', 'es.jsonl'))"
    result = _check(repo, _refused(sql))
    assert result.contaminated is True
    assert result.reasons == [
        "a sandbox-refused read of 'evals/shop/cases.jsonl' (execute_query; protected: "
        f"{repo / 'evals' / 'shop'})"
    ]


def test_a_file_pattern_that_reaches_a_protected_path_is_contamination(repo: Path) -> None:  # noqa: F811
    pattern = f"{repo}/**"
    result = _check(repo, _refused(f"SELECT * FROM glob('{pattern}')"))
    assert result.contaminated is True
    assert result.reasons == [
        f"a sandbox-refused read of {pattern!r} (execute_query; the pattern reaches "
        f"{repo / 'evals' / 'shop'})"
    ]
    nested = f"{repo}/*/shop/*.jsonl"
    assert _check(repo, _refused(f"SELECT * FROM glob('{nested}')")).contaminated is True


@pytest.mark.parametrize(
    "sql",
    [
        "SELECT * FROM orders WHERE name GLOB 'cases*'",  # a column pattern, no directory
        "SELECT * FROM glob('/elsewhere/**')",  # reaches nothing protected
        "SELECT '*/*' AS x",  # wildcards only
    ],
)
def test_a_pattern_that_reaches_nothing_protected_is_clean(repo: Path, sql: str) -> None:  # noqa: F811
    assert _check(repo, _refused(sql)).contaminated is False
