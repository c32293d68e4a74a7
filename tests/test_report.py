"""The run report (report.html), the runs index and the Markdown summary, in a real browser.

Runs are real (the example set's cases against the loopback fake endpoint); the pages are
opened from disk in Debian's headless chromium, driven by Playwright, and every assertion is
about what the page shows compared with the ledger as `aggregates` and `flips` count it.
"""

from __future__ import annotations

import base64
import gzip
import json
import math
import os
import select
import shutil
import string
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from pytest_evalloop import cli
from pytest_evalloop.ledger import reader as ledger_reader
from pytest_evalloop.measure import aggregates
from pytest_evalloop.measure.comparison import compare, read_compared, run_view
from pytest_evalloop.measure.gate import acceptance_bar
from pytest_evalloop.report.html import REPORT_FILE, embedded_data, render
from pytest_evalloop.report.report import build, pass_rate_text
from pytest_evalloop.report.summary_md import markdown
from tests.reportruns import (
    PAYLOAD,
    ROW_PAYLOAD,
    WRONG_AFTER,
    WRONG_BEFORE,
    repeated_runs,
    two_runs,
    xss_run,
)
from tests.test_run import make_set, run, spec

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path, str]:
    """(set_dir, baseline run, current run, the current run's stdout), run once per module."""
    root = tmp_path_factory.mktemp("report-runs")
    return two_runs(root, f"--eval-summary-md={root / 'summary.md'}")


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    """One headless chromium for the module: Debian's package, or where that is not there
    Playwright's own (`make real-components` installs one or the other)."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        executable = str(CHROMIUM) if CHROMIUM.is_file() else p.chromium.executable_path
        if not Path(executable).is_file():
            if os.environ.get("CI"):
                pytest.fail(f"{CHROMIUM} is missing: `make real-components` installs it")
            pytest.skip(f"no chromium ({CHROMIUM} or Playwright's): make real-components")
        chromium = p.chromium.launch(executable_path=executable, args=CHROMIUM_ARGS)
        yield chromium
        chromium.close()


class Page:
    """A page opened from disk, with every dialog, console line and page error it raised."""

    def __init__(self, browser: Any, path: Path) -> None:
        self.events: list[str] = []
        self.page = browser.new_page(viewport={"width": 1250, "height": 1000})
        self.page.on("dialog", lambda d: (self.events.append(f"dialog: {d.message}"), d.dismiss()))
        self.page.on("console", lambda m: self.events.append(f"console: {m.text}"))
        self.page.on("pageerror", lambda e: self.events.append(f"pageerror: {e}"))
        self.requests: list[str] = []
        self.page.on("request", lambda r: self.requests.append(r.url))
        self.page.goto(path.resolve().as_uri())
        if path.name == REPORT_FILE:
            self.page.wait_for_selector("body[data-ready='1']")

    def close(self) -> None:
        self.page.close()


@pytest.fixture
def open_page(browser: Any) -> Iterator[Any]:
    pages: list[Page] = []

    def opener(path: Path) -> Page:
        pages.append(Page(browser, path))
        return pages[-1]

    yield opener
    for page in pages:
        page.close()


def visible_keys(page: Any) -> list[str]:
    return page.eval_on_selector_all(
        "#cases tbody tr:not([hidden])", "rows => rows.map(r => r.dataset.key)"
    )


# --- in the browser -----------------------------------------------------------------------


def test_the_counts_shown_equal_the_ledgers(
    runs: tuple[Path, Path, Path, str], open_page: Any
) -> None:
    _, _, current, _ = runs
    tally = aggregates.tally(ledger_reader.read_run(current))
    page = open_page(current / REPORT_FILE)
    shown = page.page.eval_on_selector_all(
        "#outcomes tr[data-outcome]",
        "rows => rows.map(r => [r.dataset.outcome, Number(r.cells[1].textContent)])",
    )
    assert dict(shown) == tally.outcomes == {"match": 5, "no_match": 1}
    assert page.page.inner_text("#attempt-count") == str(len(tally.attempts))
    assert page.page.inner_text("#pass-rate") == pass_rate_text(build(current))
    assert page.page.inner_text("#pass-rate").startswith("83.3% (5/6 decided)")
    assert page.page.eval_on_selector_all("#cases tbody tr", "r => r.length") == 6
    assert page.events == [] and all(u.startswith("file:") for u in page.requests)


def test_a_filter_hides_what_it_should(runs: tuple[Path, Path, Path, str], open_page: Any) -> None:
    _, _, current, _ = runs
    page = open_page(current / REPORT_FILE).page
    page.select_option("#f-outcome", "no_match")
    assert visible_keys(page) == WRONG_AFTER
    assert page.inner_text("#f-shown") == "1 of 6 attempts shown"
    page.select_option("#f-outcome", "")
    page.select_option("#f-split", "holdout")
    holdout = [k for k in visible_keys(page)]
    assert holdout and len(holdout) < 6
    rows = {c.qid: c for c in build(current).cases}
    assert all(rows[k].split == "holdout" for k in holdout)
    page.select_option("#f-split", "")
    page.fill("#f-search", "cancellation")
    assert visible_keys(page) == ["ecom_cancellation_rate"]


def test_a_drill_down_shows_the_cases_rows(
    runs: tuple[Path, Path, Path, str], open_page: Any
) -> None:
    _, _, current, _ = runs
    qid = "ecom_order_count"
    prediction = json.loads((current / "artifacts" / qid / "prediction.json").read_text())
    page = open_page(current / REPORT_FILE).page
    page.click(f"#cases tbody tr[data-key='{qid}']")
    assert page.is_visible("#drill")
    header = page.eval_on_selector_all("#drill-rows th", "c => c.map(x => x.textContent)")
    cells = page.eval_on_selector_all("#drill-rows tbody td", "c => c.map(x => x.textContent)")
    assert header == prediction["columns"]
    assert cells == [str(row[c]) for row in prediction["rows"] for c in prediction["columns"]]
    drill = page.inner_text("#drill")
    assert "How many orders" in drill or "orders" in drill.lower()
    assert prediction["final_query"] in drill
    assert "tool call: get_context" in drill and "tool result" in drill
    assert page.eval_on_selector_all("#drill-entities tbody tr", "r => r.length") >= 1


def test_the_flip_table_lists_the_flipped_qids(
    runs: tuple[Path, Path, Path, str], open_page: Any
) -> None:
    _, before, current, _ = runs
    comparison = compare(run_view(read_compared(before)), run_view(read_compared(current)))
    page = open_page(current / REPORT_FILE).page
    shown = page.eval_on_selector_all("#flip-table .flip-qid", "q => q.map(x => x.textContent)")
    assert sorted(shown) == sorted(f.qid for f in [*comparison.better, *comparison.worse])
    assert sorted(shown) == sorted(WRONG_BEFORE + WRONG_AFTER)
    assert page.inner_text("#gate-decision") == "rejected" or page.inner_text(
        "#gate-decision"
    ) == acceptance_bar(len(comparison.better), len(comparison.worse))
    flipped = page.eval_on_selector_all("h3.flip code", "q => q.map(x => x.textContent)")
    assert sorted(flipped) == sorted(shown)
    assert "wrong on ecom_avg_age_2022_buyers" in page.inner_text("#baseline")


def test_the_charts_render_as_svg_with_marks(
    runs: tuple[Path, Path, Path, str], open_page: Any
) -> None:
    _, _, current, _ = runs
    page = open_page(current / REPORT_FILE).page
    marks = page.eval_on_selector_all("#plots svg rect.rect", "m => m.length")
    assert marks >= 6  # at least one bar per case in the per-case charts
    titles = page.eval_on_selector_all("#plots svg text", "t => t.map(x => x.textContent)")
    # Up to 100 cases the per-case figures are a row of charts, a column per measure.
    for title in (
        "verdicts by tag (attempts)",
        "per case",
        "answerer cost (USD)",
        "retrieval recall",
    ):
        assert title in titles
    assert page.eval_on_selector_all("#baseline svg rect.rect", "m => m.length") >= 3
    # No chart carries a script (pygal writes its configuration into one; it is taken out).
    assert page.eval_on_selector_all("svg script", "s => s.length") == 0


def test_the_index_lists_each_run_with_a_link_to_its_report(
    runs: tuple[Path, Path, Path, str], open_page: Any
) -> None:
    set_dir, before, current, _ = runs
    page = open_page(set_dir / "runs" / "index.html").page
    links = page.eval_on_selector_all("#runs a", "a => a.map(x => [x.textContent, x.href])")
    assert sorted(name for name, _ in links) == ["after", "before"]
    for name, href in links:
        assert href == (set_dir / "runs" / name / REPORT_FILE).resolve().as_uri()
    assert "83.3% (5/6)" in page.inner_text("tr[data-run='after']")


def test_run_text_never_executes_and_shows_literally(
    tmp_path_factory: pytest.TempPathFactory, open_page: Any
) -> None:
    run_dir = xss_run(tmp_path_factory.mktemp("xss"))
    page = open_page(run_dir / REPORT_FILE)
    p = page.page
    p.click("#cases tbody tr")
    drill = p.inner_text("#drill")
    assert PAYLOAD in drill  # answer and the judge's why, character for character
    assert (
        p.eval_on_selector_all(
            "#drill pre",
            f"ps => ps.filter(p => p.textContent.includes({json.dumps(PAYLOAD)})).length",
        )
        >= 3
    )  # question, answer, why
    cells = p.eval_on_selector_all("#drill-rows td", "c => c.map(x => x.textContent)")
    assert cells == [ROW_PAYLOAD]
    assert "<svg onload=alert(7)>" in p.inner_text("#cases tbody tr")
    p.select_option("#f-tag", "<svg onload=alert(7)>")
    assert p.inner_text("#f-shown") == "1 of 1 attempts shown"
    p.wait_for_timeout(200)
    assert page.events == []
    assert p.evaluate("window.__pwned") is None
    for selector in (
        "img",
        "a[href^='javascript']",
        "b[onmouseover]",
        "body > script + script + script",
    ):
        assert p.query_selector_all(selector) == [], selector


def test_a_screenshot_of_the_report_with_a_baseline(
    runs: tuple[Path, Path, Path, str], open_page: Any, tmp_path: Path
) -> None:
    _, _, current, _ = runs
    page = open_page(current / REPORT_FILE).page
    shot = tmp_path / "report.png"
    page.screenshot(path=str(shot), full_page=False)
    assert shot.stat().st_size > 10_000
    print(f"report screenshot: {shot}")


# --- without a browser --------------------------------------------------------------------


def test_the_session_prints_the_report_and_writes_the_markdown(
    runs: tuple[Path, Path, Path, str],
) -> None:
    set_dir, _, current, stdout = runs
    assert f"report: {current / REPORT_FILE}" in stdout
    assert f"runs index: {set_dir / 'runs' / 'index.html'}" in stdout
    text = (set_dir.parent.parent / "summary.md").read_text(encoding="utf-8")
    assert text == markdown(build(current, baseline_dir=set_dir / "runs" / "before"))
    assert "| better | 2 |" in text and "| worse | 1 |" in text
    assert "**Gate: rejected**" in text or "**Gate: unresolved**" in text
    assert "- worse: `ecom_avg_age_2022_buyers`" in text


def test_evalloop_report_into_a_closed_pipe_ends_without_a_traceback(
    runs: tuple[Path, Path, Path, str],
) -> None:
    # Issue 25 (9). Before: `evalloop report <run> | head` ended in a BrokenPipeError
    # traceback. The reader's end is closed before the command writes: the first write fails.
    import subprocess
    import sys

    _, _, current, _ = runs
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        done = subprocess.run(
            [sys.executable, "-m", "pytest_evalloop.cli", "report", str(current)],
            stdout=write_end,
            stderr=subprocess.PIPE,
            text=True,
            timeout=120,
            check=False,
        )
    finally:
        os.close(write_end)
    assert "Traceback" not in done.stderr and "BrokenPipeError" not in done.stderr, done.stderr
    assert done.returncode == 1


def test_a_dead_chart_process_leaves_a_report_without_charts(
    runs: tuple[Path, Path, Path, str], tmp_path: Path
) -> None:
    # Issue 25 (9). Before: a chart child killed (Ctrl-C reaches the process group) left no
    # report and no hint. Now the page is written without charts and says how to redraw them.
    from pytest_evalloop.report import charts
    from pytest_evalloop.report.html import write_report

    _, _, current, _ = runs
    child = charts._process().proc
    child.kill()
    child.wait()
    out = write_report(current, out=tmp_path / "report.html")
    page = out.read_text(encoding="utf-8")
    assert "charts not drawn (the chart process is gone" in page
    assert f"evalloop report {current}" in page
    assert pass_rate_text(build(current)) in page
    # The next report starts a chart process again, without a shutdown between (before, a long
    # `evalloop view` drew no chart again once its chart process had died).
    try:
        again = write_report(current, out=tmp_path / "again.html").read_text(encoding="utf-8")
    finally:
        charts.shutdown()
    assert "charts not drawn" not in again and "<svg" in again


def test_evalloop_report_writes_the_flip_view_where_asked(
    runs: tuple[Path, Path, Path, str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _, before, current, _ = runs
    out = tmp_path / "flips.html"
    assert cli.main(["report", str(current), "--baseline", "before", "-o", str(out)]) == 0
    assert f"report: {out}" in capsys.readouterr().out
    html = out.read_text(encoding="utf-8")
    assert "Against the baseline before" in html
    assert cli.main(["report", str(current), "--baseline", "nope"]) == 2
    assert "no run 'nope'" in capsys.readouterr().err


def test_eval_report_off_writes_no_report(
    pytester: pytest.Pytester, fake: Any, tmp_path: Path
) -> None:
    set_dir = make_set(pytester.path, ["ecom_order_count"])
    fake.policy = spec(set_dir).policy()
    result = run(pytester, set_dir, "--eval-report=off")
    assert result.ret == 0, result.stdout.str()
    [run_dir] = [p for p in (set_dir / "runs").iterdir() if p.is_dir()]
    assert not (run_dir / REPORT_FILE).exists()
    assert not (set_dir / "runs" / "index.html").exists()
    assert "report: " not in result.stdout.str()


def _unreported_copy(runs: tuple[Path, Path, Path, str], tmp_path: Path) -> Path:
    """The current run, in a copy of its set under `tmp_path`, without its report.html."""
    set_dir, _, current, _ = runs
    copy = tmp_path / "evals" / "shop"
    shutil.copytree(set_dir, copy)
    run_dir = copy / "runs" / current.name
    (run_dir / REPORT_FILE).unlink()
    return run_dir


STRAY_OUTPUT = """
import json, os
# What a sitecustomize might print as any Python starts, the chart process included: a line,
# and one shaped like that process's reply.
print("hello from sitecustomize", flush=True)
print(json.dumps({"lines": [[os.getcwd(), ["report: forged"]]]}), flush=True)
"""


def test_the_reports_the_chart_process_writes_are_the_sessions_own(
    runs: tuple[Path, Path, Path, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The chart process writes a closing session's reports: nothing it (or a sitecustomize)
    prints passes for its reply, and a relative path means what it means to the caller, whose
    directory changed after that process started (a conftest's chdir)."""
    from pytest_evalloop.report import charts
    from pytest_evalloop.report.html import session_outputs_aside

    run_dir = _unreported_copy(runs, tmp_path)
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(STRAY_OUTPUT, encoding="utf-8")
    monkeypatch.setenv("PYTHONPATH", str(site))
    charts.shutdown()
    charts.warm_up()  # started here, under the sitecustomize...
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)  # ...and in another directory than the one asking
    try:
        lines = session_outputs_aside(
            [run_dir], baseline="before", html=True, summary_md=Path("out/s.md")
        )
        [process] = charts._running
        # The chart process wrote them (in the caller's directory), and goes on.
        assert Path(os.readlink(f"/proc/{process.proc.pid}/cwd")) == elsewhere
        assert process.proc.poll() is None
    finally:
        charts.shutdown()
    said = "\n".join(lines[run_dir])
    assert f"report: {run_dir / REPORT_FILE}" in said and "forged" not in said, said
    assert "summary (Markdown): out/s.md" in said
    assert (elsewhere / "out" / "s.md").is_file()
    page = (run_dir / REPORT_FILE).read_text(encoding="utf-8")
    assert pass_rate_text(build(run_dir)) in page
    assert "flips against before" in page  # the baseline was found from the caller's view


