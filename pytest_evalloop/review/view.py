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

Writes come only from the server's own pages (`Guard`): every request must name this server in
its Host header (a loopback name or the bound address, with the bound port: a page whose
domain was rebound to 127.0.0.1 sends its own name, and is refused with 403 before anything
is read, so it never sees a page) and, when it carries an Origin, this server's origin; every
write must carry the per-server token (`X-Evalloop-Token`) that only the pages this server
served hold. Refusals are 403.
"""

from __future__ import annotations

import argparse
import hmac
import ipaddress
import json
import secrets
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
LOOPBACK_NAMES = frozenset({"localhost", "127.0.0.1", "::1"})
"""Host names a request to the viewer may use, besides the address it is bound to."""
TOKEN_HEADER = "X-Evalloop-Token"
"""The header every write carries the server's token in (its pages read it from their body)."""


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


class Guard:
    """ASGI middleware: every request names this server (Host, and Origin when sent), every
    write carries its token; anything else is a 403 before the app sees it."""

    def __init__(self, app: Any, *, hosts: frozenset[str], port: int | None, token: str) -> None:
        self.app, self.hosts, self.port, self.token = app, hosts, port, token

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        why = self.refusal(scope["method"], headers)
        if why is None:
            await self.app(scope, receive, send)
            return
        from starlette.responses import JSONResponse

        await JSONResponse({"error": why}, status_code=403)(scope, receive, send)

    def refusal(self, method: str, headers: dict[str, str]) -> str | None:
        """Why this request is refused, or None."""
        host = headers.get("host", "")
        if not self.ours(host):
            return (
                f"Host {host!r} is not this server (it answers to {sorted(self.hosts)} on port "
                f"{self.port}): a page of another site cannot reach it"
            )
        origin = headers.get("origin")
        if origin is not None and not (
            origin.startswith("http://") and self.ours(origin.removeprefix("http://"))
        ):
            return f"Origin {origin!r} is not this server's: only its own pages may call it"
        if method not in ("GET", "HEAD"):
            sent = headers.get(TOKEN_HEADER.lower(), "")
            if not hmac.compare_digest(sent.encode(), self.token.encode()):
                return (
                    f"a write needs this server's {TOKEN_HEADER}, which only the pages it "
                    "served hold: record the review from the page (or `evalloop review`)"
                )
        return None

    def ours(self, netloc: str) -> bool:
        """Whether `host[:port]` names this server."""
        if netloc.startswith("["):
            name, _, rest = netloc[1:].partition("]")
            if rest and not rest.startswith(":"):
                return False
            port = rest[1:]
        else:
            name, _, port = netloc.partition(":")
        if name.lower() not in self.hosts:
            return False
        return self.port is None or port == str(self.port)


