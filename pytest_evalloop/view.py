"""`evalloop view <set or runs dir>`: the runs index and every report, served on loopback,
with a review panel in each case's drill-down and a review queue (`/review/`: the judge
suspects `evalloop diagnose` found that no person has reviewed yet, `review.review_queue`).

Starlette serves the pages and uvicorn runs it (both come with the `mcp` SDK). The pages are
the static files' own (`report.html.render` with `review=`): the same counts, the same
escaping, plus `review.js`, which posts a person's verdict to `POST /api/runs/<run>/reviews`;
that calls `review.record_review`, the one function `evalloop review` calls too.

Only loopback is served: the server writes to the set (ledger, judge-regressions.jsonl, the
golden side door), so it refuses any other host. A run is named by its directory under the
runs directory and nothing else (`ledger.writer.contained_dir`): a name that resolves outside
it is refused before anything is read or written. A write must be JSON (a cross-site form
cannot send it without the browser's preflight, which this server never grants).
"""

from __future__ import annotations

import argparse
import ipaddress
import json
import socket
import sys
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

if TYPE_CHECKING:
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import Response

DEFAULT_PORT = 8770


class ViewError(Exception):
    """`evalloop view` cannot start as asked."""


def runs_dir_of(path: Path) -> Path:
    """The runs directory `path` names: a set's `runs/`, or `path` itself."""
    if (path / "set.json").is_file():
        return path / "runs"
    if path.is_dir():
        return path
    raise ViewError(f"{path} is neither a set directory (set.json) nor a runs directory")


def loopback_only(host: str) -> str:
    """`host` when it is a loopback address (or `localhost`), else a ViewError."""
    if host == "localhost":
        return host
    try:
        if ipaddress.ip_address(host).is_loopback:
            return host
    except ValueError:
        pass
    raise ViewError(
        f"--host {host!r} is not a loopback address: evalloop view writes to the set, so it "
        "serves 127.0.0.1 (or ::1) only"
    )


def make_app(runs_dir: Path, *, reviewer: str | None = None) -> Starlette:
    """The ASGI app serving `runs_dir` (index, reports, the review API)."""
    from starlette.applications import Starlette
    from starlette.responses import HTMLResponse, JSONResponse, RedirectResponse
    from starlette.routing import Route

    from pytest_evalloop.ledger import reader as ledger_reader
    from pytest_evalloop.ledger.writer import contained_dir
    from pytest_evalloop.report import html as report_html
    from pytest_evalloop.report.report import build
    from pytest_evalloop.review import ReviewError, record_review, review_queue

    def run_dir(request: Request, param: str = "run") -> Path | None:
        name = request.path_params[param]
        try:
            path = contained_dir(runs_dir, name)
        except ValueError:
            return None
        return path if (path / "run.json").is_file() else None

    def refused(why: str, status: int = 400) -> Response:
        return JSONResponse({"error": why}, status_code=status)

    async def index(request: Request) -> Response:
        page = report_html.render_index(runs_dir, served=True)
        waiting = len(review_queue(runs_dir))
        link = (
            f'<p id="review-queue-link"><a href="review/">review queue: {waiting} judge '
            "suspect(s) awaiting a person</a></p>"
        )
        return HTMLResponse(page.replace("</h1>", "</h1>\n" + link, 1))

    async def queue(request: Request) -> Response:
        if request.url.path.startswith("/api/"):
            return JSONResponse([asdict(q) for q in review_queue(runs_dir)])
        return HTMLResponse(queue_page(review_queue(runs_dir)))

    async def report(request: Request) -> Response:
        path = run_dir(request)
        if path is None:
            return HTMLResponse("no such run here", status_code=404)
        api = f"/api/runs/{request.path_params['run']}/reviews"
        page = report_html.render(build(path), review={"api": api, "reviewer": reviewer or ""})
        return HTMLResponse(page)

    async def compare(request: Request) -> Response:
        path, base = run_dir(request), run_dir(request, "base")
        if path is None or base is None:
            return HTMLResponse("no such run here", status_code=404)
        api = f"/api/runs/{path.name}/reviews"
        page = report_html.render(
            build(path, baseline_dir=base), review={"api": api, "reviewer": reviewer or ""}
        )
        return HTMLResponse(page)

    async def bare_report(request: Request) -> Response:
        return RedirectResponse(f"/runs/{request.path_params['run']}/")

    async def reviews(request: Request) -> Response:
        path = run_dir(request)
        if path is None:
            return refused("no such run under the runs directory being served", 404)
        if request.method == "GET":
            read = ledger_reader.read_run(path, kinds=frozenset({"review"}), validate=False)
            return JSONResponse([_review_json(e) for e in read.of_kind("review")])
        if request.headers.get("content-type", "").split(";")[0].strip() != "application/json":
            return refused("a review is posted as application/json", 415)
        try:
            body = json.loads(await request.body())
        except (json.JSONDecodeError, UnicodeDecodeError):
            return refused("the body is not JSON")
        if not isinstance(body, dict) or not isinstance(body.get("qid"), str):
            return refused("give qid, sample, verdict, why and reviewer")
        sample = body.get("sample")
        if sample is not None and not isinstance(sample, int):
            return refused(f"sample {sample!r} is not an integer")
        try:
            done = record_review(
                path,
                body["qid"],
                str(body.get("verdict") or ""),
                why=str(body.get("why") or ""),
                reviewer=str(body.get("reviewer") or "") or reviewer,
                sample=sample,
            )
        except ReviewError as exc:
            return refused(str(exc), 409)
        what = "golden held" if done.golden_held else f"verdict {done.event.verdict}"
        extra = f"; judge-regressions.jsonl: {done.fixture_id}" if done.fixture_id else ""
        return JSONResponse({"message": f"{what} by {done.event.reviewer}{extra}"})

    return Starlette(
        routes=[
            Route("/", index),
            Route("/runs/{run}", bare_report),
            Route("/runs/{run}/", report),
            Route("/compare/{base}/{run}/", compare),
            Route("/api/runs/{run}/reviews", reviews, methods=["GET", "POST"]),
            Route("/review/", queue),
            Route("/api/review-queue", queue),
        ]
    )


