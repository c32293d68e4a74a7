"""Print the two walks of docs/loop.md, run for real on the fake endpoint.

    .venv/bin/python tools/loop_walk.py            # print both transcripts
    .venv/bin/python tools/loop_walk.py --write    # put them into docs/loop.md

Each walk is the scenario its test drives (tests/test_improve.py for the embedded set,
tests/test_improve_malloy.py for the Malloy one): a temporary git repository holding a copy of
the example set with a weakened model doc, `evalloop loop` against the fake endpoint (the real
target, the real blind arms), then `evalloop restore` of the first checkpoint. What is printed
is what the commands printed; the doc's blocks are replaced between their markers, never typed.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
DOC = REPO / "docs" / "loop.md"


def _git(repo: Path, *args: str) -> None:
    subprocess.run(["git", *args], cwd=repo, check=True, capture_output=True, text=True)


def _embedded(root: Path) -> tuple[str, Any]:
    from tests import test_improve as t
    from tests.test_run import make_set

    set_dir = make_set(root, t.QIDS)
    model = set_dir / "model.json"
    model.write_text(model.read_text().replace(json.dumps({"doc": t.STATUS_DOC})[1:-1], t.WEAK))
    return "evals/shop", t.Shop(set_dir, t.improver({"edit": t.restoring_edit()}, t.reply()))


def _malloy(root: Path) -> tuple[str, Any]:
    from tests import test_improve_malloy as t

    set_dir = t.copy_set(root / "evals" / "ecommerce-malloy")
    return "evals/ecommerce-malloy", t.Shop(set_dir, t.improver({"edit": t.RESTORING}, t.reply()))


def walk(build: Callable[[Path], tuple[str, Any]]) -> str:
    """One walk's transcript: the loop, then the restore of the first checkpoint."""
    from pytest_evalloop import cli
    from pytest_evalloop.testing import FakeAnthropic

    lines: list[str] = []
    with tempfile.TemporaryDirectory() as tmp, FakeAnthropic() as fake:
        root = Path(tmp)
        set_arg, policy = build(root)
        _git(root, "init", "-q")
        _git(root, "add", "evals")
        _git(root, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "weakened")
        fake.policy = policy
        saved = dict(os.environ), Path.cwd()
        os.environ.update(ANTHROPIC_BASE_URL=fake.base_url, ANTHROPIC_API_KEY="test-key-walk")
        os.chdir(root)
        try:
            name = json.loads((root / set_arg / "set.json").read_text())["name"]
            for argv in (
                ["loop", set_arg],
                ["restore", f"{name}-checkpoint-01", "--set", set_arg],
            ):
                out = io.StringIO()
                with contextlib.redirect_stdout(out):
                    code = cli.main(argv)
                lines += [f"$ evalloop {' '.join(argv)}", out.getvalue().rstrip(), f"(exit {code})"]
        finally:
            os.chdir(saved[1])
            os.environ.clear()
            os.environ.update(saved[0])
    return "\n".join(lines)


WALKS = {"embedded": _embedded, "malloy": _malloy}


def write(doc: str, key: str, text: str) -> str:
    start, end = f"<!-- walk:{key} -->\n", f"<!-- /walk:{key} -->"
    head, rest = doc.split(start, 1)
    _, tail = rest.split(end, 1)
    return f"{head}{start}```\n{text}\n```\n{end}{tail}"


def main() -> int:
    from pytest_evalloop.improve.cli import quiet_sdk_logs

    quiet_sdk_logs()
    results = {key: walk(build) for key, build in WALKS.items()}
    if "--write" in sys.argv[1:]:
        doc = DOC.read_text(encoding="utf-8")
        for key, text in results.items():
            doc = write(doc, key, text)
        DOC.write_text(doc, encoding="utf-8")
    for key, text in results.items():
        print(f"--- {key}\n{text}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
