"""A warm interpreter the suite's child pytest runs fork from, instead of each starting cold.

A child pytest run against the fake endpoint spends most of its CPU before its first case:
the interpreter, pytest and its plugins, and above all `import anthropic` (its thousands of
generated types: ~2.9 s of CPU on a 2-core CI machine) and `import mcp` (~1.5 s). The suite
starts hundreds of such runs. The fork server is one process per test process that has done
that importing once, under a real pytest session (so the plugins pytest rewrites are rewritten
exactly as in a cold start); each run is a fork of it that then runs `pytest` with the run's
own argv, working directory, environment and standard streams.

What a fork shares with the server is only what importing left: no thread, no event loop, no
open connection (checked before every fork); `random` is reseeded and `tempfile` forgets its
directory in the child; the child ends with `os._exit` once pytest returns, skipping the
teardown of the inherited heap. A test that signals its child by pid starts it with `subprocess`
itself; one that checks what a run imports is marked `cold_start`.
`EVALLOOP_TEST_FORKSERVER=0` turns the server off, and every run starts cold.
"""

from __future__ import annotations

import contextlib
import json
import os
import selectors
import shlex
import socket
import subprocess
import sys
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

OFF_ENV = "EVALLOOP_TEST_FORKSERVER"
"""Set to 0 to start every child pytest run cold (when a fork is suspected of a difference)."""

# What a child run imports after its session starts: imported here once, inside the preload
# session, so a fork starts with them.
PRELOAD = (
    "anthropic",
    "mcp",
    "mcp.client.stdio",
    "mcp.server.mcpserver",
    "duckdb",
    "jinja2",
)


@dataclass
class _Job:
    """What a forked child runs: pytest's argv, cwd and environment, on its own streams."""

    argv: list[str]
    cwd: str
    env: dict[str, str]
    fds: list[int]
    python: list[str] | None = None  # `python <these>` instead of pytest (an xdist worker)


class ForkedRun:
    """A child run forked from the server, with the part of `subprocess.Popen` pytester uses."""

    stdin = None

    def __init__(self, conn: socket.socket) -> None:
        self._conn = conn
        self._buffer = b""
        self.pid = int(self._message()["pid"])
        self.returncode: int | None = None

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is None:
            # The server writes the exit status when the child's pidfd turns readable.
            self._conn.settimeout(timeout)
            try:
                message = self._message()
            except TimeoutError:
                raise subprocess.TimeoutExpired(["pytest"], timeout or 0.0) from None
            self.returncode = int(message["exit"])
            self._conn.close()
        return self.returncode

    def _message(self) -> dict[str, Any]:
        # Raw reads keep what came before a timeout (a socket file refuses reads after one).
        while b"\n" not in self._buffer:
            chunk = self._conn.recv(4096)
            if not chunk:
                raise RuntimeError("the fork server went away before the run ended")
            self._buffer += chunk
        line, _, self._buffer = self._buffer.partition(b"\n")
        message: dict[str, Any] = json.loads(line)
        return message

    def poll(self) -> int | None:
        return self.returncode

    def kill(self) -> None:
        if self.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, 9)


class ForkServer:
    """The test process's side: starts the server once, then forks runs from it."""

    def __init__(self, workdir: Path, env: Mapping[str, str]) -> None:
        self.socket_path = workdir / "fork.sock"
        preload = workdir / "preload"
        preload.mkdir()
        ready_r, ready_w = os.pipe()
        boot = (
            "import importlib.util, sys; "
            f"spec = importlib.util.spec_from_file_location('_evalloop_forkserver', {__file__!r}); "
            "m = sys.modules[spec.name] = importlib.util.module_from_spec(spec); "
            "spec.loader.exec_module(m); "
            "sys.exit(m.main(sys.argv[1:]))"
        )
        with (workdir / "server.log").open("wb") as log:
            self._proc = subprocess.Popen(
                [sys.executable, "-c", boot, str(self.socket_path), str(preload), str(ready_w)],
                stdin=subprocess.PIPE,  # the server exits when this closes
                stdout=log,
                stderr=log,
                cwd=preload,
                env=dict(env),
                pass_fds=[ready_w],
            )
        os.close(ready_w)
        # An event, not a deadline: the server writes once it listens, or exits (EOF).
        with os.fdopen(ready_r, "rb") as ready:
            self.ready = ready.read() == b"ready"
        self.log = workdir / "server.log"

    def spawn(
        self,
        argv: Sequence[str],
        *,
        cwd: str,
        env: Mapping[str, str],
        stdout: int,
        stderr: int,
    ) -> ForkedRun:
        """Fork a run of `pytest <argv>` in `cwd` under `env`, its stdin closed."""
        stdin_r, stdin_w = os.pipe()
        os.close(stdin_w)  # as pytester's CLOSE_STDIN: the run reads EOF
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            conn.connect(str(self.socket_path))
            request = json.dumps({"argv": list(argv), "cwd": cwd, "env": dict(env)})
            socket.send_fds(conn, [b"\0"], [stdin_r, stdout, stderr])
            conn.sendall(request.encode("utf-8") + b"\n")
            return ForkedRun(conn)
        except BaseException:
            conn.close()
            raise
        finally:
            os.close(stdin_r)

    def close(self) -> None:
        if self._proc.stdin is not None:
            self._proc.stdin.close()
        self._proc.wait()


