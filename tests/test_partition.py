"""`--eval-shard=I/N`: which shard holds a case, what the option accepts, what collection keeps."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pytest_evalloop.sets.partition import RUN_GROUP_ENV, Shard, parse_shard, run_group, shard_of
from tests.conftest import EXAMPLE_SET

# Pinned: these are what every machine, Python version and CI job must compute. A change here
# re-deals every sharded run in flight, so it is a breaking change of the partition rule.
PINNED = {
    "ecom_order_count": (2, 3, 2),
    "ecom_sales_2022": (1, 2, 5),
    "ecom_open_orders": (2, 2, 2),
    "ecom_products_never_sold": (1, 2, 5),
    "q1": (1, 2, 3),
    "ünïcode-qid": (1, 2, 7),
}


@pytest.mark.parametrize("qid", list(PINNED))
def test_the_shard_of_a_qid_is_pinned_for_2_3_and_8(qid: str) -> None:
    assert tuple(shard_of(qid, n) for n in (2, 3, 8)) == PINNED[qid]


@given(st.text(min_size=1, max_size=40), st.integers(min_value=1, max_value=64))
def test_every_qid_is_in_exactly_one_shard(qid: str, count: int) -> None:
    holders = [i for i in range(1, count + 1) if Shard(i, count).holds(qid)]
    assert holders == [shard_of(qid, count)]


@pytest.mark.parametrize(
    ("spec", "env", "expected"),
    [
        ("2/3", {}, Shard(2, 3)),
        (" 1 / 1 ", {}, Shard(1, 1)),
        ("JOB_COMPLETION_INDEX+1/8", {"JOB_COMPLETION_INDEX": "7"}, Shard(8, 8)),
        ("SHARD/4", {"SHARD": "3"}, Shard(3, 4)),
    ],
)
def test_a_shard_spec_reads_an_index_or_a_variable(
    spec: str, env: dict[str, str], expected: Shard
) -> None:
    assert parse_shard(spec, env) == expected


@pytest.mark.parametrize(
    ("spec", "env", "said"),
    [
        ("0/3", {}, "numbered 1..N"),
        ("4/3", {}, "shard 4 of 3"),
        ("JOB_COMPLETION_INDEX/3", {"JOB_COMPLETION_INDEX": "0"}, "needs +1"),
        ("2", {}, "is not I/N"),
        ("NOPE+1/3", {}, "NOPE is not set"),
        ("IDX/3", {"IDX": "two"}, "not a whole number"),
    ],
)
def test_a_bad_shard_spec_says_what_to_give(spec: str, env: dict[str, str], said: str) -> None:
    with pytest.raises(ValueError, match=re.escape(said)):
        parse_shard(spec, env)


def test_the_run_group_is_given_or_the_ci_run_id() -> None:
    assert run_group("nightly-7", {"GITHUB_RUN_ID": "9"}) == "nightly-7"
    assert run_group(None, {"GITHUB_RUN_ID": "9", "GITHUB_RUN_ATTEMPT": "2"}) == "github-9"
    assert run_group(None, {"CI_PIPELINE_ID": "41"}) == "gitlab-41"
    assert run_group(None, {}) is None


def _collected(pytester: pytest.Pytester, *args: str) -> list[str]:
    result = pytester.runpytest_subprocess(
        str(EXAMPLE_SET), "--collect-only", "-q", "-p", "no:cacheprovider", *args
    )
    assert result.ret == 0, result.stdout.str()
    return [line.split("::", 1)[1] for line in result.outlines if "cases.jsonl::" in line]


def test_three_shards_collect_every_case_once_whatever_the_order(
    pytester: pytest.Pytester, tmp_path: Path
) -> None:
    whole = _collected(pytester)
    parts = [_collected(pytester, f"--eval-shard={i}/3", "--eval-run-group=g") for i in (1, 2, 3)]
    assert sorted(q for part in parts for q in part) == sorted(whole)
    for index, part in enumerate(parts, start=1):
        assert part and all(shard_of(q, 3) == index for q in part)
    # -k narrows a shard; it never moves a case to another one.
    narrowed = _collected(pytester, "--eval-shard=2/3", "--eval-run-group=g", "-k", "holdout")
    assert narrowed and set(narrowed) <= set(parts[1])
    # The same shard of the same set with its rows in reverse order: the same cases.
    reversed_set = tmp_path / "evals" / "ecommerce"
    reversed_set.mkdir(parents=True)
    for name in ("set.json", "model.json"):
        (reversed_set / name).write_bytes((EXAMPLE_SET / name).read_bytes())
    lines = (EXAMPLE_SET / "cases.jsonl").read_text(encoding="utf-8").splitlines()
    (reversed_set / "cases.jsonl").write_text("\n".join(reversed(lines)) + "\n", encoding="utf-8")
    again = pytester.runpytest_subprocess(
        str(reversed_set), "--collect-only", "-q", "--eval-shard=2/3", "--eval-run-group=g"
    )
    got = [line.split("::", 1)[1] for line in again.outlines if "cases.jsonl::" in line]
    assert sorted(got) == sorted(parts[1])


def test_every_sample_of_a_case_is_in_its_shard(pytester: pytest.Pytester) -> None:
    got = _collected(pytester, "--eval-shard=1/3", "--eval-run-group=g", "--eval-samples=3")
    qids = {q.split("[", 1)[0] for q in got}
    assert len(got) == 3 * len(qids)


def test_a_shard_without_a_run_group_is_a_usage_error(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name, _ in RUN_GROUP_ENV:  # CI sets some of these for the suite itself
        monkeypatch.delenv(name, raising=False)
    result = pytester.runpytest_subprocess(
        str(EXAMPLE_SET), "--collect-only", "--eval-shard=1/3", "-p", "no:cacheprovider"
    )
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert "no run group; pass --eval-run-group" in result.stderr.str()


def test_the_example_set_has_cases_in_every_shard_of_three() -> None:
    rows = [json.loads(line) for line in (EXAMPLE_SET / "cases.jsonl").open(encoding="utf-8")]
    assert {shard_of(r["qid"], 3) for r in rows} == {1, 2, 3}
