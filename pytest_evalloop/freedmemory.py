"""Memory a finished eval item freed goes back to the system as the run goes, not at its end.

Why: every case's attempt allocates and frees far more than it keeps (reply bodies, the
judge's prompt, the ledger's lines), and C's allocator keeps what was freed for reuse, spread
between the few objects that stay (pytest's reports and items). Measured on the bench at
4,000 cases (`bench/README.md`, "Issue 49, fifth pass"), the controller's resident size then
grows about 4 MB more from 800 to 4,000 cases than what it holds. `malloc_trim` hands the
free pages back; it walks the heap, about 3 ms at 4,000 cases, so it runs once every
`TRIM_EVERY` eval items, which is under 0.02 ms an item.

Only where the C library has it (glibc); elsewhere (macOS, musl, Windows) this does nothing.
Only eval items count: the plugin is loaded in every pytest session of an environment that
has it, and a plain test suite's memory is not its business.
"""

from __future__ import annotations

from collections.abc import Callable

from pytest_evalloop.keptreports import is_cases_path

TRIM_EVERY = 200
"""Eval items logged between two trims."""


def _malloc_trim() -> Callable[[], object] | None:
    """The C library's `malloc_trim(0)`, or None where it has none."""
    try:
        import ctypes

        libc = ctypes.CDLL(None)
    except Exception:  # noqa: BLE001 - no ctypes, or no process-wide symbol table (Windows)
        return None
    trim = getattr(libc, "malloc_trim", None)
    if trim is None:
        return None
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int
    return lambda: trim(0)


class FreedMemory:
    """Trims the C heap every `every` eval items logged (controller and xdist workers alike:
    xdist hands a worker's `pytest_runtest_logfinish` to the controller too)."""

    def __init__(self, every: int = TRIM_EVERY, trim: Callable[[], object] | None = None) -> None:
        self.every = every
        self._trim = trim
        self._looked_up = trim is not None
        """The C library's trim is looked up at the first trim: ctypes is not imported by a
        session that never gets there."""
        self.logged = 0
        self.trims = 0

    def pytest_runtest_logfinish(self, nodeid: str, location: tuple[str, int | None, str]) -> None:
        """Count an eval item whose reports are all logged; trim every `every` (controller
        without xdist, controller and worker with it)."""
        if not is_cases_path(location[0]):
            return
        self.logged += 1
        if self.logged % self.every:
            return
        if not self._looked_up:
            self._trim, self._looked_up = _malloc_trim(), True
        if self._trim is None:
            return
        try:
            self._trim()
        except Exception:  # noqa: BLE001 - memory hygiene never fails a run: no more trims
            self._trim = None
            return
        self.trims += 1
