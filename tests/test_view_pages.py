"""`evalloop view` as a person uses it and as a hostile page meets it (issue 44): the review
flow in Chromium, the comparison picker, the history with a narrowed run and a pin break, and
the rebinding request refused with nothing written."""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from pytest_evalloop.ledger import contract as ledger
from pytest_evalloop.review.view import TOKEN_HEADER, Guard
from pytest_evalloop.sets import cases as sets
from tests import test_view
from tests.reviewruns import DOUBTED, MATCHED, UNANSWERED, review_run
from tests.test_view import Served, _drill, _page, _review

browser = test_view.browser
"""One headless chromium per module, as test_view.py launches it."""

SHOTS = os.environ.get("EVALLOOP_SCREENSHOTS")
"""Where to leave the screenshots (docs/img when the docs are refreshed), when set."""


def _shot(locator: Any, name: str) -> None:
    if SHOTS:
        locator.screenshot(path=str(Path(SHOTS) / name))


def _written(run_dir: Path) -> tuple[bytes, bytes | None, bytes]:
    set_dir = run_dir.parent.parent
    regressions = set_dir / sets.REGRESSIONS_FILE
    return (
        (run_dir / ledger.EVENTS_FILE).read_bytes(),
        regressions.read_bytes() if regressions.exists() else None,
        (set_dir / sets.CASES_FILE).read_bytes(),
    )


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[Served, Path]]:
    run_dir = review_run(tmp_path, unanswered=True)
    server = Served(run_dir.parent)
    yield server, run_dir
    server.close()


def test_the_rebinding_request_gets_403_and_writes_nothing(served: tuple[Served, Path]) -> None:
    server, run_dir = served
    before = _written(run_dir)
    body = {"qid": MATCHED, "sample": None, "verdict": "no_match", "why": "x", "reviewer": "M"}
    api = f"/api/runs/{run_dir.name}/reviews"
    evil = {"Host": f"evil.example:{server.port}", "Origin": f"http://evil.example:{server.port}"}
    # Issue 44, repro 5: a page whose name was rebound to 127.0.0.1 (even holding the token).
    status, said = server.post(api, body, headers=evil)
    assert status == 403 and "evil.example" in said
    # Nor can it read a page to learn the token: every request names this server.
    status, _ = server.get("/", headers=evil)
    assert status == 403
    status, _ = server.get(f"/runs/{run_dir.name}/", headers={"Host": "evil.example"})
    assert status == 403
    # The right Host, but another site's Origin; the right Host and Origin, but no token.
    status, _ = server.post(api, body, headers={"Origin": "http://evil.example"})
    assert status == 403
    status, said = server.post(api, body, headers={TOKEN_HEADER: "guessed"})
    assert status == 403 and TOKEN_HEADER in said
    # Another port of loopback is another origin.
    status, _ = server.post(api, body, headers={"Host": "127.0.0.1:1"})
    assert status == 403
    assert _written(run_dir) == before
    # The page this server serves holds the token; with it (and its own Host) a write lands.
    status, page = server.get(f"/runs/{run_dir.name}/")
    assert status == 200 and f'data-review-token="{server.app.state.token}"' in page
    assert "data-review-token" not in (run_dir / "report.html").read_text()
    status, _ = server.post(api, body, headers={"Origin": server.url})
    assert status == 200 and _written(run_dir) != before


@pytest.mark.parametrize(
    ("netloc", "ours"),
    [
        ("127.0.0.1:8791", True),
        ("localhost:8791", True),
        ("LOCALHOST:8791", True),
        ("[::1]:8791", True),
        ("127.0.0.1", False),
        ("127.0.0.1:8792", False),
        ("evil.example:8791", False),
        ("127.0.0.1.evil.example:8791", False),
        ("[::1]x:8791", False),
        ("", False),
    ],
)
def test_which_hosts_name_the_server(netloc: str, ours: bool) -> None:
    guard = Guard(None, hosts=frozenset({"localhost", "127.0.0.1", "::1"}), port=8791, token="t")
    assert guard.ours(netloc) is ours


