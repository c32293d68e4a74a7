"""The pre-run golden check remembers goldens that held, and only while nothing it read changed.

Each test points the cache at its own folder and the set at its own copy of the truth tables,
so what it changes (a golden, an artifact, a table file) touches nothing another test reads.
Whether a check derived anything is seen from outside: the process-wide truth connection of the
set's data folder exists only once a query ran on it.
"""

from __future__ import annotations

import json
import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pytest_evalloop.goldens.preflight import GoldenCheck, golden_check
from pytest_evalloop.sets import cases as sets
from pytest_evalloop.targets.embedded import goldens
from pytest_evalloop.targets.embedded.data import TABLES, ensure_data
from pytest_evalloop.targets.embedded.heldcache import OFF_ENV, HeldGoldens
from tests.test_run import QIDS, _plant_drift, make_set


@pytest.fixture
def shop(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A copy of the example set over its own copy of the truth tables, with its own cache."""
    set_dir = make_set(tmp_path, QIDS)
    data = set_dir / "data"
    data.mkdir()
    for table in TABLES:
        shutil.copy(ensure_data() / f"{table}.parquet", data / f"{table}.parquet")
    meta = json.loads((set_dir / "set.json").read_text(encoding="utf-8"))
    meta["target"]["data"] = "data"
    (set_dir / "set.json").write_text(json.dumps(meta), encoding="utf-8")
    monkeypatch.setenv("EVALLOOP_CACHE_DIR", str(tmp_path / "cache"))
    yield set_dir
    goldens._truth_cache.pop((set_dir / "data").resolve(), None)


def check(set_dir: Path) -> tuple[GoldenCheck, bool]:
    """The set's golden check, and whether it opened the truth connection (ran any query)."""
    key = (set_dir / "data").resolve()
    goldens._truth_cache.pop(key, None)  # forget a connection an earlier check opened
    config = sets.load_set_config(set_dir)
    rows = [case for _, case in sets.load_cases(set_dir).rows]
    found = golden_check(set_dir, config, rows, total=len(rows))
    return found, key in goldens._truth_cache


def markers(set_dir: Path) -> list[Path]:
    return sorted((set_dir.parents[1] / "cache").glob("golden-checks/*/*"))


def test_a_held_golden_is_derived_once_until_its_golden_or_its_data_changes(shop: Path) -> None:
    ok = f"{len(QIDS)} ok, 0 drifted"
    first, derived = check(shop)
    assert first.text.startswith(ok) and derived
    assert len(markers(shop)) == len(QIDS)
    again, derived = check(shop)
    assert again.text == first.text and not derived  # every golden held before: no query ran

    # An edited golden is a new key: it alone is derived, drifts, and is never remembered.
    _plant_drift(shop, "ecom_order_count")
    for _ in range(2):
        drifted, derived = check(shop)
        assert derived and f"{len(QIDS) - 1} ok, 1 drifted" in drifted.text
        assert drifted.drifted and drifted.drifted[0].startswith("ecom_order_count: route")
    assert len(markers(shop)) == len(QIDS)

    # New table bytes are a new key for every golden: all derived again, on the new data.
    import duckdb

    orders = shop / "data" / "orders.parquet"
    fewer = shop / "orders.parquet"
    duckdb.sql(
        "COPY (SELECT * FROM read_parquet(?) WHERE order_id <> "
        "(SELECT min(order_id) FROM read_parquet(?))) TO '" + str(fewer) + "' (FORMAT parquet)",
        params=[str(orders), str(orders)],
    )
    fewer.replace(orders)
    on_new_data, derived = check(shop)
    assert derived
    assert "ecom_order_count: route canonical" in " ".join(on_new_data.drifted)
    assert on_new_data.text != drifted.text  # the goldens that held on the old data re-derived


def test_a_changed_artifact_is_derived_again(shop: Path) -> None:
    qid = "ecom_order_count"
    path = shop / sets.CASES_FILE
    rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]
    row = next(r for r in rows if r["qid"] == qid)
    artifact = shop / "gold" / f"{qid}.json"
    artifact.parent.mkdir()
    artifact.write_text(json.dumps(row["golden"].pop("value")), encoding="utf-8")
    row["golden"]["path"] = f"gold/{qid}.json"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    assert check(shop)[0].text.startswith(f"{len(QIDS)} ok")
    # The golden's JSON is unchanged; only the file it points at says something else.
    value = json.loads(artifact.read_text(encoding="utf-8"))
    figure = next(k for k in value if k not in ("round", "currency"))
    artifact.write_text(json.dumps({**value, figure: value[figure] + 1}), encoding="utf-8")
    found, derived = check(shop)
    assert derived and found.drifted and found.drifted[0].startswith(f"{qid}: route canonical")


def test_the_cache_can_be_turned_off(shop: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(OFF_ENV, "0")
    for _ in range(2):
        found, derived = check(shop)
        assert found.text.startswith(f"{len(QIDS)} ok") and derived
    assert markers(shop) == []


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(), inner, max_size=3),
    max_leaves=6,
)
golden_dicts = st.fixed_dictionaries(
    {"kind": st.sampled_from(["scalar", "table"]), "value": json_values},
    optional={"canonicalQuery": st.text(), "rubric": st.text()},
)


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(first=golden_dicts, second=golden_dicts)
def test_only_the_same_golden_is_known(
    first: dict[str, Any], second: dict[str, Any], tmp_path: Path
) -> None:
    # A folder of its own: what an earlier example remembered is not known here.
    held = HeldGoldens(tmp_path, ensure_data(), cache_dir=tmp_path / uuid.uuid4().hex)
    held.remember(first)
    assert held.known(first)
    # json.dumps with sorted keys is the comparison: equal JSON is the same golden.
    same = json.dumps(first, sort_keys=True) == json.dumps(second, sort_keys=True)
    assert held.known(second) == same
