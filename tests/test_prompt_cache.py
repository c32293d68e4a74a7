"""The fake's prompt cache follows the API's rules (issue 31 point 1), and the answerer's
breakpoints make a conversation read its earlier turns from it (point 2)."""

from __future__ import annotations

import json
from typing import Any

import anthropic
import pytest

from pytest_evalloop.model_api.caching import (
    LOOKBACK_BLOCKS,
    UNKNOWN_FLOOR,
    cache_note,
    conversation_request,
    min_cacheable_tokens,
)
from pytest_evalloop.testing import FakeAnthropic
from pytest_evalloop.testing.messages_api import count_tokens

SONNET_45 = "claude-sonnet-4-5"  # floor 1,024 tokens
OPUS_46 = "claude-opus-4-6"  # floor 4,096 tokens
EPHEMERAL = {"type": "ephemeral"}


class Clock:
    """The cache's clock, moved by the test: a TTL is never waited for."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def system_of(tokens: int, **mark: Any) -> list[dict[str, Any]]:
    """One marked system block of about `tokens` tokens (the fake counts 4 chars a token)."""
    return [{"type": "text", "text": "d" * (tokens * 4 - 40), "cache_control": EPHEMERAL | mark}]


def ask(fake: FakeAnthropic, model: str, system: Any, messages: Any = None, **kw: Any) -> Any:
    api = anthropic.Anthropic(base_url=fake.base_url, api_key="k", max_retries=0)
    try:
        return api.messages.create(
            model=model,
            max_tokens=50,
            system=system,
            messages=messages or [{"role": "user", "content": "How many orders?"}],
            **kw,
        ).usage
    finally:
        api.close()


def test_the_floor_table_knows_dated_ids_and_unknown_models_take_the_highest() -> None:
    assert min_cacheable_tokens(SONNET_45) == 1024
    assert min_cacheable_tokens("claude-sonnet-4-6-20260101") == 2048
    assert min_cacheable_tokens(OPUS_46) == 4096
    assert min_cacheable_tokens("claude-someday-9") == UNKNOWN_FLOOR == 4096


def test_a_prefix_under_the_floor_is_not_cached_and_is_reported() -> None:
    with FakeAnthropic() as fake:
        # ~2,000 tokens: over Sonnet 4.5's floor, under Opus 4.6's.
        system = system_of(2000)
        sonnet = [ask(fake, SONNET_45, system) for _ in range(2)]
        opus = [ask(fake, OPUS_46, system) for _ in range(2)]
    assert sonnet[0].cache_creation_input_tokens >= 1990 and sonnet[0].cache_read_input_tokens == 0
    assert sonnet[1].cache_read_input_tokens == sonnet[0].cache_creation_input_tokens
    assert sonnet[1].input_tokens < 30  # only the question and the framing are billed in full
    # Under the floor: billed in full both times, and only two zero counters say so.
    for usage in opus:
        assert (usage.cache_creation_input_tokens, usage.cache_read_input_tokens) == (0, 0)
        assert usage.input_tokens >= 2000
    note = cache_note("judge", OPUS_46, calls=2, read=0, written=0)
    assert note is not None and "4,096 tokens for claude-opus-4-6" in note
    assert (
        cache_note("judge", SONNET_45, calls=2, read=sonnet[1].cache_read_input_tokens, written=0)
        is None
    )


def test_an_entry_lives_five_minutes_from_its_last_use_or_an_hour_when_asked() -> None:
    clock = Clock()
    with FakeAnthropic(cache_clock=clock) as fake:
        short, long_ = system_of(1500), system_of(1600, ttl="1h")
        assert ask(fake, SONNET_45, short).cache_creation_input_tokens > 0
        written = ask(fake, SONNET_45, long_).cache_creation
        assert written is not None and written.ephemeral_1h_input_tokens > 0
        clock.now += 299
        assert ask(fake, SONNET_45, short).cache_read_input_tokens > 0  # the hit refreshes it
        clock.now += 299
        assert ask(fake, SONNET_45, short).cache_read_input_tokens > 0  # 598 s after the write
        clock.now += 301
        expired = ask(fake, SONNET_45, short)
        assert expired.cache_read_input_tokens == 0 and expired.cache_creation_input_tokens > 0
        # The hour-long entry, last used 899 s ago, is still there.
        assert ask(fake, SONNET_45, long_).cache_read_input_tokens > 0


def _history(results: int) -> list[dict[str, Any]]:
    """A tool-use conversation: the question, then `results` rounds of one call and a 3 KB
    result each, ending in a user turn."""
    messages: list[dict[str, Any]] = [{"role": "user", "content": "How many orders?"}]
    for i in range(results):
        use = {"type": "tool_use", "id": f"toolu_{i:04d}", "name": "q", "input": {"n": i}}
        messages.append({"role": "assistant", "content": [use]})
        result = {"type": "tool_result", "tool_use_id": use["id"], "content": f"{i}" * 3000}
        messages.append({"role": "user", "content": [result]})
    return messages


TOOLS = [{"name": "q", "description": "run", "input_schema": {"type": "object"}}]


def test_a_read_looks_back_at_most_twenty_blocks_from_a_breakpoint() -> None:
    with FakeAnthropic() as fake:
        base = _history(1)
        first = conversation_request(base)
        ask(fake, SONNET_45, system_of(500), first, tools=TOOLS)
        # Eleven more rounds add 22 blocks; only the new end is marked: the old entry is 22
        # blocks back, out of the look-back's reach.
        far = _history(12)
        only_end = [dict(m) for m in far]
        only_end[-1] = {
            **far[-1],
            "content": [{**far[-1]["content"][0], "cache_control": EPHEMERAL}],
        }
        missed = ask(fake, SONNET_45, system_of(500), only_end, tools=TOOLS)
        assert missed.cache_read_input_tokens == 0
        # Nine rounds (18 blocks) are within it: the same single breakpoint reads the entry.
        fake.cache.clear()
        ask(fake, SONNET_45, system_of(500), first, tools=TOOLS)
        near = _history(10)
        near[-1] = {**near[-1], "content": [{**near[-1]["content"][0], "cache_control": EPHEMERAL}]}
        hit = ask(fake, SONNET_45, system_of(500), near, tools=TOOLS)
        assert hit.cache_read_input_tokens > 0
    assert LOOKBACK_BLOCKS == 20


def test_more_than_four_breakpoints_is_the_apis_400() -> None:
    with FakeAnthropic() as fake:
        system = [
            {"type": "text", "text": f"part {i}", "cache_control": EPHEMERAL} for i in range(5)
        ]
        with pytest.raises(
            anthropic.BadRequestError, match="A maximum of 4 blocks with cache_control"
        ):
            ask(fake, SONNET_45, system)


def test_the_moving_breakpoints_make_turn_n_read_turns_one_to_n_minus_one() -> None:
    with FakeAnthropic() as fake:
        shares: list[float] = []
        reads: list[int] = []
        cached: list[int] = []
        for turn in range(1, 7):
            body = conversation_request(_history(turn))
            usage = ask(fake, SONNET_45, system_of(500), body, tools=TOOLS)
            total = (
                usage.input_tokens
                + usage.cache_read_input_tokens
                + usage.cache_creation_input_tokens
            )
            shares.append(usage.cache_read_input_tokens / total)
            reads.append(usage.cache_read_input_tokens)
            cached.append(usage.cache_read_input_tokens + usage.cache_creation_input_tokens)
        # A turn of 12 parallel calls adds 24 blocks, past the look-back of the end's mark: the
        # mark on the previous request's end still reads all of it.
        before = _history(6)
        uses = [
            {"type": "tool_use", "id": f"toolu_w{i:03d}", "name": "q", "input": {}}
            for i in range(12)
        ]
        results = [{"type": "tool_result", "tool_use_id": u["id"], "content": "x"} for u in uses]
        wide = [
            *before,
            {"role": "assistant", "content": uses},
            {"role": "user", "content": results},
        ]
        last = ask(fake, SONNET_45, system_of(500), conversation_request(wide), tools=TOOLS)
    assert shares[0] == 0  # turn 1 writes
    # Turn N reads everything turn N-1 had cached, and caches its own new round on top.
    assert reads[1:] == cached[:-1]
    assert shares == sorted(shares) and shares[-1] > 0.8, shares
    assert last.cache_read_input_tokens == cached[-1]


def test_streaming_reports_the_cache_counters_as_the_api_does() -> None:
    with FakeAnthropic() as fake:
        api = anthropic.Anthropic(base_url=fake.base_url, api_key="k", max_retries=0)
        kwargs: dict[str, Any] = {
            "model": SONNET_45,
            "max_tokens": 50,
            "system": system_of(1500),
            "messages": [{"role": "user", "content": "q"}],
        }
        api.messages.create(**kwargs)
        with api.messages.stream(**kwargs) as stream:
            final = stream.get_final_message()
        api.close()
    assert final.usage.cache_read_input_tokens >= 1400
    assert final.usage.cache_creation_input_tokens == 0
    assert count_tokens("abcd") == 1


def test_a_run_whose_cache_cannot_form_says_so_and_reports_its_cost_figures(
    pytester: pytest.Pytester, fake: FakeAnthropic
) -> None:
    from tests.test_gate import QIDS, run, script
    from tests.test_run import make_set

    shop = make_set(pytester.path, QIDS[:2])
    fake.policy = script(shop, set()).policy()
    # Opus 4.6's floor is 4,096 tokens: the answerer's whole conversation stays under it.
    summary_md = pytester.path / "summary.md"
    done = run(
        pytester,
        shop,
        "--eval-label=opus",
        f"--eval-answerer-model={OPUS_46}",
        f"--eval-summary-md={summary_md}",
    )
    assert done.ret == 0, done.stdout.str()
    out = done.stdout.str()
    assert (
        "cache cannot form for the answerer: no marked prefix reached 4,096 tokens for "
        "claude-opus-4-6" in out
    ), out
    assert out.count("cache cannot form") == 1  # the judge's doctrine is over it and is read
    info = json.loads((shop / "runs" / "opus" / "run.json").read_text())
    answerer, judge = info["costFigures"]["answerer"], info["costFigures"]["judge"]
    assert answerer["cacheReadShare"] == 0
    assert answerer["uncachedCostUsd"] == pytest.approx(info["answererCostUsd"], rel=1e-3)
    assert 0 < judge["cacheReadShare"] < 1
    assert judge["uncachedCostUsd"] > judge["costPerCaseUsd"] * 2 > 0
    assert "judge cost: " in out and "of input tokens read from the cache" in out
    # The same lines in the Markdown summary and the report.
    markdown = summary_md.read_text()
    assert "- cache cannot form for the answerer: no marked prefix reached 4,096" in markdown
    assert "- judge cost: " in markdown
    page = (shop / "runs" / "opus" / "report.html").read_text()
    assert "cache cannot form for the answerer" in page and "judge cost: " in page


def _judge_samples(samples: int, verdicts: list[str]) -> tuple[list[Any], list[dict[str, Any]]]:
    """`samples` judge calls of one attempt through the default judge, as the pipeline makes
    them, against the fake's cache (Opus 4.6: floor 4,096); the outcomes and request bodies."""
    import asyncio

    from pytest_evalloop.answer.backends import AnthropicJudge
    from pytest_evalloop.judge.judge import JudgeMaterials
    from pytest_evalloop.model_api.pricing import PriceTable
    from pytest_evalloop.testing import FakeRequest, Reply

    bodies: list[dict[str, Any]] = []
    script = iter(verdicts)

    def policy(request: FakeRequest) -> Reply:
        bodies.append(request.body)
        said = {"verdict": next(script), "confidence": 9, "why": "compared"}
        return Reply(text=json.dumps(said))

    materials = JudgeMaterials(
        qid="q1",
        question="What were total sales in 2022?",
        golden_kind="scalar",
        golden_value=4744743.45,
        answer_text="Total sales were 4,744,743.45.",
        final_query="SELECT sum(sale_price) FROM order_items",
        prediction_rows=[{"total_sales": 4744743.45}],
        prediction_columns=["total_sales"],
    )

    async def go(fake: FakeAnthropic) -> list[Any]:
        judge = AnthropicJudge(
            model=OPUS_46,
            client_factory=lambda: anthropic.AsyncAnthropic(
                base_url=fake.base_url, api_key="k", max_retries=0
            ),
            prices=PriceTable(),
            samples=samples,
        )
        # Rebuilt per sample as the pipeline does: equal materials, one attempt.
        return [await judge.judge(materials.model_copy()) for _ in range(samples)]

    with FakeAnthropic(policy) as fake:
        outcomes = asyncio.run(go(fake))
    return outcomes, bodies