def test_the_review_flow_in_the_browser(browser: Any, served: tuple[Served, Path]) -> None:
    server, run_dir = served
    page, events = _page(browser)
    page.goto(server.url + f"/runs/{run_dir.name}/")
    # The headline comes first; the pins are folded below it.
    order = page.eval_on_selector_all(
        "#headline, #summary, #pins-fold", "els => els.map(e => e.id)"
    )
    assert order == ["headline", "summary", "pins-fold"]
    assert page.locator("#pins").is_visible() is False
    assert page.get_attribute("#link-index", "href") == "/"
    _drill(page, MATCHED)
    assert "recorded" in _review(page, "no_match", "the year is 2021, not 2022")
    # Cleared: no verdict chosen, no why left to send twice; the badge moved without a reload.
    assert page.input_value("#review-why") == ""
    assert page.locator("#review-buttons button.chosen").count() == 0
    row = page.locator(f"#cases tbody tr[data-key='{MATCHED}']")
    assert row.locator(".pill").first.text_content() == "no_match"
    assert "no_match" in (page.text_content("#drill h2 .pill") or "")
    # A second person rules otherwise: people disagree, shown at once, until one more review.
    page.fill("#review-by", "Bo Second")
    status = _review(page, "match", "the judge read the golden right")
    assert "people disagree" in status
    assert row.locator(".pill").first.text_content() == "needs_human"
    assert row.locator(".people-disagree").count() == 1
    judge_line = page.text_content("#review-judge") or ""
    assert judge_line.startswith("judge: match (people disagree: ")
    _shot(page.locator("#review-panel"), "review-people-disagree.png")
    page.fill("#review-by", "Cy Third")
    _review(page, "match", "agree with Bo: the golden counts 2022")
    assert row.locator(".pill").first.text_content() == "match"
    assert row.locator(".people-disagree").count() == 0
    # An attempt no person may review shows why, and no form to be refused on submit.
    page.click(f"#cases tbody tr[data-key='{UNANSWERED}']")
    page.wait_for_selector("#review-panel[data-ready='1']")
    assert page.locator("#review-buttons").count() == 0
    hidden = page.text_content("#review-hidden") or ""
    assert "cannot be reviewed" in hidden and "nothing to score" in hidden
    assert "None" not in hidden
    _shot(page.locator("#review-panel"), "review-hidden.png")
    page.reload()
    page.wait_for_selector("body[data-ready='1']")
    _shot(page.locator("#headline"), "report-headline.png")
    assert "settled by people: 1" in (page.text_content("#human-settled") or "")
    fixtures = [f for _, f in sets.load_regressions(run_dir.parent.parent).rows]
    assert [(f.qid, f.verdict, f.people_disagree) for f in fixtures] == [(MATCHED, "match", False)]
    assert events == []
    page.close()


def _runs(tmp_path: Path) -> Path:
    """r1 whole, r2 narrowed (-k), r3 whole, r4 under another judge model (a pin break)."""
    from pytest_evalloop.testing import FakeAnthropic
    from tests.reportruns import judge_spec, run_pytest

    run_dir = review_run(tmp_path)
    set_dir = run_dir.parent.parent
    with FakeAnthropic() as fake:
        fake.policy = judge_spec(set_dir, []).policy()
        for label, *extra in (
            ("r2", "-k", DOUBTED),
            ("r3",),
            ("r4", "--eval-judge-model=claude-other"),
        ):
            done = run_pytest(fake, set_dir, f"--eval-label={label}", *extra)
            assert (set_dir / "runs" / label / "run.json").is_file(), done.stdout
    return set_dir / "runs"


