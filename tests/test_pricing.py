"""The price table: list prices, dated ids, unknown models, price files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pytest_evalloop.model_api.pricing import DEFAULT_PRICES, Price, PriceTable, Usage


@pytest.mark.parametrize(
    ("model", "input_usd", "output_usd"),
    [
        ("claude-opus-4-1", 15.0, 75.0),
        ("claude-opus-4-5", 5.0, 25.0),
        ("claude-opus-4-6", 5.0, 25.0),
        ("claude-sonnet-4-5", 3.0, 15.0),
        ("claude-sonnet-4-6", 3.0, 15.0),
        ("claude-haiku-4-5", 1.0, 5.0),
    ],
)
def test_list_prices_and_cache_multipliers(model: str, input_usd: float, output_usd: float) -> None:
    price = PriceTable().price(model)
    assert price is not None
    assert (price.input, price.output) == (input_usd, output_usd)
    assert price.cache_read == pytest.approx(input_usd * 0.1)
    assert price.cache_write == pytest.approx(input_usd * 1.25)


@pytest.mark.parametrize(
    ("model", "known"),
    [
        ("claude-haiku-4-5-20251001", "claude-haiku-4-5"),
        ("claude-opus-4-1-20250805", "claude-opus-4-1"),
        ("claude-opus-4-20250514", "claude-opus-4"),
        ("claude-sonnet-4-6-latest", "claude-sonnet-4-6"),
    ],
)
def test_dated_ids_use_the_longest_known_prefix(model: str, known: str) -> None:
    assert PriceTable().price(model) == DEFAULT_PRICES[known]


@pytest.mark.parametrize(
    "model", ["claude-opus-4-7", "claude-sonnet-5-5", "gpt-4o", "claude-haiku-4-5x", ""]
)
def test_unknown_models_have_no_price_and_no_cost(model: str) -> None:
    table = PriceTable()
    assert table.price(model) is None
    assert table.cost(model, Usage(input_tokens=1_000, output_tokens=1_000)) is None


def test_cost_adds_all_four_token_kinds() -> None:
    usage = Usage(
        input_tokens=2_000_000,
        output_tokens=100_000,
        cache_read_tokens=1_000_000,
        cache_creation_tokens=400_000,
    )
    # 2 x 3 + 0.1 x 15 + 1 x 0.3 + 0.4 x 3.75
    assert PriceTable().cost("claude-sonnet-4-6", usage) == pytest.approx(9.3)
    assert PriceTable().cost("claude-sonnet-4-6", Usage()) == 0.0


def test_extra_prices_add_and_override() -> None:
    mine = Price(input=2, output=8, cache_read=0.2, cache_write=2.5)
    table = PriceTable({"my-proxy-model": mine, "claude-haiku-4-5": mine})
    assert table.price("my-proxy-model") == mine
    assert table.price("claude-haiku-4-5-20251001") == mine
    assert table.price("claude-opus-4-6") == DEFAULT_PRICES["claude-opus-4-6"]
    assert "my-proxy-model" not in DEFAULT_PRICES


def test_price_file(tmp_path: Path) -> None:
    path = tmp_path / "prices.json"
    prices = {"input": 0.5, "output": 1.5, "cache_read": 0.05, "cache_write": 0.625}
    path.write_text(json.dumps({"local-model": prices}))
    table = PriceTable.from_file(path)
    cost = table.cost("local-model", Usage(input_tokens=1_000_000, output_tokens=1_000_000))
    assert cost == pytest.approx(2.0)
    assert table.price("claude-haiku-4-5") == DEFAULT_PRICES["claude-haiku-4-5"]


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("{not json", "cannot read it as JSON"),
        ("[1, 2]", "expected an object"),
        ('{"odd-model": {"input": 1, "output": 2}}', "model 'odd-model' needs numbers"),
        (
            '{"odd-model": {"input": 1, "output": 2, "cache_read": 0, "cache_write": "x"}}',
            "model 'odd-model'",
        ),
    ],
)
def test_bad_price_file_names_file_and_model(tmp_path: Path, content: str, message: str) -> None:
    path = tmp_path / "prices.json"
    path.write_text(content)
    with pytest.raises(ValueError, match=message) as caught:
        PriceTable.from_file(path)
    assert str(path) in str(caught.value)


def test_missing_price_file_names_it(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="nowhere.json"):
        PriceTable.from_file(tmp_path / "nowhere.json")


@pytest.mark.parametrize(
    ("content", "said"),
    [
        (
            b'{"m": {"input": 1, "output": 1, "cache_read": 1, "cache_write": 1, "context": 1'
            + b"0" * 400
            + b"}}",
            "context",
        ),
        (b"[" * 200_000 + b"]" * 200_000, "cannot read it as JSON"),
        (
            b'{"m": {"input": 1, "output": 1, "cache_read": 1, "cache_write": 1}, "\xe9": 1}',
            "cannot read it as JSON",
        ),
        (b'{"m": {"input": 2e6, "output": 1, "cache_read": 1, "cache_write": 1}}', "input = 2"),
    ],
)
def test_a_price_file_that_cannot_price_is_refused_naming_the_file(
    tmp_path: Path, content: bytes, said: str
) -> None:
    """A context window too wide for the spend ceiling's arithmetic (10**400 tokens overflowed
    it mid-run), nesting deeper than the parser goes, bytes that are not UTF-8, a price beyond
    any model's: each is a ValueError naming the file (a usage error at the session's start)."""
    path = tmp_path / "prices.json"
    path.write_bytes(content)
    with pytest.raises(ValueError, match="price file") as caught:
        PriceTable.from_file(path)
    assert str(path) in str(caught.value) and said in str(caught.value)