current: ForkServer | None = None
"""The test process's server once its session fixture started it (tests/conftest.py)."""


class PytestRun:
    """A `python -m pytest` run these tests start themselves, forked when a server runs: the
    part of `subprocess.Popen` they use (`communicate`, `returncode`)."""

    def __init__(
        self, cmd: Sequence[str], *, cwd: Path | str, env: Mapping[str, str], merge: bool
    ) -> None:
        import tempfile

        self.cmd = list(cmd)
        self._out = tempfile.TemporaryFile()
        self._err = self._out if merge else tempfile.TemporaryFile()
        forkable = current is not None and self.cmd[:3] == [sys.executable, "-m", "pytest"]
        self._proc: ForkedRun | subprocess.Popen[bytes]
        if current is not None and forkable:
            self._proc = current.spawn(
                self.cmd[3:],
                cwd=os.fspath(cwd),
                env=env,
                stdout=self._out.fileno(),
                stderr=self._err.fileno(),
            )
        else:
            self._proc = subprocess.Popen(
                self.cmd, cwd=cwd, env=dict(env), stdin=subprocess.DEVNULL,
                stdout=self._out, stderr=self._err,
            )  # fmt: skip
        self.pid = self._proc.pid

    @property
    def returncode(self) -> int | None:
        return self._proc.returncode

    def communicate(self, timeout: float | None = None) -> tuple[str, str]:
        try:
            self._proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()
            raise
        texts = []
        for stream in (self._out, self._err):
            stream.seek(0)
            texts.append(stream.read().decode("utf-8", "replace"))
        self._out.close()
        self._err.close()
        return texts[0], "" if self._err is self._out else texts[1]


def run_pytest(
    cmd: Sequence[str],
    *,
    cwd: Path | str,
    env: Mapping[str, str],
    timeout: float,
    merge: bool = False,
) -> subprocess.CompletedProcess[str]:
    """`subprocess.run(cmd, capture_output=True, text=True)` for a `python -m pytest` command,
    forked when the server runs; `merge` puts stderr into stdout."""
    run = PytestRun(cmd, cwd=cwd, env=env, merge=merge)
    out, err = run.communicate(timeout)
    assert run.returncode is not None
    return subprocess.CompletedProcess(run.cmd, run.returncode, out, err)


