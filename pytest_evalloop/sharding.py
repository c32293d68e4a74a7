"""How case items are spread over xdist workers so each worker can start its items ahead.

In-process concurrency needs to know which items this process will run next. Under plain xdist
a worker learns that one item at a time. So, when `--dist` is the default `load`, the controller
uses :class:`ShardScheduling`: the case items are dealt round-robin into one shard per worker, and
each shard goes to one worker whole. Every process computes the same shards from the same
collection, so a worker that receives one item of a shard knows the rest of it. Other tests keep
one scope each, as under `load`.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

_CASE_NODE = re.compile(r"(^|/)(cases|judge-regressions)\.jsonl::")


def is_case_node(nodeid: str) -> bool:
    """Whether a node id is one of our case items."""
    return bool(_CASE_NODE.search(nodeid))


def shards(nodeids: Sequence[str], count: int) -> dict[str, int]:
    """Case node ids → shard number, dealt round-robin in collection order."""
    cases = [n for n in nodeids if is_case_node(n)]
    return {nodeid: index % max(count, 1) for index, nodeid in enumerate(cases)}


def make_scheduler(config: Any, log: Any) -> Any:
    """The controller's scheduler for a `load` run (imports xdist only when it is used)."""
    from xdist.scheduler import LoadScopeScheduling

    class ShardScheduling(LoadScopeScheduling):
        """`loadscope`, with one scope per shard of case items and one per other test."""

        _shards: dict[str, int] | None = None

        def _split_scope(self, nodeid: str) -> str:
            if self._shards is None:
                self._shards = shards(self.collection or [], self.numnodes)
            shard = self._shards.get(nodeid)
            return nodeid if shard is None else f"evalloop-shard-{shard}"

    return ShardScheduling(config, log)
