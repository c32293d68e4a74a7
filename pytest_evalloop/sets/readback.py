"""What identifies a collected row's line in `cases.jsonl`, so an item can let its parsed row go
and read the very same row back (`cases.case_at`)."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass


@dataclass(frozen=True)
class LineRef:
    """Where a row's line starts in `cases.jsonl`, and a digest of its bytes."""

    offset: int
    digest: bytes


def line_digest(line: bytes) -> bytes:
    """What identifies a row's line: its bytes (newline aside) under BLAKE2b, 16 bytes."""
    return hashlib.blake2b(line.rstrip(b"\r\n"), digest_size=16).digest()


class CaseChanged(LookupError):
    """A collected case whose line is no longer in `cases.jsonl` as it was collected."""
