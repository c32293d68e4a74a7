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
