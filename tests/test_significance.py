"""The paired tests beside the bar: McNemar (and sign-flip with samples) in the terminal
summary and `evalloop flips`, and the `bar+significant` gate with `--eval-alpha`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pytest_evalloop.measure.flips import flips_main
from pytest_evalloop.measure.gate import EXIT_GATE_REJECTED
from pytest_evalloop.testing import FakeAnthropic
from tests.test_gate import QIDS, run, script
from tests.test_run import make_set

SIX = QIDS[:6]


def _flat(text: str) -> str:
    """The text with line wrapping undone (the gate's reason is wrapped)."""
    return " ".join(text.split())


def _baseline(pytester: pytest.Pytester, fake: FakeAnthropic, shop: Path, *args: str) -> None:
    fake.policy = script(shop, set(SIX[:5])).policy()
    result = run(pytester, shop, "--eval-label=base", *args)
    assert (shop / "runs" / "base" / "run.json").is_file(), result.stdout.str()


def test_mcnemar_p_beside_the_bar_and_bar_significant_needs_p_under_alpha(
    pytester: pytest.Pytester, fake: FakeAnthropic
) -> None:
    shop = make_set(pytester.path, SIX)
    _baseline(pytester, fake, shop)
    fake.policy = script(shop, set()).policy()
    # 5 better, 0 worse: the bar accepts; exact McNemar p = 2 * (1/2)^5 = 0.0625.
    md = pytester.path / "summary.md"
    result = run(
        pytester, shop, "--baseline=base", "--eval-gate=bar+significant", f"--eval-summary-md={md}"
    )
    out = _flat(result.stdout.str())
    # Issue 25 (9): the Markdown gate line names the gate that decided.
    assert "**Gate: unresolved** (`bar+significant`): " in md.read_text(encoding="utf-8")
    assert "gate bar+significant: UNRESOLVED" in out
    assert "McNemar p = 0.0625 is not < alpha 0.05" in out
    # Issue 25 (6): it says no 5 discordant cases could ever be significant at 0.05.
    assert "fewer than 6 discordant cases all one way" in out
    assert (
        "paired test (exact McNemar, two-sided, over 5 discordant cases: 5 better, 0 worse): "
        "p = 0.0625" in out
    )
    assert "sign-flip" not in out.split("paired test")[1]  # one sample: no sign-flip line
    assert result.ret == EXIT_GATE_REJECTED
    [post_dir] = [p for p in (shop / "runs").iterdir() if p.is_dir() and p.name != "base"]
    recorded = json.loads((post_dir / "run.json").read_text(encoding="utf-8"))["pairedTests"]
    assert (recorded["mcnemarP"], recorded["better"]) == (0.0625, 5)
    # Without samples there is no sign-flip test, and run.json carries none of its fields.
    assert not {"signFlipP", "signFlipCases", "meanDifference"} & set(recorded)
    relaxed = run(
        pytester, shop, "--baseline=base", "--eval-gate=bar+significant", "--eval-alpha=0.1"
    )
    assert "gate bar+significant: ACCEPTED" in relaxed.stdout.str()
    assert "McNemar p = 0.0625 < alpha 0.1" in _flat(relaxed.stdout.str())
    assert relaxed.ret == 0
    # The bar alone accepts the same flips: nothing here overrides the bar.
    bar = run(pytester, shop, "--baseline=base", "--eval-gate=bar")
    assert "gate bar: ACCEPTED" in bar.stdout.str() and bar.ret == 0
    assert "p = 0.0625" in bar.stdout.str()


def _flips(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = flips_main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def test_samples_add_the_sign_flip_test_in_evalloop_flips(
    pytester: pytest.Pytester, fake: FakeAnthropic, capsys: pytest.CaptureFixture[str]
) -> None:
    shop = make_set(pytester.path, SIX)
    _baseline(pytester, fake, shop, "--eval-samples=2")
    fake.policy = script(shop, set()).policy()
    run(pytester, shop, "--eval-label=post", "--eval-samples=2")
    capsys.readouterr()
    code, out, err = _flips(capsys, "base", "post", "--set", str(shop))
    assert code == 0, err
    # Five cases went 0/2 -> 2/2 (difference 1), one stayed 2/2 (0): of the 2^5 sign
    # assignments of the non-zero ones only all-plus and all-minus reach |mean| 5/6: p = 2/32.
    assert (
        "paired test (sign-flip permutation over 6 cases' pass fractions, mean change +0.833; "
        "a current sample that is not a match is no pass): p = 0.0625" in _flat(out)
    )
    assert "exact McNemar" in out
    code, out, _ = _flips(capsys, "base", "post", "--set", str(shop), "--gate", "bar+significant")
    assert code == EXIT_GATE_REJECTED
    assert "flip p = 0.0625 is not < alpha 0.05" in _flat(out)  # "sign-" may end a line
    code, _, err = _flips(capsys, "base", "post", "--set", str(shop), "--alpha", "2")
    assert code == 2 and "'2' is not a level" in err


def test_bad_alpha_is_a_usage_error(pytester: pytest.Pytester) -> None:
    shop = make_set(pytester.path, SIX[:1])
    result = run(pytester, shop, "--eval-alpha=1.5", "--collect-only")
    assert "--eval-alpha=1.5 must be between 0 and 1" in result.stderr.str()
    assert result.ret != 0
