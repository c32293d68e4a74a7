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