def test_judge_samples_of_one_attempt_read_its_case_prompt_from_the_cache() -> None:
    verdicts = ["match", "no_match", "match"]
    sampled, bodies = _judge_samples(3, verdicts)
    # Every sample sends the same prompt, its case part marked (the doctrine's mark besides).
    assert len({json.dumps(b["messages"], sort_keys=True) for b in bodies}) == 1
    definitions, case = bodies[0]["messages"][0]["content"]
    assert case["cache_control"] == EPHEMERAL and "cache_control" not in definitions
    first, *rest = sampled
    assert first.cache_read_tokens == 0 and first.cache_creation_tokens > 4096
    for later in rest:
        # Samples 2..k read the doctrine and the whole case prompt sample 1 wrote.
        assert later.cache_read_tokens == first.cache_creation_tokens
        assert later.cache_creation_tokens == 0
        assert later.input_tokens == first.input_tokens  # the request's framing alone
    # One sample: the case prompt is left unmarked (nothing would read it), the doctrine alone
    # is cached; the verdicts are the scripted judge's either way.
    (single,), single_bodies = _judge_samples(1, verdicts[:1])
    assert all("cache_control" not in b for b in single_bodies[0]["messages"][0]["content"])
    assert single.cache_creation_tokens < first.cache_creation_tokens
    assert [o.verdict for o in sampled] == verdicts and single.verdict == verdicts[0]