def make_app(
    runs_dir: Path,
    *,
    reviewer: str | None = None,
    hosts: frozenset[str] = LOOPBACK_NAMES,
    port: int | None = None,
    token: str | None = None,
) -> Starlette:
    """The ASGI app serving `runs_dir` (index, reports, the review API), behind `Guard`:
    requests must name one of `hosts` (with `port`, when given), writes carry `token` (a new
    random one when None; the app's `state.token`)."""
    from starlette.applications import Starlette
    from starlette.middleware import Middleware
    from starlette.responses import HTMLResponse, JSONResponse, RedirectResponse
    from starlette.routing import Route

    from pytest_evalloop.ledger import reader as ledger_reader
    from pytest_evalloop.ledger.writer import contained_dir
    from pytest_evalloop.report import html as report_html
    from pytest_evalloop.report.report import build
    from pytest_evalloop.review.review import ReviewError, record_review, review_queue

    token = token or secrets.token_urlsafe(32)

    def panel(run: str) -> dict[str, str]:
        return {"api": f"/api/runs/{run}/reviews", "reviewer": reviewer or "", "token": token}

    def run_dir(request: Request, param: str = "run") -> Path | None:
        name = request.path_params[param]
        try:
            path = contained_dir(runs_dir, name)
        except ValueError:
            return None
        return path if (path / "run.json").is_file() else None

    def refused(why: str, status: int = 400) -> Response:
        return JSONResponse({"error": why}, status_code=status)

    def unreadable(exc: Exception) -> Response:
        # A run the reader refuses (a ledger file that is a pipe, say): its reason, not a 500.
        import html

        return HTMLResponse(f"<p>This run cannot be shown: {html.escape(str(exc))}</p>", 409)

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
        try:
            report = build(path)
        except (ValueError, OSError) as exc:
            return unreadable(exc)
        page = report_html.render(report, review=panel(path.name), links={"index": "/"})
        return HTMLResponse(page)

    async def compare(request: Request) -> Response:
        path, base = run_dir(request), run_dir(request, "base")
        if path is None or base is None:
            return HTMLResponse("no such run here", status_code=404)
        links = {
            "index": "/",
            "baseline": f"/runs/{quote(base.name)}/",
            "this_run": f"/runs/{quote(path.name)}/",
        }
        try:
            report = build(path, baseline_dir=base)
        except (ValueError, OSError) as exc:
            return unreadable(exc)
        page = report_html.render(report, review=panel(path.name), links=links)
        return HTMLResponse(page)

    async def pick(request: Request) -> Response:
        # The index's picker: a GET form naming two runs (each checked as every run name is).
        base, run = request.query_params.get("base", ""), request.query_params.get("run", "")
        for name in (base, run):
            try:
                contained_dir(runs_dir, name)
            except ValueError:
                return HTMLResponse("no such run here", status_code=404)
        return RedirectResponse(f"/compare/{quote(base)}/{quote(run)}/")

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
        return JSONResponse(recorded_json(path, done))

    names = frozenset(h.lower() for h in hosts)
    app = Starlette(
        middleware=[Middleware(Guard, hosts=names, port=port, token=token)],
        routes=[
            Route("/", index),
            Route("/runs/{run}", bare_report),
            Route("/runs/{run}/", report),
            Route("/compare/", pick),
            Route("/compare/{base}/{run}/", compare),
            Route("/api/runs/{run}/reviews", reviews, methods=["GET", "POST"]),
            Route("/review/", queue),
            Route("/api/review-queue", queue),
        ],
    )
    app.state.token = token
    return app


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


def recorded_json(run_dir: Path, done: Any) -> dict[str, Any]:
    """What the page is told of a recorded review: the message, and the attempt as it now
    counts (its outcome word, who settled it, or who disagrees), to update its badge."""
    from pytest_evalloop.ledger import reader as ledger_reader
    from pytest_evalloop.measure import aggregates

    what = "golden held" if done.golden_held else f"verdict {done.event.verdict}"
    extra = f"; judge-regressions.jsonl: {done.fixture_id}" if done.fixture_id else ""
    if done.voided:
        extra += f" (voided {', '.join(done.voided)})"
    if done.label is not None and done.label.disagree:
        extra += f"; people disagree ({done.label.text()}): one more review settles it"
    read = ledger_reader.read_run(run_dir, kinds=aggregates.KINDS, validate=False)
    key = (done.event.qid, done.event.sample)
    counted = next(a for a in aggregates.tally(read).attempts if (a.qid, a.sample) == key)
    return {
        "message": f"{what} by {done.event.reviewer}{extra}",
        "outcome": counted.outcome,
        "settled_by": counted.settled_by,
        "people_disagree": counted.people_disagree,
    }


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
    from pytest_evalloop.review.review import default_reviewer

    parser = argparse.ArgumentParser(
        prog="evalloop view",
        description="Serve a set's runs and reports on loopback, with a review panel.",
    )
    parser.add_argument("path", type=Path, help="a set directory or a runs directory")
    parser.add_argument("--host", default="127.0.0.1", help="a loopback address")
    parser.add_argument("--port", type=int, default=DEFAULT_PORT, help="0: any free port")
    parser.add_argument(
        "--by", help="the reviewer's name (default: git config user.name, else the login name)"
    )
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
    app = make_app(
        runs_dir,
        reviewer=args.by or default_reviewer(),
        hosts=LOOPBACK_NAMES | {str(host).lower()},
        port=int(port),
    )
    serve(app, sock)
    return 0