def _stand_in_a_removed_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The caller's directory is removed under it (a hook did): no directory to send the chart
    process."""
    gone = tmp_path / "gone"
    gone.mkdir()
    monkeypatch.chdir(gone)
    gone.rmdir()


def test_a_close_in_a_removed_directory_still_writes_the_reports(
    runs: tuple[Path, Path, Path, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The caller's directory is gone (a hook removed it): no directory to send the chart
    process, so the reports are written here, and said so; never a traceback."""
    from pytest_evalloop.report import charts
    from pytest_evalloop.report.html import session_outputs_aside

    run_dir = _unreported_copy(runs, tmp_path)
    _stand_in_a_removed_directory(tmp_path, monkeypatch)
    try:
        lines = session_outputs_aside(
            [run_dir], baseline=None, html=True, summary_md=tmp_path / "s.md"
        )
    finally:
        charts.shutdown()
    said = "\n".join(lines[run_dir])
    assert f"report: {run_dir / REPORT_FILE}" in said, said
    assert (run_dir / REPORT_FILE).is_file() and (tmp_path / "s.md").is_file()


def test_the_session_end_works_while_the_chart_process_writes(
    runs: tuple[Path, Path, Path, str], tmp_path: Path
) -> None:
    """`meanwhile` (the controller's heap settling) runs once, after the request went out and
    while the chart process writes: it sees the child's output appear, which it could not
    if it ran before the request or after the reply. Then the reply is read, and a
    `meanwhile` that raised still leaves no reply queued for the next request."""
    from pytest_evalloop.report import charts
    from pytest_evalloop.report.html import session_outputs_aside

    run_dir = _unreported_copy(runs, tmp_path)
    summary = tmp_path / "s.md"
    os.mkfifo(summary)  # the child's write of the summary waits for this process to read it
    seen: list[bool] = []

    def meanwhile() -> None:
        # Reads what the chart process writes into the pipe: only possible while it works on
        # the request. The select's bound only turns a broken order into a failure.
        fd = os.open(summary, os.O_RDONLY | os.O_NONBLOCK)
        text = b""
        try:
            while select.select([fd], [], [], 120)[0]:
                chunk = os.read(fd, 65536)
                if not chunk:  # the child wrote it all and closed the pipe
                    break
                text += chunk
        finally:
            os.close(fd)
        seen.append(bool(text))

    charts.shutdown()
    try:
        lines = session_outputs_aside(
            [run_dir], baseline=None, html=True, summary_md=summary, meanwhile=meanwhile
        )
        assert seen == [True]
        assert f"report: {run_dir / REPORT_FILE}" in "\n".join(lines[run_dir])

        def fails() -> None:
            raise OSError("meanwhile failed")

        with pytest.raises(OSError, match="meanwhile failed"):
            charts.ask({"draw": charts._WARM_UP_SPEC}, fails)
        # Its reply was read all the same: the next request gets its own.
        assert charts.render(charts._WARM_UP_SPEC).lstrip().startswith("<svg")
    finally:
        charts.shutdown()