def test_the_model_definitions_are_a_prefix_every_case_reads() -> None:
    """The definitions (the same for every case of a set) sit after the doctrine and before
    the case: a second case reads both from the cache, its own case part aside."""
    import asyncio

    from pytest_evalloop.answer.backends import AnthropicJudge
    from pytest_evalloop.judge.judge import JudgeMaterials, render_doctrine
    from pytest_evalloop.model_api.pricing import PriceTable
    from pytest_evalloop.testing import Reply

    definitions = "source: order_items is duckdb.table('order_items.parquet') extend {\n" * 200

    def case(qid: str, question: str, shared: bool) -> JudgeMaterials:
        return JudgeMaterials(
            qid=qid,
            question=question,
            golden_kind="scalar",
            golden_value=1,
            answer_text="one",
            model_definitions=definitions,
            definitions_shared=shared,
        )

    async def go(fake: FakeAnthropic, shared: bool) -> list[Any]:
        judge = AnthropicJudge(
            model=OPUS_46,
            client_factory=lambda: anthropic.AsyncAnthropic(
                base_url=fake.base_url, api_key="k", max_retries=0
            ),
            prices=PriceTable(),
        )
        return [
            await judge.judge(case("q1", "How many orders?", shared)),
            await judge.judge(case("q2", "How many users?", shared)),
        ]

    verdict = json.dumps({"verdict": "match", "confidence": 9, "why": "same"})
    with FakeAnthropic(lambda request: Reply(text=verdict)) as fake:
        first, second = asyncio.run(go(fake, True))
        fake.cache.clear()
        alone = asyncio.run(go(fake, False))
    doctrine = count_tokens(json.dumps({"text": render_doctrine(), "type": "text"}))
    assert count_tokens(definitions) > 3000
    # The first case wrote doctrine and definitions; the second reads exactly that.
    assert first.cache_read_tokens == 0
    assert second.cache_read_tokens == first.cache_creation_tokens > doctrine + 3000
    assert second.cache_creation_tokens == 0
    # Definitions not marked shared (the embedded target's, a case's own) are not cached.
    assert [o.cache_read_tokens for o in alone] == [0, doctrine]
    assert [o.verdict for o in (first, second, *alone)] == ["match"] * 4
