"""`evalloop view` in Debian's headless chromium: reviewing in the browser, and what it refuses."""

from __future__ import annotations

import json
import os
import shutil
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from pytest_evalloop.ledger import contract as ledger
from pytest_evalloop.review.view import (
    TOKEN_HEADER,
    ViewError,
    bind,
    loopback_only,
    make_app,
    view_main,
)
from pytest_evalloop.sets import cases as sets
from tests.reportruns import PAYLOAD, xss_run
from tests.reviewruns import DOUBTED, MATCHED, review_run
from tests.test_report import CHROMIUM, CHROMIUM_ARGS

SHOTS = os.environ.get("EVALLOOP_SCREENSHOTS")
"""Where to leave the review panel's screenshot (a directory), when set."""


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        executable = str(CHROMIUM) if CHROMIUM.is_file() else p.chromium.executable_path
        if not Path(executable).is_file():
            pytest.skip(f"no chromium ({CHROMIUM} or Playwright's): make real-components")
        chromium = p.chromium.launch(executable_path=executable, args=CHROMIUM_ARGS)
        yield chromium
        chromium.close()


class Served:
    """`make_app` on uvicorn in a thread, on a socket bound before it starts (so a request
    made at once waits in the listen queue: no polling for readiness)."""

    def __init__(self, runs_dir: Path, reviewer: str = "Rita Reviewer") -> None:
        import uvicorn

        self.sock = bind("127.0.0.1", 0)
        self.port = self.sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.app = make_app(runs_dir, reviewer=reviewer, port=self.port)
        config = uvicorn.Config(self.app, log_level="warning")
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]})
        self.thread.start()

    def post(
        self,
        path: str,
        body: Any,
        ctype: str = "application/json",
        headers: dict[str, str] | None = None,
    ) -> tuple[int, Any]:
        """POST as the server's own page would (its token), unless `headers` say otherwise."""
        data = json.dumps(body).encode() if not isinstance(body, bytes) else body
        sent = {"Content-Type": ctype, TOKEN_HEADER: self.app.state.token, **(headers or {})}
        req = urllib.request.Request(self.url + path, data=data, headers=sent)
        return self._send(req)

    def get(self, path: str, headers: dict[str, str] | None = None) -> tuple[int, Any]:
        return self._send(urllib.request.Request(self.url + path, headers=headers or {}))

    @staticmethod
    def _send(req: urllib.request.Request) -> tuple[int, Any]:
        try:
            with urllib.request.urlopen(req, timeout=60) as resp:
                body = resp.read().decode()
                ctype = resp.headers.get("content-type", "")
                return resp.status, json.loads(body) if "json" in ctype else body
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read().decode()

    def close(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=60)
        self.sock.close()


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[Served, Path]]:
    run_dir = review_run(tmp_path)
    server = Served(run_dir.parent)
    yield server, run_dir
    server.close()


def _page(browser: Any) -> tuple[Any, list[str]]:
    events: list[str] = []
    page = browser.new_page(viewport={"width": 1250, "height": 1400})
    page.on("dialog", lambda d: (events.append(f"dialog: {d.message}"), d.dismiss()))
    page.on("pageerror", lambda e: events.append(f"pageerror: {e}"))
    return page, events


def _drill(page: Any, qid: str) -> None:
    page.wait_for_selector("body[data-ready='1']")
    page.click(f"#cases tbody tr[data-key='{qid}']")
    page.wait_for_selector("#review-panel[data-ready='1']")


def _review(page: Any, verdict: str, why: str) -> str:
    page.click(f"#review-buttons button[data-verdict='{verdict}']")
    page.fill("#review-why", why)
    page.click("#review-send")
    page.wait_for_selector("#review-status[data-done]")
    return str(page.text_content("#review-status"))


