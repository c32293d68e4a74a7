"""What identifies a collected row's line in `cases.jsonl`, so an item can let its parsed row go
and read the very same row back (`cases.case_at`)."""

from __future__ import annotations

import hashlib
import os
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO


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


def open_regular(path: Path) -> BinaryIO:
    """`cases.jsonl` opened to read, never waiting on a pipe put in its place: opened without
    blocking, and an OSError unless what opened is a regular file."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise OSError(0, "it is no longer a regular file", str(path))
    return os.fdopen(fd, "rb")
