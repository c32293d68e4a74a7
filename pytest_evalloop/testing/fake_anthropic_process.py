"""A fake Messages API in a child process, and talking to one over HTTP.

``start_fake_anthropic_process`` runs ``python -m pytest_evalloop.testing.fake_anthropic`` (one
server shared by pytester runs and xdist workers) and waits for its URL line;
``fetch_requests`` and ``reset_fake`` read and clear the log of a fake at a URL.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Sequence
from pathlib import Path

from pytest_evalloop.testing.fake_anthropic import URL_LINE_PREFIX, RecordedRequest
from pytest_evalloop.testing.policies import ScriptSpec


def fetch_requests(url: str, timeout: float = 10.0) -> list[RecordedRequest]:
    """Read the request log of a fake at ``url`` (``GET /_fake/requests``)."""
    with urllib.request.urlopen(url.rstrip("/") + "/_fake/requests", timeout=timeout) as resp:
        return [RecordedRequest.model_validate(r) for r in json.loads(resp.read())]


def reset_fake(url: str, timeout: float = 10.0) -> None:
    """Clear the log, cache and script positions of a fake at ``url`` (``POST /_fake/reset``)."""
    req = urllib.request.Request(url.rstrip("/") + "/_fake/reset", data=b"{}", method="POST")
    with urllib.request.urlopen(req, timeout=timeout):
        pass


class FakeAnthropicProcess:
    """A fake running in a child process: ``url``, ``stop()``, ``requests()``, ``reset()``."""

    def __init__(
        self, process: subprocess.Popen[str], url: str, cleanup: Sequence[Path] = ()
    ) -> None:
        self.process = process
        self.url = url
        self._cleanup = list(cleanup)

    def requests(self) -> list[RecordedRequest]:
        """The child's request log."""
        return fetch_requests(self.url)

    def reset(self) -> None:
        """Reset the child's log, cache and scripts."""
        reset_fake(self.url)

    def env(self, api_key: str = "fake-key-not-a-secret") -> dict[str, str]:
        """Environment variables that point the anthropic SDK at this fake."""
        return {"ANTHROPIC_BASE_URL": self.url, "ANTHROPIC_API_KEY": api_key}

    def stop(self) -> None:
        """Terminate the child (kill after 5 s) and remove temporary files."""
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=5)
        if self.process.stdout is not None:
            self.process.stdout.close()
        for path in self._cleanup:
            with contextlib.suppress(OSError):
                path.unlink()

    def __enter__(self) -> FakeAnthropicProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def start_fake_anthropic_process(
    policy: ScriptSpec | str | Path,
    *,
    port: int = 0,
    startup_timeout: float = 20.0,
    python: str = sys.executable,
) -> FakeAnthropicProcess:
    """Start ``python -m pytest_evalloop.testing.fake_anthropic`` and wait for its URL line.

    ``policy`` is a spec object (written to a temporary file) or the path of a spec JSON file.
    """
    cleanup: list[Path] = []
    if isinstance(policy, ScriptSpec):
        if policy.cases_file and not Path(policy.cases_file).is_absolute():
            policy = policy.model_copy(
                update={"cases_file": str(Path(policy.cases_file).resolve())}
            )
        fd, name = tempfile.mkstemp(prefix="evalloop-fake-", suffix=".json")
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(policy.model_dump_json())
        policy = Path(name)
        cleanup.append(policy)
    err_fd, err_name = tempfile.mkstemp(prefix="evalloop-fake-", suffix=".stderr")
    cleanup.append(Path(err_name))
    cmd = [
        python,
        "-m",
        "pytest_evalloop.testing.fake_anthropic",
        "--policy-file",
        str(policy),
        "--port",
        str(port),
    ]
    process = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=err_fd, text=True)
    os.close(err_fd)
    url = _wait_for_url(process, startup_timeout)
    if url is None:
        process.kill()
        process.wait(timeout=5)
        detail = Path(err_name).read_text(encoding="utf-8", errors="replace")[-2000:]
        for path in cleanup:
            with contextlib.suppress(OSError):
                path.unlink()
        raise RuntimeError(
            f"the fake Anthropic process ({' '.join(cmd)}) did not print {URL_LINE_PREFIX}... "
            f"within {startup_timeout} s; its stderr:\n{detail}"
        )
    return FakeAnthropicProcess(process, url, cleanup)


def _wait_for_url(process: subprocess.Popen[str], timeout: float) -> str | None:
    found: list[str] = []

    def read() -> None:
        assert process.stdout is not None
        for line in process.stdout:
            if line.startswith(URL_LINE_PREFIX):
                found.append(line[len(URL_LINE_PREFIX) :].strip())
                return

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    deadline = time.monotonic() + timeout
    while reader.is_alive() and time.monotonic() < deadline:
        reader.join(timeout=0.05)
    return found[0] if found else None
