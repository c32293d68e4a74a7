"""What a sharded run is, in words, and why a gate refuses a shard.

:func:`shard_note` is the one sentence every view of a run prints about its shards (the
terminal summary, report.html, the Markdown summary, the runs index), under the title
:data:`SHARDS_TITLE`, so the three say the same. And one shard of a sharded run is a biased
subset of the set:

The partition is by a hash of the qid, so a shard is not a random sample of anything a bar was
set for: the flips of a third of the cases, held against a bar made for the whole set, accept
or reject on the wrong count. Every gate (the in-run gate, `evalloop flips --gate`, `evalloop
gate`) asks :func:`shard_refusal` first and refuses a shard, pointing at `evalloop merge`.
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


def shard_refusal(info: Any, side: str) -> str | None:
    """Why a gate refuses this run (`side`: baseline or current), or None when it is whole.

    A run is a shard when its run.json `shard` names a count above 1; a merged run has no
    `shard` (it has `shards`), and a merge with shards missing is aborted, which the gate
    already refuses as a harness failure.
    """
    shard = getattr(info, "shard", None) or {}
    count = int(shard.get("count") or 1)
    if count <= 1:
        return None
    name = getattr(info, "label", None) or getattr(info, "run_id", "?")
    return (
        f"the {side} run {name} is shard {shard.get('index')}/{count} of run group "
        f"{getattr(info, 'run_group', None)}: a shard is a biased subset, and no gate decides "
        "on one; merge the shards (`evalloop merge <shard runs>... -o <run>`) and gate the "
        "merged run (`evalloop gate <baseline> <merged run> --eval-gate=bar`)"
    )