def test_settle_and_overrule_in_the_browser(browser: Any, served: tuple[Served, Path]) -> None:
    server, run_dir = served
    page, events = _page(browser)
    page.goto(server.url + "/")
    page.click("#runs a")
    _drill(page, DOUBTED)
    assert "recorded" in _review(page, "match", "the rows agree with the golden")
    _drill(page, MATCHED)
    assert "recorded" in _review(page, "no_match", "wrong year")
    if SHOTS:
        page.locator("#drill").screenshot(path=str(Path(SHOTS) / "review-panel.png"))
    # The ledger, the regressions file and the counts follow point 3's rule.
    kinds = [json.loads(x)["kind"] for x in (run_dir / ledger.EVENTS_FILE).read_text().splitlines()]
    assert kinds.count("review") == 2 and kinds.count("score") == 3
    fixtures = [r for _, r in sets.load_regressions(run_dir.parent.parent).rows]
    assert {(f.qid, f.verdict, f.settled_by) for f in fixtures} == {
        (DOUBTED, "match", "Rita Reviewer"),
        (MATCHED, "no_match", "Rita Reviewer"),
    }
    totals = json.loads((run_dir / ledger.RUN_FILE).read_text())["totals"]
    assert (totals["passed"], totals["decided"], totals["humanSettled"]) == (1, 3, 2)
    page.reload()
    assert "settled by people: 2" in page.text_content("#human-settled")
    assert "(1/3 decided)" in page.text_content("#pass-rate")
    _drill(page, DOUBTED)
    assert "match by Rita Reviewer" in page.text_content("#review-list")
    assert events == []
    page.close()


def test_a_review_of_no_verdict_without_a_why_is_refused_in_the_page(
    browser: Any, served: tuple[Served, Path]
) -> None:
    server, run_dir = served
    before = (run_dir / ledger.EVENTS_FILE).read_bytes()
    page, _ = _page(browser)
    page.goto(server.url + f"/runs/{run_dir.name}/")
    _drill(page, DOUBTED)
    page.click("#review-buttons button[data-verdict='match']")
    page.click("#review-send")
    assert "needs a why" in page.text_content("#review-status")
    assert (run_dir / ledger.EVENTS_FILE).read_bytes() == before
    page.close()


def test_run_text_stays_inert_in_the_review_panel(browser: Any, tmp_path: Path) -> None:
    run_dir = xss_run(tmp_path)
    server = Served(run_dir.parent, reviewer=PAYLOAD)
    try:
        [qid] = {
            json.loads(x)["qid"]
            for x in (run_dir / ledger.EVENTS_FILE).read_text().splitlines()
            if '"qid"' in x
        }
        status, _ = server.post(
            f"/api/runs/{run_dir.name}/reviews",
            {"qid": qid, "sample": None, "verdict": "match", "why": PAYLOAD, "reviewer": PAYLOAD},
        )
        assert status == 200
        page, events = _page(browser)
        page.goto(server.url + f"/runs/{run_dir.name}/")
        _drill(page, qid)
        assert PAYLOAD in page.text_content("#review-list")
        assert page.input_value("#review-by") == PAYLOAD
        assert page.evaluate("window.__pwned") is None
        assert not [e for e in events if e.startswith("dialog")], events
        page.close()
    finally:
        server.close()


