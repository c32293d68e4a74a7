"""The smaller first-contact items of issue 47, each against real stored runs: the runs index's
copy-paste command works from any folder and prints the flips, `evalloop validate` on a folder
without run.json exits 2, and the runs index is written when the chart process is gone (a
Ctrl-C reaches the whole process group)."""

from __future__ import annotations

import html
import os
import re
import shlex
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from pytest_evalloop.cli import main as evalloop
from pytest_evalloop.report import charts
from pytest_evalloop.report.html import session_outputs
from tests.reportruns import two_runs


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path]:
    """A baseline (`before`) and a current run (`after`) of a six-case set: two better, one
    worse."""
    _set_dir, before, after, _out = two_runs(tmp_path_factory.mktemp("first-contact"))
    return before.parent, before, after


def test_the_index_command_prints_the_flips_from_any_folder(
    runs: tuple[Path, Path, Path], tmp_path: Path
) -> None:
    runs_dir, _before, after = runs
    page = (runs_dir / "index.html").read_text(encoding="utf-8")
    [command] = [html.unescape(c) for c in re.findall(r"evalloop report [^<]+", page)]
    argv = shlex.split(command)
    assert Path(argv[2]) == after.resolve()  # absolute: pasted anywhere, it finds the run
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    done = subprocess.run(
        [str(Path(sys.executable).parent / "evalloop"), *argv[1:], "-o", str(tmp_path / "f.html")],
        cwd=elsewhere,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    # The terminal shows the flips, not only the run's own summary.
    assert "flips: before (baseline) -> after (current)" in done.stdout
    assert "better (no_match -> match): 2   worse (match -> no_match): 1" in done.stdout
    assert (tmp_path / "f.html").is_file()


def test_validate_a_folder_without_run_json_exits_2(
    runs: tuple[Path, Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert evalloop(["validate", str(tmp_path)]) == 2
    assert "holds no run.json" in capsys.readouterr().err
    assert evalloop(["validate", str(tmp_path / "missing")]) == 2
    assert evalloop(["validate", str(runs[2])]) == 0


def test_the_index_is_written_when_the_chart_process_is_gone(
    runs: tuple[Path, Path, Path],
) -> None:
    runs_dir, _before, after = runs
    index = runs_dir / "index.html"
    index.unlink()
    charts.warm_up()
    [process] = charts._running
    process.proc.kill()  # what a Ctrl-C to the process group does to it
    process.proc.wait()
    try:
        lines = session_outputs([after], baseline=None, html=True, summary_md=None)
    finally:
        charts.shutdown()
    said = "\n".join(lines[after])
    assert f"runs index: {index}" in said, said
    page = index.read_text(encoding="utf-8")
    assert "before" in page and "after" in page  # every run listed, without the chart


def test_a_ctrl_c_stops_the_demo_with_130_and_no_traceback(tmp_path: Path) -> None:
    # Its own process group, as a terminal's foreground job is: the Ctrl-C reaches the demo and
    # its child run together. SIGINT restored in the child, in case this suite was started with
    # it ignored (a background job), which the child would inherit.
    demo = subprocess.Popen(
        [str(Path(sys.executable).parent / "evalloop"), "demo", "--dir", str(tmp_path / "d")],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    assert demo.stdout is not None
    said = []
    try:
        # An event, not a time: the baseline's pytest has collected, so its handler is set.
        for line in demo.stdout:
            said.append(line)
            if line.startswith("collected "):
                break
        os.killpg(demo.pid, signal.SIGINT)
        said.extend(demo.stdout)
        assert demo.wait(timeout=300) == 130, "".join(said)
    finally:
        if demo.poll() is None:
            demo.kill()
    out = "".join(said)
    assert "Traceback (most recent call last)" not in out, out
    assert "evalloop demo: interrupted (Ctrl-C); the fake is stopped" in out, out
    assert "2/2" not in out  # stopped, not carried on to the gated run


class _CtrlCLandsHere:
    """A literal whose repr is where a Ctrl-C lands: pydantic-core asks for it while it
    builds the validator, as it calls into Python when a module of models is imported."""

    def __repr__(self) -> str:
        raise KeyboardInterrupt

    def __hash__(self) -> int:
        raise KeyboardInterrupt


def test_a_ctrl_c_while_a_model_is_built_stays_an_interrupt() -> None:
    # The demo's Ctrl-C once landed in the golden check's first import of the target's
    # models, and pydantic-core reported it as a SchemaError: an INTERNALERROR, a traceback.
    from pydantic_core import SchemaError, SchemaValidator, core_schema

    from pytest_evalloop.failures import interrupts_kept

    with pytest.raises(SchemaError, match="KeyboardInterrupt"):
        SchemaValidator(core_schema.literal_schema([_CtrlCLandsHere()]))
    with pytest.raises(KeyboardInterrupt), interrupts_kept():
        SchemaValidator(core_schema.literal_schema([_CtrlCLandsHere()]))
    with pytest.raises(SchemaError), interrupts_kept():  # any other schema error stays one
        SchemaValidator({"type": "no-such-schema"})  # type: ignore[arg-type,typeddict-item]
