"""The failures every layer raises: `EvalFailure`, the domain failure an eval item raises,
shown as its own report instead of a traceback, and `HarnessError`, the harness could not
do its job.

Every kind of eval item (a case, a golden re-derivation, a judge regression) raises
`EvalFailure`, so it lives apart from any one of them: the item modules import it, never
each other. `HarnessError` is raised from the Messages API call (`model_api.endpoint`) up
to the pipeline, so it lives at the bottom of the layer order, where each of them can
import it without reaching up into the roles.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Literal


class EvalFailure(Exception):
    """A domain failure (no_match, contamination, harness error, golden drift): reported
    without traceback."""

    def __init__(self, report: str, status: str) -> None:
        super().__init__(report)
        self.report = report
        self.status = status


class HarnessError(Exception):
    """The harness could not do its job (endpoint down after retries, target dead).

    Such an attempt is a pytest error and never a `no_match`. ``refused``: the endpoint refused
    the request for what it carried, `too_long` (HTTP 400 `prompt is too long`, HTTP 413) or
    `invalid` (another HTTP 400), so its content caused the error; the pipeline tells whether
    that content was the answer's.
    """

    def __init__(
        self, message: str = "", *, refused: Literal["too_long", "invalid"] | None = None
    ) -> None:
        super().__init__(message)
        self.refused = refused


@contextlib.contextmanager
def interrupts_kept() -> Iterator[None]:
    """A Ctrl-C stays a KeyboardInterrupt inside this block.

    pydantic-core reports an exception raised while it builds a model's validator as a
    `SchemaError` naming it: a Ctrl-C that lands while a module of models is first imported
    (the golden check imports the target's models right after collection) became an
    INTERNALERROR with a traceback, instead of pytest's interrupted session.
    """
    from pydantic_core import SchemaError

    try:
        yield
    except SchemaError as exc:
        if "KeyboardInterrupt" in str(exc):
            raise KeyboardInterrupt from exc
        raise


def drop_unlocated_frames(error: BaseException) -> None:
    """Unlink the traceback entries of `error` (and of the exceptions it chains) that have no
    line number, in place (controller or worker, on Ctrl-C).

    CPython 3.11 can run the SIGINT handler at an instruction with no source location, and the
    KeyboardInterrupt raised there carries an entry whose `tb_lineno` is None; pytest's own
    interrupt report then fails on it (`None - 1`) and the run ends in a second traceback with
    exit 1 instead of its interrupted status. An entry without a line shows nothing anyway.
    """
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        head = current.__traceback__
        while head is not None and head.tb_lineno is None:
            head = head.tb_next
        current.__traceback__ = head
        while head is not None and head.tb_next is not None:
            if head.tb_next.tb_lineno is None:
                head.tb_next = head.tb_next.tb_next
            else:
                head = head.tb_next
        current = current.__cause__ or current.__context__
