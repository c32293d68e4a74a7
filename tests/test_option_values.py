"""A numeric option given a value that is not a number: the usage error names the flag, the
value, and an example that is itself a valid value of that option (an option off by default
showed `--eval-max-cost=None`, which is refused the same way)."""

from __future__ import annotations

import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pytest_evalloop.options import OPTIONS, Opt, _convert

NUMERIC = [opt for opt in OPTIONS if opt.kind in (int, float)]


def _not_a_number(kind: type, text: str) -> bool:
    try:
        kind(text)
    except (TypeError, ValueError):
        return True
    return False


@given(opt=st.sampled_from(NUMERIC), value=st.text(max_size=12))
def test_the_example_a_refusal_gives_is_a_value_the_option_takes(opt: Opt, value: str) -> None:
    if not _not_a_number(opt.kind, value):
        return
    with pytest.raises(pytest.UsageError) as refused:
        _convert(opt, value)
    message = str(refused.value)
    assert message.startswith(f"{opt.flag}={value!r} is not a valid {opt.kind.__name__}")
    example = re.search(rf"give e\.g\. {re.escape(opt.flag)}=(\S+)$", message)
    assert example is not None, message
    assert _convert(opt, example.group(1)) == opt.kind(example.group(1))


@pytest.mark.parametrize("value", ["nan", "inf"])
@pytest.mark.parametrize(
    "flag", ["--eval-attempt-timeout", "--eval-request-timeout", "--eval-judge-timeout"]
)
def test_a_limit_that_is_no_number_is_refused(
    pytester: pytest.Pytester, flag: str, value: str
) -> None:
    # `nan` passed the "at least" check (no comparison with it is true): every attempt was
    # then recorded as not submitted, with no call made, and run.json kept the limit as null.
    pytester.makepyfile(test_plain="def test_one():\n    pass\n")
    result = pytester.runpytest_subprocess(f"{flag}={value}", "-p", "no:cacheprovider")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"ERROR: {flag}={value} must be a finite number, at least *"])


# --- how a stop flag is recorded: the spelling pytest read last ------------------------------


class _Config:
    """What `narrowing_flags` reads of a pytest config."""

    def __init__(self, maxfail: int, args: list[str], ini: list[str]) -> None:
        from types import SimpleNamespace

        self.option = SimpleNamespace(
            lf=False,
            failedfirst=False,
            stepwise=False,
            stepwise_skip=False,
            deselect=None,
            maxfail=maxfail,
        )
        self.invocation_params = SimpleNamespace(args=tuple(args))
        self._ini = ini

    def getini(self, name: str) -> list[str]:
        assert name == "addopts"
        return self._ini


@pytest.mark.parametrize(
    ("maxfail", "args", "ini", "env", "recorded"),
    [
        (1, ["-x"], [], "", "-x"),
        (1, ["-xvs"], [], "", "-x"),
        (1, ["--exitfirst"], [], "", "-x"),
        (1, ["--maxfail=1"], [], "", "--maxfail=1"),
        (1, ["--maxfail", "1"], [], "", "--maxfail=1"),
        (1, ["--maxfail=3", "-x"], [], "", "-x"),  # -x came last and won: never --maxfail=1
        (1, ["-x", "--maxfail=1"], [], "", "--maxfail=1"),
        (1, [], [], "--maxfail=1", "--maxfail=1"),  # PYTEST_ADDOPTS
        (1, [], ["--maxfail=1"], "", "--maxfail=1"),  # the ini file's addopts
        (1, ["-rx", "-kx"], ["-x"], "", "-x"),  # -rx and -kx are values, not -x
        (3, ["--maxfail=3"], [], "", "--maxfail=3"),
    ],
)
def test_a_stop_flag_is_recorded_as_pytest_read_it_last(
    monkeypatch: pytest.MonkeyPatch,
    maxfail: int,
    args: list[str],
    ini: list[str],
    env: str,
    recorded: str,
) -> None:
    from pytest_evalloop.options import narrowing_flags

    monkeypatch.setenv("PYTEST_ADDOPTS", env)
    assert narrowing_flags(_Config(maxfail, args, ini)) == (recorded,)  # type: ignore[arg-type]


def test_a_stop_with_no_flag_behind_it_names_no_flag() -> None:
    from types import SimpleNamespace

    from pytest_evalloop.options import gate_settings
    from pytest_evalloop.summary import _closing

    crashed = "the worker running x crashed and no worker ran it again"
    session = SimpleNamespace(shouldfail=False, shouldstop=False)
    closing = _closing(session, gate_settings(), 2, crashed)  # type: ignore[arg-type]
    assert closing.stopped == crashed
    stopped = SimpleNamespace(shouldfail="stopping after 1 failures", shouldstop=False)
    closing = _closing(stopped, gate_settings(), 1)  # type: ignore[arg-type]
    assert closing.stopped == "stopping after 1 failures"
