"""What one query in the query process may take, and what the answerer reads past a limit.

Shared by the host (`query_host`) and the child (`query_child`): the `Limits` the child is
started with, the locked configuration every sandbox database is created with, the
`HostError` a query ends in, and the texts of the time and memory refusals.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

__all__ = [
    "TEST_GATE_ENV",
    "HostError",
    "Limits",
    "locked_config",
    "memory_text",
    "time_limit_text",
]

# The test suite's hook into the query process (never set in a run): a directory through which
# a test decides when a query finishes. With it set, the child defines the SQL function
# `evalloop_test_gate(name)`, which says it started and then waits for the test to open the
# gate (query_child._TestGate). Tests then kill, interrupt or time out a query that is known to
# be in flight, instead of a "slow" query whose speed depends on the machine.
TEST_GATE_ENV = "EVALLOOP_TEST_GATE_DIR"

# DuckDB's own memory_limit, as a share of the process cap: the rest is the interpreter,
# DuckDB's code and threads, and what is allocated outside the buffer manager.
DUCKDB_SHARE = 0.75


@dataclass(frozen=True)
class Limits:
    """What one query may take."""

    timeout_s: float = 10.0
    row_cap: int = 1000
    reply_bytes: int = 1_000_000
    """At most this many bytes of JSON for the reply's rows."""
    memory_mb: int = 2048
    """The query process's whole data memory (the kernel's RLIMIT_DATA on the child)."""

    def __post_init__(self) -> None:
        problems = [
            f"{name} must be positive, got {value}"
            for name, value in asdict(self).items()
            if not value > 0
        ]
        if self.memory_mb < 256:
            problems.append(f"memory_mb must be at least 256, got {self.memory_mb}")
        if problems:
            raise ValueError("; ".join(problems))

    @property
    def duckdb_memory_mb(self) -> int:
        """DuckDB's own `memory_limit`, below the process cap."""
        return int(self.memory_mb * DUCKDB_SHARE)


def locked_config(memory_mb: int) -> dict[str, str | bool | int | float | list[str]]:
    """The configuration every sandbox database is created with (see docs/embedded-target.md).

    Every lock is part of the configuration, so no statement ever runs on an unlocked
    database. Python replacement scans would let `FROM some_name` read a Python variable of a
    calling frame; an empty temp_directory stops spilling to disk.
    """
    return {
        "python_enable_replacements": False,
        "temp_directory": "",
        "memory_limit": f"{memory_mb}MB",
        "enable_external_access": False,
        "allow_community_extensions": False,
        "autoinstall_known_extensions": False,
        "autoload_known_extensions": False,
        "lock_configuration": True,
    }


class HostError(Exception):
    """A query the host could not answer; `refused` says whether it was the query's fault."""

    def __init__(self, message: str, *, refused: bool) -> None:
        super().__init__(message)
        self.refused = refused


def time_limit_text(timeout_s: float) -> str:
    """What the answerer reads when its query ran past the time limit."""
    return (
        f"query stopped: it ran past the time limit of {timeout_s:g} s; "
        "aggregate or filter more so it finishes sooner"
    )


def memory_text(memory_mb: int) -> str:
    """What the answerer reads when its query needed more memory than the limit."""
    return (
        f"query stopped: it needed more memory than the limit of {memory_mb} MB; aggregate or "
        "filter more, and build smaller lists and strings"
    )