def test_the_history_and_the_comparison_picker(browser: Any, tmp_path: Path) -> None:
    runs_dir = _runs(tmp_path)
    server = Served(runs_dir)
    try:
        page, events = _page(browser)
        page.goto(server.url + "/")
        rows = {r.get_attribute("data-run"): r for r in page.locator("#runs tbody tr").all()}
        # The table counts cases and decided per run; the narrowed run carries its mark.
        assert rows["r2"].locator("td.cases").text_content() == "1 of 3"
        assert rows["r1"].locator("td.cases").text_content() == "3 of 3"
        assert rows["r1"].locator("td.decided").text_content() == "2"  # and one needs_human
        assert "not comparable: whole" in (rows["r2"].text_content() or "")
        # r3's comparable run is r1: the narrowed r2 between them is never offered.
        assert "vs r1" in (rows["r3"].locator("td.compare").text_content() or "")
        labels = page.eval_on_selector_all(
            "#history .history_line_labels text", "els => els.map(e => e.textContent)"
        )
        assert [x.split(" · ")[0] for x in labels] == ["r1", "r3", "r4"]
        assert all(" · 20" in x for x in labels)  # each point: run and date
        # The pin break splits the line; r2 (narrowed) is no point.
        # r4 (its judge changed) starts a segment alone: a point, never joined to r3. The one
        # stroke is r1 to r3: one move, one line.
        strokes = page.eval_on_selector_all(
            "#history .history_line_marks path.line", "ps => ps.map(p => p.getAttribute('d'))"
        )
        assert [d.count("L") for d in strokes] == [1]
        assert page.locator("#history .history_break_marks path").count() >= 1
        _shot(page.locator("#history"), "history.png")
        # The whole index: the chart above the table where r2 is listed with its mark.
        _shot(page.locator("body"), "runs-index.png")
        # The picker: any two runs, the comparison page with its links. It opens on the newest
        # run and the run before it: r4 has no comparable run (its judge changed).
        assert page.input_value("#pick-run") == "r4"
        assert page.input_value("#pick-base") == "r3"
        page.select_option("#pick-base", "r1")
        page.select_option("#pick-run", "r3")
        _shot(page.locator("#compare-picker"), "compare-picker.png")
        page.click("#pick-go")
        page.wait_for_selector("body[data-ready='1']")
        assert page.url.endswith("/compare/r1/r3/")
        assert page.locator("#flip-table").count() == 1
        assert "gate:" in (page.text_content("#headline-gate") or "")
        assert page.get_attribute("#link-baseline", "href") == "/runs/r1/"
        assert page.get_attribute("#link-this-run", "href") == "/runs/r3/"
        page.click("#link-index")
        page.wait_for_selector("#runs")
        # A narrowed run may be picked, and the page says why no gate could decide on it.
        page.select_option("#pick-base", "r1")
        page.select_option("#pick-run", "r2")
        page.click("#pick-go")
        page.wait_for_selector("body[data-ready='1']")
        assert "cannot carry a decision" in (page.text_content("#compared") or "")
        # Without r4 the newest is r3, and the picker offers r1, its comparable run, as the
        # baseline: never the narrowed r2 just before it.
        shutil.rmtree(runs_dir / "r4")
        page.goto(server.url + "/")
        assert page.input_value("#pick-run") == "r3"
        assert page.input_value("#pick-base") == "r1"
        assert events == []
        page.close()
    finally:
        server.close()


def test_the_picker_refuses_a_name_outside_the_runs_directory(tmp_path: Path) -> None:
    run_dir = review_run(tmp_path)
    server = Served(run_dir.parent)
    try:
        for query in ("base=..&run=r1", "base=r1&run=%2Fetc", "base=&run=r1"):
            status, _ = server.get(f"/compare/?{query}")
            assert status == 404, query
        status, _ = server.get("/compare/?base=r1&run=r1")
        assert status == 200
    finally:
        server.close()


def test_the_static_report_links_its_index_and_baseline(tmp_path: Path) -> None:
    from tests.reportruns import two_runs

    _, _, current, _ = two_runs(tmp_path)
    html = (current / "report.html").read_text()
    assert 'id="link-index" href="../index.html"' in html
    assert 'id="link-baseline" href="../before/report.html"' in html
    assert html.index('id="headline"') < html.index('id="pins-fold"')
    assert json.loads((current / "run.json").read_text())["totals"]["peopleDisagree"] == 0