def main(argv: list[str]) -> int:
    """The server process: preload, listen, fork a child per request."""
    socket_path, preload_dir, ready_fd = argv[0], Path(argv[1]), int(argv[2])
    _preload(preload_dir)
    base_path = [p for p in sys.path if p and p != preload_dir.as_posix()]
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(socket_path)
    listener.listen(64)
    os.write(ready_fd, b"ready")
    os.close(ready_fd)
    job = _serve(listener)
    if job is None:
        return 0
    code = _run(job, base_path, socket_path)
    # The run is over (pytest.main returned: sessionfinish and unconfigure ran, the ledger and
    # report are written). Tearing the interpreter down would only free, object by object, the
    # heap inherited from the server, copying each page it touches: ~0.75 s of CPU a child,
    # measured, for nothing the process's exit does not do at once.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def launch(argv: list[str]) -> int:
    """`forkserver.py launch <socket> -u -c <code>` or `... -m <module> <args>`: the python a
    forked run's xdist workers are started with (execnet's `popen//python=`), and the fake
    `claude` CLI with the Python MCP servers it starts (`fake_claude_command`). The process is
    forked from the server and gets this process's streams; this process waits for it and
    ends with its status."""
    socket_path, python_args = argv[0], argv[1:]
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    conn.connect(socket_path)
    request = {"argv": [], "python": python_args, "cwd": os.getcwd(), "env": dict(os.environ)}
    socket.send_fds(conn, [b"\0"], [0, 1, 2])
    conn.sendall(json.dumps(request).encode("utf-8") + b"\n")
    run = ForkedRun(conn)
    # Only the worker holds execnet's pipes now: its end is the end execnet sees.
    devnull = os.open(os.devnull, os.O_RDWR)
    os.dup2(devnull, 0)
    os.dup2(devnull, 1)
    code = run.wait()  # when this process is killed, the server kills the worker (its EOF)
    if code < 0:
        os.kill(os.getpid(), -code)
    return code


class _Preloaded:
    """A plugin for the preload session: imports PRELOAD while pytest's import hooks are in."""

    def pytest_sessionfinish(self) -> None:
        import importlib

        for name in PRELOAD:
            importlib.import_module(name)


def _preload(directory: Path) -> None:
    import pytest

    # A session like a child run's (the same plugins, under PYTEST_ADDOPTS), collecting nothing.
    # Without pytest-rerunfailures: wherever xdist is installed, its controller starts a thread
    # serving its rerun counts, and a process with a thread must not fork. Each child run loads
    # it itself (a small module).
    argv = ["-q", "--co", "-p", "no:cacheprovider", "-p", "no:rerunfailures", str(directory)]
    code = pytest.main(argv, [_Preloaded()])
    if code not in (pytest.ExitCode.OK, pytest.ExitCode.NO_TESTS_COLLECTED):
        raise SystemExit(f"the preload session failed: exit {code}")
    import pkgutil

    import pytest_evalloop

    for info in pkgutil.walk_packages(pytest_evalloop.__path__, "pytest_evalloop."):
        __import__(info.name)
    import execnet.gateway_base  # what an xdist worker runs first

    from pytest_evalloop.report import html

    # The report's templates compiled once, not by each run (~0.25 s of CPU a run): jinja keeps
    # them in the cached environment and still checks their files' times on every use.
    for name in ("report.html.j2", "index.html.j2"):
        html._env().get_template(name)

    assert execnet.gateway_base
    sys.stdout.flush()
    sys.stderr.flush()


def _serve(listener: socket.socket) -> _Job | None:
    """Fork a child per request and report its exit; returns a job only in a forked child.

    A child whose requester hangs up first (a launcher killed by xdist) is killed."""
    select = selectors.DefaultSelector()
    select.register(listener, selectors.EVENT_READ, "accept")
    select.register(sys.stdin, selectors.EVENT_READ, "parent")
    running: dict[int, tuple[int, socket.socket]] = {}  # pidfd -> (pid, connection)
    while True:
        for key, _ in select.select():
            if key.data == "parent":
                if not os.read(0, 1):
                    return None  # the test process is done (or gone)
            elif key.data == "accept":
                conn, _ = listener.accept()
                job = _receive(conn)
                if threading.active_count() != 1:
                    raise SystemExit("the fork server has a thread: it must not fork")
                pid = os.fork()
                if pid == 0:
                    select.close()
                    listener.close()
                    for pidfd, (_, other) in running.items():
                        os.close(pidfd)
                        other.close()
                    conn.close()
                    return job
                for fd in job.fds:
                    os.close(fd)
                pidfd = os.pidfd_open(pid)
                running[pidfd] = (pid, conn)
                select.register(pidfd, selectors.EVENT_READ, ("child", pidfd))
                select.register(conn, selectors.EVENT_READ, ("hangup", pid))
                _send(conn, {"pid": pid})
            elif key.data[0] == "hangup":
                with contextlib.suppress(OSError):
                    if not key.fileobj.recv(1):  # type: ignore[union-attr]
                        select.unregister(key.fileobj)
                        os.kill(key.data[1], 9)
            else:
                pidfd = key.data[1]
                pid, conn = running.pop(pidfd)
                select.unregister(pidfd)
                with contextlib.suppress(KeyError):
                    select.unregister(conn)
                os.close(pidfd)
                _, status = os.waitpid(pid, 0)
                _send(conn, {"exit": os.waitstatus_to_exitcode(status)})
                conn.close()


