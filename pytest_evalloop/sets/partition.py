"""Which shard of a sharded run a case belongs to, and what `--eval-shard=I/N` names.

A run split across CI jobs (a matrix, a Kubernetes indexed Job) must give every case to exactly
one job, the same one on every machine: the shard of a case is a function of its qid alone, by a
hash that does not depend on Python's per-process string hashing, the platform, the order of
`cases.jsonl`, `-k` or xdist. Every sample of a case has the qid's shard, so pass@k and repeats
are counted whole within one shard.
"""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass

RULE = "sha256(qid) mod N"
"""The partition rule, recorded in run.json so a merge can refuse shards cut another way."""
RUN_GROUP_ENV = (
    ("EVALLOOP_RUN_GROUP", ""),
    ("GITHUB_RUN_ID", "github-"),
    ("CI_PIPELINE_ID", "gitlab-"),
    ("BUILDKITE_BUILD_ID", "buildkite-"),
)
"""Where a run group comes from when `--eval-run-group` is not given: the CI's own id of the
run (every job of one workflow run sees the same), first found wins, prefixed by its CI."""
_SPEC = re.compile(
    r"^\s*(?P<index>[A-Za-z_][A-Za-z0-9_]*(?:\s*\+\s*\d+)?|\d+)\s*/\s*(?P<n>\d+)\s*$"
)


def shard_of(qid: str, count: int) -> int:
    """The shard (1..count) that holds `qid`: the first 8 bytes of sha256(qid), mod count."""
    if count < 1:
        raise ValueError(f"a run has at least one shard, got {count}")
    digest = hashlib.sha256(qid.encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "big") % count + 1


@dataclass(frozen=True)
class Shard:
    """This job's slice of a sharded run: shard `index` of `count` (1-based)."""

    index: int
    count: int

    def holds(self, qid: str) -> bool:
        """Whether this shard runs the case."""
        return shard_of(qid, self.count) == self.index

    def __str__(self) -> str:
        return f"{self.index}/{self.count}"


def parse_shard(spec: str, env: Mapping[str, str] | None = None) -> Shard:
    """`I/N` with I in 1..N; I may name an environment variable, with an offset: `NAME+1/N`.

    The offset is there because indexes CI engines hand out are often 0-based (Kubernetes'
    `JOB_COMPLETION_INDEX`): `--eval-shard=JOB_COMPLETION_INDEX+1/8`. Raises ValueError naming
    the value and the fix.
    """
    env = os.environ if env is None else env
    match = _SPEC.match(spec)
    if match is None:
        raise ValueError(
            f"--eval-shard={spec!r} is not I/N; give e.g. --eval-shard=2/3, or name the variable "
            "holding the index: --eval-shard=JOB_COMPLETION_INDEX+1/3"
        )
    count = int(match["n"])
    raw = match["index"].replace(" ", "")
    if raw.isdigit():
        index = int(raw)
    else:
        name, _, offset = raw.partition("+")
        value = env.get(name)
        if value is None or not value.strip().isdigit():
            shown = "is not set" if value is None else f"is {value!r}, not a whole number"
            raise ValueError(
                f"--eval-shard={spec!r}: the environment variable {name} {shown}; set it to the "
                "shard's index or give the index itself (--eval-shard=2/3)"
            )
        index = int(value) + int(offset or 0)
    if count < 1 or not 1 <= index <= count:
        raise ValueError(
            f"--eval-shard={spec!r} gives shard {index} of {count}; shards are numbered 1..N "
            "(a 0-based index needs +1: --eval-shard=JOB_COMPLETION_INDEX+1/N)"
        )
    return Shard(index=index, count=count)


def run_group(given: str | None, env: Mapping[str, str] | None = None) -> str | None:
    """The run group every shard of one sharded run shares: `--eval-run-group`, else the CI's
    run id (`RUN_GROUP_ENV`), else None."""
    if given:
        return given
    env = os.environ if env is None else env
    for name, prefix in RUN_GROUP_ENV:
        value = (env.get(name) or "").strip()
        if value:
            # Not GITHUB_RUN_ATTEMPT: "re-run failed jobs" re-runs one shard of the same run,
            # and its result must merge with the shards that passed the first time.
            return f"{prefix}{value}"
    return None