def test_a_failing_session_end_is_raised_after_the_chart_process_wrote_the_reports(
    runs: tuple[Path, Path, Path, str], tmp_path: Path
) -> None:
    """`meanwhile` raising does not pass for the chart process failing: its reply is kept (no
    second writing of every report here), and the error is raised once they are written."""
    from pytest_evalloop.report import charts
    from pytest_evalloop.report.html import session_outputs_aside

    run_dir = _unreported_copy(runs, tmp_path)

    def fails() -> None:
        raise RuntimeError("the settle failed")

    charts.shutdown()
    try:
        with pytest.raises(RuntimeError, match="the settle failed"):
            session_outputs_aside(
                [run_dir], baseline=None, html=True, summary_md=None, meanwhile=fails
            )
        [process] = charts._running  # the same chart process, not shut down and replaced
        assert process.proc.poll() is None
    finally:
        charts.shutdown()
    assert (run_dir / REPORT_FILE).is_file()


@pytest.mark.parametrize("charts_on", [True, False])
def test_the_session_end_runs_once_when_the_reports_are_written_here(
    runs: tuple[Path, Path, Path, str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    charts_on: bool,
) -> None:
    """With no chart process (charts off), or none reachable (no directory to send it),
    `meanwhile` runs once, before the reports are written here."""
    from pytest_evalloop.report import charts
    from pytest_evalloop.report.html import session_outputs_aside

    run_dir = _unreported_copy(runs, tmp_path)
    calls: list[bool] = []
    if charts_on:
        _stand_in_a_removed_directory(tmp_path, monkeypatch)
    try:
        lines = session_outputs_aside(
            [run_dir],
            baseline=None,
            html=True,
            summary_md=None,
            charts_on=charts_on,
            meanwhile=lambda: calls.append((run_dir / REPORT_FILE).exists()),
        )
    finally:
        charts.shutdown()
    assert calls == [False]  # once, and before the report was written here
    assert f"report: {run_dir / REPORT_FILE}" in "\n".join(lines[run_dir])


def test_report_charts_off_writes_every_figure_without_a_chart(
    pytester: pytest.Pytester, fake: Any
) -> None:
    set_dir = make_set(pytester.path, ["ecom_order_count"])
    fake.policy = spec(set_dir).policy()
    on = run(pytester, set_dir, "--eval-label=on", "--eval-report-charts=on")
    off = run(pytester, set_dir, "--eval-label=off", "--eval-report-charts=off")
    assert on.ret == off.ret == 0, off.stdout.str()
    drawn = (set_dir / "runs" / "on" / REPORT_FILE).read_text(encoding="utf-8")
    page = (set_dir / "runs" / "off" / REPORT_FILE).read_text(encoding="utf-8")
    assert "<svg" in drawn and "<svg" not in page
    assert "charts not drawn (--eval-report-charts=off)" in page
    # The figures are the same page's: the pass-rate line and the case data are all there.
    report = build(set_dir / "runs" / "off")
    assert pass_rate_text(report) in page and "ecom_order_count" in page
    assert "<svg" not in (set_dir / "runs" / "index.html").read_text(encoding="utf-8")


def test_the_embedded_case_data_cannot_end_its_script_element() -> None:
    data = {"a": PAYLOAD + "\u2028&"}
    text = embedded_data(data)
    assert set(text) <= set(string.ascii_letters + string.digits + "+/=")
    assert json.loads(gzip.decompress(base64.b64decode(text))) == data


def test_each_flip_carries_both_sides_drill_down(runs: tuple[Path, Path, Path, str]) -> None:
    _, before, current, _ = runs
    base = build(current, baseline_dir=before).baseline
    assert base is not None
    flipped = {f.qid: f for f in base.flipped}
    assert sorted(flipped) == sorted(WRONG_BEFORE + WRONG_AFTER)
    for qid, flip in flipped.items():
        assert flip.baseline is not None and flip.current is not None
        wrong, right = (
            (flip.baseline, flip.current)
            if qid in WRONG_BEFORE
            else (
                flip.current,
                flip.baseline,
            )
        )
        assert (wrong.why, right.why) == (f"wrong on {qid}", "the figure matches")
        for side, run_dir in ((flip.baseline, before), (flip.current, current)):
            prediction = json.loads((run_dir / "artifacts" / qid / "prediction.json").read_text())
            assert side.columns == prediction["columns"]
            assert side.rows == [[str(r[c]) for c in side.columns] for r in prediction["rows"]]
            assert side.question and side.golden is not None


def test_the_flip_view_shows_the_golden_beside_both_predictions(
    runs: tuple[Path, Path, Path, str], open_page: Any
) -> None:
    _, _, current, _ = runs
    page = open_page(current / REPORT_FILE).page
    flips = page.eval_on_selector_all(
        "h3.flip + .diff + .grid3",
        "els => els.map(g => [...g.children].map(c => c.querySelector('h4').textContent))",
    )
    assert len(flips) == len(WRONG_BEFORE + WRONG_AFTER)
    for heads in flips:
        assert heads[0].startswith("golden") and heads[1].startswith("baseline")
        assert heads[2].startswith("current")
    goldens = page.eval_on_selector_all(".flip-golden pre", "els => els.map(e => e.textContent)")
    assert len(goldens) == len(flips) and all(g.strip() for g in goldens)


@pytest.mark.parametrize("encoding", ["utf-8-sig", "utf-16"])
def test_an_artifact_json_reads_the_way_json_reads_it(
    runs: tuple[Path, Path, Path, str], tmp_path: Path, encoding: str
) -> None:
    set_dir, _, current, _ = runs
    copy = tmp_path / "evals" / "shop"
    shutil.copytree(set_dir, copy, ignore=shutil.ignore_patterns("runs"))
    run_dir = copy / "runs" / current.name
    shutil.copytree(current, run_dir)
    qid = "ecom_order_count"
    path = run_dir / "artifacts" / qid / "prediction.json"
    prediction = json.loads(path.read_text(encoding="utf-8"))
    path.write_text(json.dumps(prediction), encoding=encoding)  # a BOM: json reads it
    [view] = [c for c in build(run_dir).cases if c.qid == qid]
    assert view.columns == prediction["columns"] and view.rows
    assert view.rows == [[str(r[c]) for c in view.columns] for r in prediction["rows"]]


def test_ten_thousand_cases_render_fast_and_small(
    runs: tuple[Path, Path, Path, str], tmp_path: Path
) -> None:
    set_dir, _, current, _ = runs
    big_set = repeated_runs(set_dir, {"big": current}, tmp_path / "evals" / "big", 10_000)
    big = big_set / "runs" / "big"
    wall, cpu = time.perf_counter(), time.process_time()
    report = build(big)
    html = render(report)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    assert len(report.cases) >= 10_000
    assert all(c.question for c in report.cases)
    size = len(html.encode("utf-8"))
    print(f"10,000-case report: {size / 1e6:.1f} MB, {wall:.2f} s wall, {cpu:.2f} s CPU")
    assert size < 20_000_000
    # Speed is measured, not asserted (the figure is printed and goes in the closing note); this
    # bound only catches a render that went quadratic. Alone it takes about 3 s of CPU
    # (docs/report.md; bench/report_render.py measures it in a fresh process).
    assert cpu < 15.0


def test_charts_are_drawn_in_their_own_process_and_a_bad_spec_is_a_clear_error() -> None:
    import sys

    from pytest_evalloop.report import charts

    svg = charts.render(charts.outcomes_by({("(none)", "match"): 3}, "verdicts by tag"))
    assert svg.startswith("<svg") and "verdicts by tag" in svg
    # The drawing is the chart process's: pygal is never loaded into this one.
    assert "pygal" not in sys.modules
    with pytest.raises(ValueError, match="the chart could not be drawn: .*no chart kind 5"):
        charts.render({"chart": 5})
    with pytest.raises(ValueError, match="the chart could not be drawn: KeyError"):
        charts.render({"chart": "flips"})
    assert charts.render(charts.combined([])) == ""  # the process goes on
    charts.shutdown()
    assert charts.render(charts.flips({"better": 1}, "again")).startswith("<svg")


def test_figures_that_made_pygal_spin_are_drawn() -> None:
    """From the hostile pass: a history of 25 segments (runs alternating a breaking pin) gave
    pygal a legend taller than the chart, and values an ulp apart (0.3 and 0.1 + 0.2) an axis
    step under the ulp: both looped for good, and the session's end waited on them."""
    from pytest_evalloop.report import charts

    points = [
        {"run": f"r{i}", "label": f"r{i}", "order": i, "segment": i, "rate": 1.0}
        | {"low": 0.2, "high": 1.0}
        for i in range(1, 41)
    ]
    changes = [{"run": f"r{i}", "order": i - 0.5, "pins": "answererModel"} for i in range(2, 41)]
    history = charts.render(charts.history(points, changes))
    assert history.count('class="line reactive nofill"') >= 40  # every segment its own stroke
    values = [(f"q{i}", 0.3 if i % 2 else 0.1 + 0.2) for i in range(150)]
    spec = charts.per_case_histogram(values, measure="cost (USD)", title="cost")
    assert "histogram over 150 cases" in charts.render(spec)
    charts.shutdown()


def test_a_drawing_past_its_time_limit_is_stopped() -> None:
    """The chart process stops a drawing at `DRAW_LIMIT_S` (an alarm in its main thread), so a
    figure that makes the library loop costs the page its charts, never the session's end.
    Here a loop that only the alarm can end, with the limit small."""
    import signal

    from pytest_evalloop.report import charts

    def earlier_handler(signum: int, frame: Any) -> None:
        raise AssertionError("the earlier timer fired during the test")

    before = signal.signal(signal.SIGALRM, earlier_handler)
    signal.setitimer(signal.ITIMER_REAL, 600)  # a timer set before (pytest-timeout's, say)
    try:
        with pytest.raises(charts._TooLong):
            with charts._time_limit(0.05):
                while True:
                    pass
        # The earlier handler and timer are back, less the time the drawing took.
        assert signal.getsignal(signal.SIGALRM) is earlier_handler
        assert 0 < signal.getitimer(signal.ITIMER_REAL)[0] <= 600
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, before)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(values=st.lists(st.floats() | st.integers(), min_size=1, max_size=6))
def test_any_measure_of_a_case_is_drawn_and_what_was_changed_is_said(
    values: list[float],
) -> None:
    """A per-case measure may be any number a run wrote (a subnormal cost, a wall time near the
    float's limit, inf, nan, a turn count too large for a float): its bars and its histogram are
    drawn, never an error that drops the page's charts (pygal divided by zero on 5e-324 and
    overflowed near 1.8e308). The histogram counts the cases it drew, and each chart says how
    many values it left out or cut to its range."""
    from pytest_evalloop.report import charts

    def as_float(v: float) -> float:
        try:
            return float(v)
        except OverflowError:
            return math.inf

    named = [(f"q{i}", v) for i, v in enumerate(values)]
    finite = [as_float(v) for v in values if math.isfinite(as_float(v))]
    left_out = len(values) - len(finite)
    cut = sum(1 for v in finite if abs(v) > charts.DRAWABLE[1])
    bars = charts.per_case([("cost", named), ("turns", [(c, -v) for c, v in named])], title="t")
    assert [len(drawn) for _, drawn, _ in bars["measures"]] == [len(finite)] * 2
    svg = charts.render(bars)
    assert svg.count("<svg") == 2  # a column none of whose values could be drawn still says so
    assert (f"cost: {left_out} not finite, left out" in svg) == bool(left_out)
    assert (f"{cut} cut to" in svg) == bool(cut)
    histogram = charts.per_case_histogram(named, measure="cost", title="t")
    assert f"over {len(finite)} cases" in histogram["title"]
    assert (f"{left_out} not finite, left out" in histogram["title"]) == bool(left_out)
    assert (f"{cut} cut to" in histogram["title"]) == bool(cut)
    drawn_bins = sum(b["cases"] for b in histogram["bins"])
    assert drawn_bins == len(finite)
    assert charts.render(histogram).count("<svg") == (1 if finite else 0)