def _receive(conn: socket.socket) -> _Job:
    _, fds, _, _ = socket.recv_fds(conn, 1, 3)
    buffer = b""
    while not buffer.endswith(b"\n"):
        chunk = conn.recv(1 << 16)
        if not chunk:
            break
        buffer += chunk
    request: dict[str, Any] = json.loads(buffer)
    return _Job(request["argv"], request["cwd"], request["env"], fds, request.get("python"))


def _send(conn: socket.socket, message: dict[str, int]) -> None:
    with contextlib.suppress(OSError):  # the test gave up on this run (a timeout, a crash)
        conn.sendall(json.dumps(message).encode("utf-8") + b"\n")


class _ForkedWorkers:
    """In a forked run: its xdist workers fork from the server too (through `launch`)."""

    def __init__(self, python: str) -> None:
        self.python = python

    def pytest_configure(self, config: Any) -> None:
        specs = getattr(config.option, "tx", None) or []
        config.option.tx = [f"popen//python={self.python}" if t == "popen" else t for t in specs]


def _run(job: _Job, base_path: list[str], socket_path: str) -> int:
    """In the forked child: become `python -m pytest <argv>` (or execnet's `python -u -c`)."""
    for target, fd in enumerate(job.fds):
        os.dup2(fd, target)
        os.close(fd)
    os.chdir(job.cwd)
    os.environ.clear()
    os.environ.update(job.env)
    extra = [p for p in job.env.get("PYTHONPATH", "").split(os.pathsep) if p]
    sys.modules.pop("_evalloop_forkserver", None)
    import tempfile

    tempfile.tempdir = None  # it caches $TMPDIR at first use; this run's may differ
    if job.python is not None:
        return _run_python(job.python, [*extra, *base_path])
    # As `python -m` lays it out: the working directory, PYTHONPATH, then the installation.
    sys.path[:] = [job.cwd, *extra, *base_path]
    import pytest

    sys.argv = [str(Path(pytest.__file__).with_name("__main__.py")), *job.argv]
    python = f"{sys.executable} {__file__} launch {socket_path}"
    try:
        code = int(pytest.main(job.argv, plugins=[_ForkedWorkers(python)]))
        sys.stdout.flush()
    except BrokenPipeError:  # as pytest.console_main: a closed reader is exit 1, quietly
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
    return code


def _run_python(args: list[str], path: list[str]) -> int:
    """`python -u -c <code> args...` (all execnet starts a worker with) or `python -m <module>
    args...` (the fake CLI and its MCP servers): `SystemExit` is the status, as in Python."""
    import runpy
    import types

    sys.path[:] = ["", *path]
    try:
        if args[:1] == ["-m"] and len(args) >= 2:
            sys.argv = [args[1], *args[2:]]
            runpy.run_module(args[1], run_name="__main__", alter_sys=True)
            return 0
        if args[:2] != ["-u", "-c"] or len(args) < 3:
            raise SystemExit(f"the fork server runs `python -u -c` or `-m`, not {args[:2]}")
        sys.argv = ["-c", *args[3:]]
        main = types.ModuleType("__main__")
        sys.modules["__main__"] = main
        exec(compile(args[2], "<string>", "exec"), main.__dict__)
    except SystemExit as stop:
        if stop.code is None or isinstance(stop.code, int):
            return stop.code or 0
        print(stop.code, file=sys.stderr)
        return 1
    return 0


def fake_claude_command(server: ForkServer) -> str:
    """The interpreter command the fake `claude` shim runs with (`PYTHON_ENV` of
    pytest_evalloop.testing.fake_claude): its runs and their Python MCP servers fork from
    `server`, each instead of a cold start with `import mcp` (~2.5 s of CPU an attempt)."""
    return f"{shlex.quote(sys.executable)} {shlex.quote(__file__)} launch {server.socket_path}"


if __name__ == "__main__":
    if sys.argv[1:2] != ["launch"]:
        raise SystemExit("usage: forkserver.py launch <socket> (-u -c <code> | -m <module>) [args]")
    sys.exit(launch(sys.argv[2:]))