def test_loopback_only_and_no_write_outside_the_runs_dir(
    served: tuple[Served, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    server, run_dir = served
    for host in ("0.0.0.0", "192.168.1.5", "example.org"):
        with pytest.raises(ViewError, match="loopback"):
            loopback_only(host)
    assert view_main([str(run_dir.parent), "--host", "0.0.0.0", "--port", "0"]) == 2
    assert "not a loopback address" in capsys.readouterr().err
    assert server.sock.getsockname()[0] == "127.0.0.1"
    # A run outside the served directory, reached through a planted symlink or `..`.
    outside = tmp_path / "elsewhere"
    shutil.copytree(run_dir, outside)
    (run_dir.parent / "planted").symlink_to(outside)
    before = (outside / ledger.EVENTS_FILE).read_bytes()
    body = {"qid": DOUBTED, "sample": None, "verdict": "match", "why": "x", "reviewer": "M"}
    for name in ("planted", "%2e%2e", "..%2Felsewhere"):
        status, _ = server.post(f"/api/runs/{name}/reviews", body)
        assert status == 404, name
    assert (outside / ledger.EVENTS_FILE).read_bytes() == before
    # A form post (what a cross-site page could send) is refused before anything is read.
    status, _ = server.post(f"/api/runs/{run_dir.name}/reviews", b"qid=x", "text/plain")
    assert status == 415


def test_the_drill_down_prints_shares_and_json_results_for_reading(
    browser: Any, served: tuple[Served, Path]
) -> None:
    server, run_dir = served
    page, _ = _page(browser)
    page.goto(server.url + f"/runs/{run_dir.name}/")
    _drill(page, DOUBTED)
    results = page.eval_on_selector_all(
        "#drill .step-result pre", "els => els.map(e => e.textContent)"
    )
    assert results
    for text in results:
        try:
            parsed = json.loads(text)
        except json.JSONDecodeError:
            continue
        if isinstance(parsed, dict | list) and parsed:
            assert text == json.dumps(parsed, indent=2, ensure_ascii=False), text[:200]
    # Past the fold length a result sits behind a <details> naming its size.
    for summary in page.eval_on_selector_all(
        "#drill details.fold summary", "els => els.map(e => e.textContent)"
    ):
        assert int(summary.split("(")[1].split()[0]) > 1200
    shares = page.eval_on_selector_all("#drill dl.kv dd", "els => els.map(e => e.textContent)")
    assert not [s for s in shares if "." in s and s.replace(".", "").isdigit() and len(s) > 4]
    page.close()


def test_the_report_shows_the_last_recorded_agreement(tmp_path: Path) -> None:
    from pytest_evalloop.measure import agreement
    from pytest_evalloop.report.report import build
    from pytest_evalloop.report.summary_md import markdown

    run_dir = review_run(tmp_path)
    pairs = (("match", "match"), ("no_match", "no_match"), ("match", "no_match"))
    found = agreement.Agreement(pairs)
    pins = {"judgeModel": "m", "judgeVersion": "3", "rubricSha": "s"}
    agreement.append_record(run_dir.parent.parent, found.record(pins, "2026-12-02T06:00:00Z"))
    report = build(run_dir)
    assert report.agreement[0].startswith(f"judge vs people: Cohen's kappa {found.kappa:.2f}")
    assert "under 30 fixtures" in report.agreement[1]
    assert report.agreement[0] in markdown(report).replace("\\", "")


def test_the_index_draws_the_history_marks_pin_changes_and_links_comparisons(
    browser: Any, tmp_path: Path
) -> None:
    from pytest_evalloop.testing import FakeAnthropic
    from tests.reportruns import judge_spec, run_pytest

    run_dir = review_run(tmp_path)
    set_dir = run_dir.parent.parent
    with FakeAnthropic() as fake:
        fake.policy = judge_spec(set_dir, []).policy()
        done = run_pytest(fake, set_dir, "--eval-label=r2")
        assert (set_dir / "runs" / "r2" / "run.json").is_file(), done.stdout
        done = run_pytest(fake, set_dir, "--eval-label=r3", "--eval-judge-model=claude-other")
        assert (set_dir / "runs" / "r3" / "run.json").is_file(), done.stdout
    server = Served(set_dir / "runs")
    try:
        page, events = _page(browser)
        page.goto(server.url + "/")
        assert page.locator("#history svg").count() == 1
        # Three runs, three points; r3 changed the judge, so it compares with nothing before it.
        cells = {
            row.get_attribute("data-run"): row.locator("td.compare").text_content()
            for row in page.locator("#runs tbody tr").all()
        }
        assert "vs r1" in cells["r2"]
        assert "breaking pins changed: judgeModel" in cells["r3"] and "vs" not in cells["r3"]
        assert "judgeModel" in page.text_content("#history svg")
        page.click("#runs tr[data-run='r2'] a.compare-link")
        page.wait_for_selector("body[data-ready='1']")
        assert page.locator("#flip-table").count() == 1
        assert events == []
        page.close()
    finally:
        server.close()
    static = (set_dir / "runs" / "index.html").read_text()
    r2 = (set_dir / "runs" / "r2").resolve()
    assert f"evalloop report {r2} --baseline r1" in static and "<svg" in static


def test_a_run_the_reader_refuses_is_shown_as_refused_not_a_server_error(
    served: tuple[Served, Path],
) -> None:
    # Found by the hostile pass: a ledger file that is a pipe gave a bare 500 and a traceback.
    server, run_dir = served
    refused = run_dir.parent / "refused-run"
    shutil.copytree(run_dir, refused)
    (refused / ledger.EVENTS_FILE).unlink()
    os.mkfifo(refused / ledger.EVENTS_FILE)
    with pytest.raises(urllib.error.HTTPError) as caught:
        urllib.request.urlopen(f"{server.url}/runs/refused-run/", timeout=30)
    assert caught.value.code == 409
    assert "named pipe" in caught.value.read().decode()
    shutil.rmtree(refused)
