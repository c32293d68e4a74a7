"""Activation metrics: confusion counts, precision/recall/F1, Wilson intervals, the tables."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest

from pytest_evalloop.skills import scenarios
from pytest_evalloop.skills.metrics import (
    Confusion,
    activation_problems,
    activation_table,
    f1,
    figures,
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


def test_rate_text_shows_its_numerator_and_denominator() -> None:
    assert rate_text(2, 3, interval=False) == "0.67 (2/3)"
    assert rate_text(8, 10, interval=True) == "0.80 (8/10) [0.49, 0.94]"
    assert rate_text(0, 0, interval=True) == "n/a (0/0)"


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
    other_activations: tuple[str, ...] = ()


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
    table = figures(scores)
    assert list(table) == [
        ("alpha", "claude-code"), ("beta", "claude-code"), ("beta", "anthropic"),
        ("alpha", "anthropic"),
    ]  # fmt: skip
    lines = activation_table(scores, interval=False)
    assert lines[0].split() == [
        "SKILL", "BACKEND", "TP", "FP", "FN", "TN", "ERR", "PRECISION", "RECALL", "F1", "EXPLICIT",
    ]  # fmt: skip
    # alpha's three runs are beta's too (it stayed quiet there: three true negatives), and
    # beta's scored run is alpha's (a true negative); beta's errored run is only beta's error.
    assert lines[1].split() == ["alpha", "claude-code", "2", "1", "0", "1", "0", "0.67", "(2/3)", "1.00", "(2/2)", "0.80", "(4/5)", "-"]  # fmt: skip
    assert lines[2].split() == ["beta", "claude-code", "0", "0", "1", "3", "1", "n/a", "(0/0)", "0.00", "(0/1)", "0.00", "(0/1)", "-"]  # fmt: skip
    assert lines[4].split() == ["alpha", "anthropic", "0", "0", "0", "1", "0", "n/a", "(0/0)", "n/a", "(0/0)", "n/a", "-"]  # fmt: skip
    assert lines[-1].split()[:7] == ["all", "3", "1", "1", "5", "1", "0.75"]
    with_ci = activation_table(scores, interval=True)
    assert "0.67 (2/3) [0.21, 0.94]" in with_ci[1]


# The example catalog's shape: three skills of five scenarios, three positives and two
# negatives each, every negative naming one of the other two as its neighbour.
CATALOG = {
    "shop": ["p1", "p2", "p3", ("n1", "cases"), ("n2", "triage")],
    "cases": ["p1", "p2", "p3", ("n1", "shop"), ("n2", "triage")],
    "triage": ["p1", "p2", "p3", ("n1", "shop"), ("n2", "cases")],
}
# What `scenarios.neighbors` reads from such a catalog: (skill, negative) -> its neighbour.
NEIGHBORS = {
    (skill, s[0]): s[1] for skill, names in CATALOG.items() for s in names if isinstance(s, tuple)
}


def _catalog_runs(always: str | None, *, neighbours: bool = True) -> list[Score]:
    """Every scenario once: `always` fires on every prompt; the others fire exactly on their
    positives and where a negative names them as the neighbour."""
    scores = []
    for skill, names in CATALOG.items():
        for scenario in names:
            name, neighbor = scenario if isinstance(scenario, tuple) else (scenario, None)
            neighbor = neighbor if neighbours else None
            positive = neighbor is None and name.startswith("p")
            fired = {always, neighbor} - {None}
            others = tuple(sorted(fired - {skill}))
            activated = positive or skill == always
            scores.append(Score(skill, positive, activated, scenario=name,
                                other_activations=others))  # fmt: skip
    return scores


def test_precision_counts_activations_in_other_skills_scenarios() -> None:
    # The repro: a skill that fires on every prompt fired in all 15 scenarios; its own
    # two negatives alone gave PRECISION 0.60 (3/5). Without neighbours every other scenario
    # is a negative for it: 3/15.
    plain = figures(_catalog_runs("shop", neighbours=False), CATALOG)
    shop = plain[("shop", "claude-code")]
    assert (shop.tp, shop.fp, shop.fn, shop.tn, shop.fp_elsewhere) == (3, 12, 0, 0, 10)
    assert rate_text(shop.tp, shop.tp + shop.fp, interval=False) == "0.20 (3/15)"
    # With the catalog's neighbours, two of the other negatives name it as the skill that
    # should fire instead: there firing is right (true positives), so 5/15.
    named = figures(_catalog_runs("shop"), CATALOG, NEIGHBORS)
    shop = named[("shop", "claude-code")]
    assert (shop.tp, shop.fp, shop.fn, shop.fp_elsewhere) == (5, 10, 0, 8)
    cases = named[("cases", "claude-code")]
    assert (cases.tp, cases.fp, cases.fn, cases.tn) == (5, 0, 0, 10)


def test_the_gate_reads_the_figures_the_table_prints() -> None:
    scores = _catalog_runs("shop")
    lines = activation_table(scores, interval=False, catalog=CATALOG, neighbors=NEIGHBORS)
    assert lines[1].split() == ["shop", "claude-code", "5", "10", "0", "0", "0", "0.33", "(5/15)", "1.00", "(5/5)", "0.50", "(10/20)", "-"]  # fmt: skip
    assert activation_problems(scores, CATALOG, NEIGHBORS) == [
        "activation: shop (claude-code) precision 0.33 (5/15), recall 1.00 (5/5): fired in 10 "
        "run(s) where it should not (8 of them other skills' scenarios)"
    ]
    # A neighbour that stays quiet where a negative names it is a miss of its own.
    quiet = [
        Score(s.skill, s.expected, s.activated, scenario=s.scenario,
              other_activations=tuple(o for o in s.other_activations if o != "triage"))
        for s in _catalog_runs(None)
    ]  # fmt: skip
    assert activation_problems(quiet, CATALOG, NEIGHBORS) == [
        "activation: triage (claude-code) precision 1.00 (3/3), recall 0.60 (3/5): missed 2 "
        "run(s) where it should fire (2 of them negatives naming it as the neighbour)"
    ]
    assert activation_problems(_catalog_runs(None), CATALOG, NEIGHBORS) == []


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


def test_a_neighbour_outside_the_catalog_is_no_one_s_miss() -> None:
    # A typo in `neighbor` (the lint warns about it) must not invent a skill that missed.
    scores = [Score("alpha", False, False), Score("beta", True, True)]
    typo = {("alpha", "s"): "alpah"}
    table = figures(scores, ["alpha", "beta"], typo)
    assert set(table) == {("alpha", "claude-code"), ("beta", "claude-code")}
    assert activation_problems(scores, ["alpha", "beta"], typo) == []


def test_neighbors_are_read_from_the_catalog_s_negatives(tmp_path: Path) -> None:
    from tests.test_skills_lint import write_skill

    write_skill(tmp_path, "alpha")
    negative = tmp_path / "alpha" / "evals" / "negative.yaml"
    negative.write_text(negative.read_text() + "neighbor: beta\n")
    (tmp_path / "alpha" / "evals" / "broken.yaml").write_text("- not a mapping\n")
    assert scenarios.neighbors(tmp_path) == {("alpha", "negative"): "beta"}
