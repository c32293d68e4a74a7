"""When the cyclic garbage collector runs while the plugin builds or churns many objects.

Imports nothing but the standard library: the collection path (no pydantic) and `evalloop
flips` (no pytest) both use it.
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator

YOUNG_THRESHOLD = 10_000
"""Allocations between young-generation collections while attempts run (Python's default: 700)."""


@contextlib.contextmanager
def gc_paused() -> Iterator[None]:
    """Pause automatic cyclic GC for the block, restoring the collector's previous state.

    For blocks that build many objects and no reference cycles (collecting items, reading a run
    builds a dict or model per event): reference counting frees all of them, and the
    collector's passes while they pile up (each walking every live object) cost more than
    building them.
    """
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


_frozen_by_sessions = 0
"""How many sessions of this process hold their collected heap frozen (`items.CollectedHeap`)."""


def session_froze() -> None:
    """A session froze its collected heap: `imports_kept` freezes beside it from now on."""
    global _frozen_by_sessions
    _frozen_by_sessions += 1


def session_unfroze() -> None:
    """A session handed its frozen heap back (`gc.unfreeze`, which takes every frozen object)."""
    global _frozen_by_sessions
    _frozen_by_sessions = max(0, _frozen_by_sessions - 1)


@contextlib.contextmanager
def imports_kept() -> Iterator[None]:
    """:func:`gc_paused` for a block that imports an SDK or builds a target, then what it built
    frozen beside the session's collected heap (`items.CollectedHeap`), when one is frozen.

    Why: the SDKs are imported once the items run, after collection froze the heap. Their
    hundreds of thousands of objects live as long as the process, yet, left in the young
    generations, every collection while attempts run walked them until they reached the old
    one, and the close's full collection walked them again (measured: about 0.3 s of a
    500-case run). Frozen, no pass looks at them. Only while a session holds its heap frozen:
    the release that hands it back at cleanup (`CollectedHeap.release`) unfreezes these with
    it. Objects a host program froze itself are no such hold: freezing beside them, nothing
    would ever hand these back.
    """
    with gc_paused():
        yield
    if _frozen_by_sessions:
        gc.freeze()


def tune_for_attempts() -> tuple[int, ...]:
    """Collect cycles less often while attempts run; return the thresholds to restore.

    Why: an attempt allocates many short-lived objects (SDK models, JSON, asyncio handles),
    so at the default threshold the collector runs every few hundred allocations and, every
    hundred of those, walks the whole heap; measured at 200 cases, ~3.5 ms of CPU per case,
    cut to under 1 ms by this. Nothing is freed later than it would be by reference counting;
    only garbage in reference cycles waits longer, and young cycles are still collected every
    ten thousand allocations.
    """
    before = gc.get_threshold()
    gc.set_threshold(max(before[0], YOUNG_THRESHOLD), max(before[1], 20), max(before[2], 100))
    return before