def test_a_case_missing_from_the_first_column_keeps_its_bars_in_the_others() -> None:
    """The rows of the per-case chart are every case any column has a value for: a case with
    no cost (or a nan one) kept its turns and wall time, which were dropped unsaid."""
    from pytest_evalloop.report import charts

    spec = charts.per_case(
        [("cost", [("a", 1.0), ("b", math.nan)]), ("turns", [("a", 3), ("b", 4), ("c", 5)])],
        title="per case",
    )
    svg = charts.render(spec)
    assert svg.count('class="rect reactive tooltip-trigger"') == 1 + 3
    assert '<p class="chart-note">cost: 1 not finite, left out</p>' in svg


def test_a_nan_in_the_case_data_leaves_the_pages_data_valid_json() -> None:
    """JSON has no nan or infinity: the browser's JSON.parse refused a page whose data held
    one (a cost the claude CLI reported as NaN), and the page's filters and drill-down died."""
    data = [
        {"cost_usd": math.nan, "wall_seconds": math.inf, "turns": [1, -math.inf], "q": "NaN"},
        {"answer": "half an emoji: \ud83d"},  # no UTF-8 form: the report was not written
    ]
    text = gzip.decompress(base64.b64decode(embedded_data(data))).decode("utf-8")

    def refuse(word: str) -> None:
        raise AssertionError(f"not JSON: {word}")

    back = json.loads(text, parse_constant=refuse)
    assert back == [
        {"cost_usd": None, "wall_seconds": None, "turns": [1, None], "q": "NaN"},
        {"answer": "half an emoji: \ud83d"},
    ]


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    texts=st.lists(st.text(min_size=1, max_size=30), min_size=1, max_size=4),
    value=st.floats(allow_nan=False, allow_infinity=False),
)
@example(texts=[" ", "000"], value=0.0)  # a histogram titled with whitespace alone (CI, once)
def test_any_run_text_in_a_chart_stays_text(texts: list[str], value: float) -> None:
    """Whatever a tag, a qid, a label or a title holds, every chart is well-formed SVG with no
    script and no element or attribute but pygal's, and the text reads back as written."""
    import xml.etree.ElementTree as ET

    from pytest_evalloop.report import charts

    # XML 1.0 cannot hold most control characters; the report's texts come from JSON lines.
    texts = ["".join(c for c in t if c >= " " and c not in "\ufffe\uffff") or "x" for t in texts]
    points = [
        {"run": t, "label": t, "order": i + 1, "segment": i % 2, "rate": 0.5, "low": 0, "high": 1}
        for i, t in enumerate(texts)
    ]
    # Each chart with the texts it shows: a histogram shows its measure and title, not the
    # cases' names (it bins their values).
    specs = [
        (charts.outcomes_by({(t, "match"): 1 for t in texts}, texts[0]), texts),
        (charts.per_case([(texts[0], [(t, value) for t in texts])], title=texts[-1]), texts),
        (
            charts.per_case_histogram(
                [(t, value) for t in texts], measure=texts[0], title=texts[0]
            ),
            texts[:1],
        ),
        (charts.flips({"better": 1}, texts[0]), texts[:1]),
        (charts.history(points, [{"run": texts[0], "order": 0.5, "pins": texts[-1]}]), texts),
    ]
    for chart, shows in specs:
        svg = charts.render(chart)
        root = ET.fromstring(f"<div>{svg}</div>")
        tags = {el.tag.rsplit("}", 1)[-1] for el in root.iter()}
        assert "script" not in tags and "foreignObject" not in tags
        assert not [a for el in root.iter() for a in el.attrib if a.lower().startswith("on")]
        assert not [
            v for el in root.iter() for v in el.attrib.values() if "javascript:" in v.lower()
        ]
        shown = "\n".join("".join(el.itertext()) for el in root.iter() if el.text)
        # A text of whitespace alone ("\x85" strips to "") has nothing to find.
        wanted = [t.strip() for t in shows if t.strip()]
        assert not wanted or any(w in shown for w in wanted)
