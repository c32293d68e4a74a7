"""What a sharded run is, in words.

:func:`shard_note` is the one sentence every view of a run prints about its shards (the
terminal summary, report.html, the Markdown summary, the runs index), under the title
:data:`SHARDS_TITLE`, so the three say the same. Why no gate decides on one shard alone (a
hash-chosen subset the bar was not set for) is the comparability rule's (`comparable`).
"""

from __future__ import annotations

from typing import Any

SHARDS_TITLE = "shards"
"""The title of the shards line in every view: `shards: <shard_note>`."""


def shard_note(info: Any) -> str | None:
    """What a sharded run is (a run.json's RunInfo), in words: one shard, or a merge of shards
    with the ones missing named (None: neither)."""
    shards = getattr(info, "shards", None)
    if shards:
        merged = getattr(info, "merged", None) or {}
        names = ", ".join(f"{s.get('index')}: {s.get('runId')}" for s in shards)
        missing = merged.get("missing") or []
        gap = f"; missing {', '.join(map(str, missing))}" if missing else ""
        return (
            f"merged {len(shards)} of {merged.get('count')} shards of run group "
            f"{getattr(info, 'run_group', None)} ({names}){gap}"
        )
    shard = getattr(info, "shard", None) or {}
    if int(shard.get("count") or 1) > 1:
        return (
            f"shard {shard.get('index')}/{shard.get('count')} of run group "
            f"{getattr(info, 'run_group', None)}"
        )
    return None
