"""The seal of a closed run: what its ledger held when it closed, so a later change shows.

A run that closes (complete, interrupted, aborted or invalid) is sealed: `run.json` records a
hash chain over the lines of `events.jsonl`, a digest of `run.json`'s own identity and pins,
and a digest of its artifacts. The sidecar `seal.json` keeps one short chain value per line and
one digest per run.json key and artifact file, so a check names *the first changed line* (or
the key, or the file), not only that something changed.

Why a chain and not one digest: the value after line i covers every line up to i, so a torn or
truncated tail, a line deleted, reordered or inserted, all show at the first line where the
chain departs from the recorded one. Later stages append to a sealed run (reviews, diagnose,
the gate's `acceptance_check`): the writer extends the chain under its lock
(`writer.LedgerWriter.append`), so those lines are covered as well. A line appended around the
writer is not, and is reported.

A seal is tamper-evidence, not a signature: whoever can run this code can re-seal an edited run.
It catches the hand edit, the copy whose id was changed, the truncated tail: the ways a ledger
stops being what was measured without anyone meaning to forge it.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pytest_evalloop.ledger.contract import ARTIFACTS_DIR, EVENTS_FILE, RUN_FILE

SEAL_FILE = "seal.json"
"""The sidecar beside run.json: the per-line chain values, per-key and per-file digests."""
SEAL_FORMAT = 1
START = hashlib.sha256(b"pytest-evalloop seal v1").digest()
SHORT = 16
"""Hex characters of each per-line chain value kept in the sidecar (64 bits: a changed line
matches its old value by chance once in 2^64)."""

POST_CLOSE_KEYS = frozenset(
    {
        "seal",
        "gate",
        "pairedTests",
        "mode",
        "totals",
        "costs",
        "diagnoserModel",
        "diagnoseVersion",
        "diagnoseSha",
        "improverModel",
        "improveVersion",
        "improveSha",
    }
)
"""run.json keys later stages rewrite after the run closed (the gate's record, totals after a
review, diagnose and improve's own pins and costs): outside the seal. Every other key (the
identity, the pins, the status, the selection, the session) is sealed."""


def chain_step(previous: bytes, line: bytes) -> bytes:
    """The chain value after one more line (its bytes without the newline)."""
    return hashlib.sha256(previous + line).digest()


def event_lines(data: bytes) -> list[bytes]:
    """The lines of an events file: split on newlines; a torn last line (no newline) counts."""
    lines = data.split(b"\n")
    if lines and lines[-1] == b"":
        lines.pop()
    return lines


def _key_digest(value: Any) -> str:
    text = json.dumps(value, sort_keys=True, ensure_ascii=False, separators=(",", ":"))
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:SHORT]


def sealed_keys(info: dict[str, Any]) -> dict[str, str]:
    """A digest per sealed run.json key (every key but `POST_CLOSE_KEYS`)."""
    return {key: _key_digest(value) for key, value in info.items() if key not in POST_CLOSE_KEYS}


def _combined(parts: dict[str, str]) -> str:
    return _key_digest(sorted(parts.items()))


def artifact_digests(run_dir: Path) -> dict[str, str]:
    """sha256 of every file under `artifacts/`, by its path relative to the run."""
    root = run_dir / ARTIFACTS_DIR
    out: dict[str, str] = {}
    if not root.is_dir():
        return out
    for path in sorted(p for p in root.rglob("*") if p.is_file() and not p.is_symlink()):
        with open(path, "rb") as handle:
            digest = hashlib.file_digest(handle, "sha256")
        out[path.relative_to(run_dir).as_posix()] = digest.hexdigest()
    return out


@dataclass
class Sealed:
    """What `compute` found: run.json's `seal` record and the sidecar's content."""

    record: dict[str, Any]
    sidecar: dict[str, Any]


def compute(run_dir: Path, info: dict[str, Any], *, at: str) -> Sealed:
    """The seal of a run as it is on disk now (`info`: its run.json as a dict, without `seal`)."""
    events = run_dir / EVENTS_FILE
    data = events.read_bytes() if events.is_file() else b""
    value, short = START, []
    for line in event_lines(data):
        value = chain_step(value, line)
        short.append(value.hex()[:SHORT])
    keys = sealed_keys(info)
    files = artifact_digests(run_dir)
    record = {
        "format": SEAL_FORMAT,
        "lines": len(short),
        "chain": value.hex(),
        "info": _combined(keys),
        "artifacts": _combined(files),
        "files": len(files),
        "at": at,
    }
    sidecar = {"format": SEAL_FORMAT, "chain": short, "info": keys, "artifacts": files}
    return Sealed(record=record, sidecar=sidecar)


def extended(record: dict[str, Any], sidecar: dict[str, Any], lines: list[bytes]) -> None:
    """Extend a seal, in place, by lines appended after it (the writer's post-close appends)."""
    value = bytes.fromhex(record["chain"])
    for line in lines:
        value = chain_step(value, line)
        sidecar["chain"].append(value.hex()[:SHORT])
    record["chain"] = value.hex()
    record["lines"] = int(record["lines"]) + len(lines)


def read_sidecar(run_dir: Path) -> dict[str, Any] | None:
    """The sidecar, or None when it is missing or unreadable."""
    try:
        data = json.loads((run_dir / SEAL_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


@dataclass
class SealCheck:
    """What checking a run against its seal found."""

    sealed: bool
    """Whether the run carries a seal at all."""
    errors: list[str] = field(default_factory=list)
    """Changes after sealing, first changed line first."""
    warnings: list[str] = field(default_factory=list)

    @property
    def broken(self) -> str | None:
        """The first change found, in words, or None when the run is as sealed."""
        return self.errors[0] if self.errors else None


def verify(run_dir: Path) -> SealCheck:
    """Check a run directory against its seal: the events, run.json's sealed keys, artifacts."""
    try:
        info = json.loads((run_dir / RUN_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return SealCheck(sealed=False, errors=["run.json cannot be read"])
    record = info.get("seal") if isinstance(info, dict) else None
    if not isinstance(record, dict):
        return SealCheck(sealed=False)
    check = SealCheck(sealed=True)
    if record.get("format") != SEAL_FORMAT:
        check.errors.append(f"run.json seal has format {record.get('format')!r}, not {SEAL_FORMAT}")
        return check
    sidecar = read_sidecar(run_dir) or {}
    _check_events(run_dir, record, sidecar, check)
    _check_info(info, record, sidecar, check)
    _check_artifacts(run_dir, record, sidecar, check)
    return check


def _check_events(
    run_dir: Path, record: dict[str, Any], sidecar: dict[str, Any], check: SealCheck
) -> None:
    path = run_dir / EVENTS_FILE
    lines = event_lines(path.read_bytes()) if path.is_file() else []
    sealed = int(record.get("lines") or 0)
    value = START
    for line in lines[:sealed]:
        value = chain_step(value, line)
    if len(lines) >= sealed and value.hex() == record.get("chain"):
        if len(lines) > sealed:
            check.errors.append(
                f"{EVENTS_FILE} lines {sealed + 1}-{len(lines)} were appended after the run "
                "was sealed, around the ledger's writer"
            )
        return
    chain = sidecar.get("chain")
    recorded: list[Any] = chain if isinstance(chain, list) else []
    value = START
    for number, line in enumerate(lines[:sealed], start=1):
        value = chain_step(value, line)
        if number <= len(recorded) and value.hex()[:SHORT] != recorded[number - 1]:
            check.errors.append(
                f"{EVENTS_FILE} line {number} changed after the run was sealed (the first "
                f"changed line; the seal covers {sealed} lines)"
            )
            return
    if len(lines) < sealed:
        check.errors.append(
            f"{EVENTS_FILE} ends at line {len(lines)}, but the seal covers {sealed} lines: "
            f"lines {len(lines) + 1}-{sealed} are gone (truncated or torn after sealing)"
        )
        return
    check.errors.append(
        f"{EVENTS_FILE} changed after the run was sealed ({SEAL_FILE} cannot say where: it "
        "is missing or was changed too)"
    )


def _check_info(
    info: dict[str, Any], record: dict[str, Any], sidecar: dict[str, Any], check: SealCheck
) -> None:
    now = sealed_keys(info)
    if _combined(now) == record.get("info"):
        return
    keys = sidecar.get("info")
    was: dict[str, Any] = keys if isinstance(keys, dict) else {}
    changed = sorted(k for k in set(now) | set(was) if now.get(k) != was.get(k))
    named = ", ".join(changed) if was and changed else "(seal.json cannot say which)"
    check.errors.append(f"{RUN_FILE} changed after the run was sealed: {named}")


def _check_artifacts(
    run_dir: Path, record: dict[str, Any], sidecar: dict[str, Any], check: SealCheck
) -> None:
    files = sidecar.get("artifacts")
    was: dict[str, Any] | None = files if isinstance(files, dict) else None
    now = artifact_digests(run_dir)
    if was is not None:
        # Files added later are no change to what was measured (nothing counts from them).
        added = sorted(set(now) - set(was))
        if added:
            check.warnings.append(f"artifacts added after sealing: {', '.join(added[:5])}")
        now = {k: v for k, v in now.items() if k in was}
    if _combined(now) == record.get("artifacts"):
        return
    if was is None:
        check.errors.append(f"artifacts changed after the run was sealed ({SEAL_FILE} is missing)")
        return
    gone = sorted(set(was) - set(now))
    changed = sorted(k for k in now if now[k] != was.get(k))
    parts = [f"{p} changed" for p in changed[:5]] + [f"{p} removed" for p in gone[:5]]
    check.errors.append(
        "artifacts changed after the run was sealed: " + (", ".join(parts) or "(unknown)")
    )
