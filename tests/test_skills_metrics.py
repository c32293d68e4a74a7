"""Activation metrics: confusion counts, precision/recall/F1, Wilson intervals, the tables."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from pytest_evalloop.skills.metrics import (
    Confusion,
    activation_table,
    confusions,
    f1,
    preference_order_problems,
    rate_text,
    ratio,
    wilson,
)


# Published Wilson 95% intervals (z = 1.96), e.g. Newcombe (1998) table I and the usual
# textbook examples, to four decimals.
@pytest.mark.parametrize(
    ("successes", "n", "low", "high"),
    [
        (8, 10, 0.4902, 0.9433),
        (0, 10, 0.0, 0.2775),
        (10, 10, 0.7225, 1.0),
        (50, 100, 0.4038, 0.5962),
        (81, 263, 0.2553, 0.3662),
    ],
)
def test_wilson_matches_known_intervals(successes: int, n: int, low: float, high: float) -> None:
    bounds = wilson(successes, n)
    assert bounds is not None
    assert bounds[0] == pytest.approx(low, abs=5e-5)
    assert bounds[1] == pytest.approx(high, abs=5e-5)


def test_wilson_edges() -> None:
    assert wilson(0, 0) is None
    with pytest.raises(ValueError, match="within 0..3"):
        wilson(4, 3)
    low, high = wilson(1, 2) or (0.0, 0.0)
    assert 0 < low < 0.5 < high < 1  # symmetric around one half


def test_ratio_and_f1_never_invent_a_value() -> None:
    assert ratio(0, 0) is None
    assert ratio(2, 3) == pytest.approx(2 / 3)
    assert f1(None, 1.0) is None
    assert f1(0.0, 0.0) == 0.0
    assert f1(2 / 3, 1.0) == pytest.approx(0.8)


def test_confusion_counts_errors_and_explicit_apart() -> None:
    m = Confusion()
    m.add(expected=True, activated=True)
    m.add(expected=True, activated=False)
    m.add(expected=False, activated=True)
    m.add(expected=False, activated=False)
    m.add(expected=False, activated=None)  # a crash: never a true negative
    m.add(expected=True, activated=True, explicit=True)
    assert (m.tp, m.fn, m.fp, m.tn, m.errors) == (1, 1, 1, 1, 1)
    assert (m.explicit_loaded, m.explicit_runs) == (1, 1)
    assert m.precision == 0.5 and m.recall == 0.5 and m.f1 == 0.5


def test_rate_text() -> None:
    assert rate_text(2, 3, interval=False) == "0.67"
    assert rate_text(8, 10, interval=True) == "0.80 [0.49, 0.94]"
    assert rate_text(0, 0, interval=True) == "n/a"


@dataclass
class Score:
    """The attributes of an activation_score event the tables read."""

    skill: str
    expected: bool
    activated: bool | None
    backend: str = "claude-code"
    invocation: str = "implicit"
    status: str = "passed"
    scenario: str = "s"
    question_preference: str = "provider-default"
    ambiguity: str | None = None
    asked_user: bool | None = None


def test_activation_table_per_skill_and_backend() -> None:
    scores = [
        Score("alpha", True, True),
        Score("alpha", True, True),
        Score("alpha", False, True),
        Score("beta", True, False),
        Score("beta", True, None, status="error"),
        Score("beta", True, True, backend="anthropic"),
        Score("gamma", True, True, status="skipped"),
    ]
    table = confusions(scores)
    assert set(table) == {("alpha", "claude-code"), ("beta", "claude-code"), ("beta", "anthropic")}
    lines = activation_table(scores, interval=False)
    assert lines[0].split() == [
        "SKILL", "BACKEND", "TP", "FP", "FN", "TN", "ERR", "PRECISION", "RECALL", "F1", "EXPLICIT",
    ]  # fmt: skip
    assert lines[1].split() == ["alpha", "claude-code", "2", "1", "0", "0", "0", "0.67", "1.00", "0.80", "-"]  # fmt: skip
    assert lines[2].split() == ["beta", "claude-code", "0", "0", "1", "0", "1", "n/a", "0.00", "n/a", "-"]  # fmt: skip
    assert lines[-1].split()[:7] == ["all", "3", "1", "1", "0", "1", "0.75"]
    with_ci = activation_table(scores, interval=True)
    assert "0.67 [0.21, 0.94]" in with_ci[1]


def _prefs(skill: str, rates: dict[str, list[bool]], ambiguity: str = "choice") -> list[Score]:
    return [
        Score(skill, True, True, scenario="pick", question_preference=pref, ambiguity=ambiguity, asked_user=a)
        for pref, asked in rates.items()
        for a in asked
    ]  # fmt: skip


def test_preference_ordering_under_all() -> None:
    ordered = _prefs(
        "a", {"prefer": [True, True], "provider-default": [True, False], "minimize": [False, False]}
    )
    assert preference_order_problems(ordered) == []
    flipped = _prefs(
        "b", {"prefer": [False, False], "provider-default": [True, False], "minimize": [True, True]}
    )
    problems = preference_order_problems(flipped)
    assert len(problems) == 1
    assert (
        "b/pick" in problems[0]
        and "prefer 0.00, provider-default 0.50, minimize 1.00" in problems[0]
    )
    # Only `choice` scenarios are compared, and only with all three preferences present.
    other = _prefs(
        "c",
        {"prefer": [False], "provider-default": [True], "minimize": [True]},
        "missing-information",
    )
    partial = _prefs("d", {"prefer": [False], "minimize": [True]})
    assert preference_order_problems(other + partial) == []