def queue_page(queued: list[Any]) -> str:
    """The review queue as a page: each judge suspect, linked to its run's report, where the
    case's drill-down carries the review panel. Every run string is escaped; no script."""
    from markupsafe import escape

    rows = "".join(
        f'<tr data-qid="{escape(q.qid)}"><td><a href="../runs/{escape(quote(q.run))}/">'
        f"{escape(q.run)}</a></td><td><code>{escape(q.qid)}</code></td>"
        f"<td>{escape(q.judge_why or '')}</td><td><code>{escape(q.issue_id)}</code></td></tr>"
        for q in queued
    )
    body = rows or '<tr><td colspan="4">nothing awaits a person</td></tr>'
    return (
        '<!doctype html><html lang="en"><head><meta charset="utf-8">'
        '<meta http-equiv="Content-Security-Policy" content="default-src \'none\'">'
        "<title>evalloop review queue</title></head><body><h1>Review queue</h1>"
        f"<p>{len(queued)} judge suspect(s): the re-executed rows match the golden, yet the "
        "judge said no_match. Open the run, click the case, rule in its review panel; each "
        "ruling is a fixture of the judge's agreement figures, and none goes to improve.</p>"
        '<table id="queue"><thead><tr><th>run</th><th>case</th><th>the judge said</th>'
        f"<th>issue</th></tr></thead><tbody>{body}</tbody></table></body></html>"
    )


def _review_json(event: Any) -> dict[str, Any]:
    keys = ("qid", "sample", "verdict", "golden_wrong", "reviewer", "why", "at", "judge_verdict")
    return {key: getattr(event, key, None) for key in keys}


def bind(host: str, port: int) -> socket.socket:
    """A listening socket on a loopback `host` (port 0: any free port)."""
    family = socket.AF_INET6 if ":" in loopback_only(host) else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(64)
    return sock


def serve(app: Starlette, sock: socket.socket) -> None:
    """Serve `app` on an already bound socket until interrupted."""
    import uvicorn

    config = uvicorn.Config(app, log_level="warning", lifespan="off")
    uvicorn.Server(config).run(sockets=[sock])


def view_main(argv: list[str]) -> int:
    """`evalloop view <set or runs dir> [--host 127.0.0.1] [--port N] [--by NAME]`."""
    from pytest_evalloop.review import default_reviewer

    parser = argparse.ArgumentParser(
        prog="evalloop view",
        description="Serve a set's runs and reports on loopback, with a review panel.",
    )
    parser.add_argument("path", type=Path, help="a set directory or a runs directory")
    parser.add_argument("--host", default="127.0.0.1", help="a loopback address")
    parser.add_argument("--port", type=int, default=DEFAULT_PORT, help="0: any free port")
    parser.add_argument("--by", help="the reviewer's name (default: git config user.name)")
    args = parser.parse_args(argv)
    try:
        runs_dir = runs_dir_of(args.path)
        sock = bind(args.host, args.port)
    except (ViewError, OSError) as exc:
        print(f"evalloop view: {exc}", file=sys.stderr)
        return 2
    host, port = sock.getsockname()[:2]
    shown = f"[{host}]" if ":" in host else host
    print(f"evalloop view: serving {runs_dir} on http://{shown}:{port}/ (Ctrl-C stops)", flush=True)
    serve(make_app(runs_dir, reviewer=args.by or default_reviewer()), sock)
    return 0
