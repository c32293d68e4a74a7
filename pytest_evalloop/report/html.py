"""A run's report as one self-contained HTML file, and the runs index beside it.

:func:`write_report` builds a :class:`pytest_evalloop.report.report.Report` and renders it with
Jinja2 (autoescape on: every run text is HTML-escaped), the charts inlined as SVG
(:mod:`pytest_evalloop.report.charts`), the stylesheet and the small filter/drill-down script
inlined, and the per-case data embedded as gzipped, base64-encoded JSON (:func:`embedded_data`: no
character of it can end its ``<script>`` element). The page loads nothing: a Content-Security-Policy allows no network and
only our own script (by its hash), so even text that escaped escaping could not run.

:func:`write_index` lists a runs directory's runs (`runs/index.html`), their pins and headline
figures, counted through :mod:`pytest_evalloop.measure.aggregates`, each linking to its report.

Jinja2 and pygal are imported here, at point of use: a run with `--eval-report=off`
never loads them.
"""

from __future__ import annotations

import base64
import gzip
import hashlib
import json
import math
import os
import shlex
import tempfile
from collections import Counter
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import fields
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from pytest_evalloop.ledger import reader as ledger_reader
from pytest_evalloop.ledger.files import json_bytes
from pytest_evalloop.ledger.gcpolicy import gc_paused
from pytest_evalloop.measure.comparison import resolve_run
from pytest_evalloop.report import charts
from pytest_evalloop.report.report import CaseView, Report, build, pass_rate_text
from pytest_evalloop.report.runsindex import REPORT_FILE, index_rows

if TYPE_CHECKING:
    import jinja2

INDEX_FILE = "index.html"
_TEMPLATES = Path(__file__).with_name("templates")


TEMPLATES = ("report.html.j2", "index.html.j2")
"""The pages' templates: the chart process compiles them (65 ms) while the items run.

Not kept in a bytecode cache between processes: Jinja's cache loads an entry with pickle and
marshal before any check of its bytes, so a damaged entry crashed the session and a writable
cache folder (a shared EVALLOOP_CACHE_DIR) would run anyone's code."""


@cache
def _env() -> jinja2.Environment:
    import jinja2

    return jinja2.Environment(
        loader=jinja2.FileSystemLoader(_TEMPLATES),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
        trim_blocks=False,
    )


def embedded_data(data: Any) -> str:
    """The case data as the page carries it: JSON, gzipped, base64.

    Base64 has no `<`, `>`, `&` or quote, so nothing in it can end or bend the `<script>`
    element that holds it, whatever the run text says; and gzip keeps a 10,000-case report a
    few megabytes (the page inflates it with the browser's own DecompressionStream)."""
    try:
        text = json.dumps(
            data, ensure_ascii=False, separators=(",", ":"), default=str, allow_nan=False
        )
    except ValueError:
        # A nan or an infinity (a cost the claude CLI reported as NaN): JSON has no word for
        # them (the browser's JSON.parse refused the whole page's data), so they go as null,
        # as a value nobody reported does. The page's table shows the value itself.
        text = json.dumps(_finite(data), ensure_ascii=False, separators=(",", ":"), default=str)
    packed = gzip.compress(json_bytes(text), compresslevel=1, mtime=0)
    return base64.b64encode(packed).decode("ascii")


def _finite(value: Any) -> Any:
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {key: _finite(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(item) for item in value]
    return value


def _csp_hash(script: str) -> str:
    digest = hashlib.sha256(script.encode("utf-8")).digest()
    return "'sha256-" + base64.b64encode(digest).decode("ascii") + "'"


def _plots(report: Report) -> str | None:
    cases = report.cases
    if not cases:
        return None
    specs = []
    for field, title in (
        ("tags", "verdicts by tag"),
        ("coverage", "by coverage"),
        ("split", "by split"),
    ):
        counts: Counter[tuple[str, str]] = Counter()
        for c in cases:
            value = getattr(c, field)
            groups = value if isinstance(value, list) else [value]
            for group in groups or ["(none)"]:
                counts[(str(group if group is not None else "(none)"), c.outcome)] += 1
        if {group for group, _ in counts} != {"(none)"}:
            # A grouping no case sets draws one bar, the run's outcomes again, and costs a
            # chart's render (a tenth of the page's) for it.
            specs.append(charts.outcomes_by(dict(counts), title))
    measures = []
    for attr, measure, unit, title in (
        ("cost_usd", "cost", "USD", "answerer cost per case"),
        ("turns", "turns", "", "turns per case"),
        ("wall_seconds", "wall time", "s", "wall time per case"),
        ("recall", "recall", "", "retrieval recall per case"),
        ("precision", "precision", "", "retrieval precision per case"),
    ):
        values = [(c.key, v) for c in cases if (v := getattr(c, attr)) is not None]
        axis = f"{measure} ({unit})" if unit else measure
        if values and len(cases) > charts.PER_CASE_BARS:
            specs.append(charts.per_case_histogram(values, measure=axis, title=title))
        elif values:
            # The column's header: "answerer cost (USD)", "retrieval recall"...
            header = title.removesuffix(" per case") + (f" ({unit})" if unit else "")
            measures.append((header, values))
    if measures:
        specs.append(charts.per_case(measures, title="per case"))
    return charts.render(charts.combined(specs))


def _flips_svg(report: Report) -> str | None:
    if report.baseline is None:
        return None
    title = f"flips against {report.baseline.name}"
    return charts.render(charts.flips(report.baseline.table, title))


def _charts_of(report: Report, charts_on: bool) -> tuple[str | None, str | None]:
    return (_plots(report), _flips_svg(report)) if charts_on else (None, None)


def _drawn_now(report: Report, charts_on: bool) -> Future[tuple[str | None, str | None]]:
    done: Future[tuple[str | None, str | None]] = Future()
    try:
        done.set_result(_charts_of(report, charts_on))
    except (RuntimeError, OSError, ValueError) as exc:
        done.set_exception(exc)
    return done


def _case_data(report: Report) -> list[dict[str, Any]]:
    # Shallow, and without empty fields: asdict() deep-copies, ×10,000 cases.
    out = []
    for c in report.cases:
        data = {name: value for name in _CASE_FIELDS if (value := getattr(c, name)) not in _EMPTY}
        data["key"] = c.key
        data["outcome"] = c.outcome
        out.append(data)
    return out


_CASE_FIELDS = tuple(f.name for f in fields(CaseView))
_EMPTY: tuple[Any, ...] = (None, "", [], {})


def static_links(report: Report) -> dict[str, str]:
    """The links of a report.html written in its run directory: the runs index beside it and
    the baseline's report, when the baseline is a run of the same runs directory."""
    links = {"index": "../" + INDEX_FILE}
    base = report.baseline
    if base is not None and base.run_dir.parent.resolve() == report.run_dir.parent.resolve():
        links["baseline"] = f"../{quote(base.run_dir.name)}/{REPORT_FILE}"
    return links


def render(
    report: Report,
    *,
    review: dict[str, str] | None = None,
    charts_on: bool = True,
    links: dict[str, str] | None = None,
) -> str:
    """The report page as one HTML string.

    `review` (only `evalloop view` passes it: `api`, the run's review URL, `reviewer` and the
    server's `token`) adds the review panel's script and lets the page talk to its own origin;
    the static report.html is rendered without it, read-only and offline. `links`: `index`,
    `baseline`, `this_run` (the other arm of a comparison), each shown when given.
    `charts_on=False` (`--eval-report-charts=off`) leaves the charts out and starts no chart
    process.
    """
    from markupsafe import Markup, escape

    js = (_TEMPLATES / "report.js").read_text(encoding="utf-8")
    if review is not None:
        js = (_TEMPLATES / "review.js").read_text(encoding="utf-8") + "\n" + js
    css = (_TEMPLATES / "report.css").read_text(encoding="utf-8")
    # A dict per case and a row of strings per case, no cycle among them (see gc_paused).
    with gc_paused():
        # The chart process draws while this one packs the data (a thread waits on it).
        with ThreadPoolExecutor(max_workers=1, thread_name_prefix="evalloop-charts") as pool:
            # In the chart process itself the charts are drawn in its main thread, first: no
            # child to wait on, and a drawing's time limit is an alarm that lands there only.
            svgs = (
                _drawn_now(report, charts_on)
                if charts.drawing_here()
                else pool.submit(_charts_of, report, charts_on)
            )
            case_data = embedded_data(_case_data(report))
            charts_note = None
            if not charts_on:
                charts_note = (
                    "charts not drawn (--eval-report-charts=off); every figure and case below "
                    f"is complete. `evalloop report {report.run_dir}` draws them"
                )
            try:
                plots, flip_chart = svgs.result()
            except (RuntimeError, OSError, ValueError) as exc:
                # A chart child killed (Ctrl-C reaches the whole process group) or gone, or a
                # figure it could not draw: the page without charts still holds every figure
                # and case.
                plots, flip_chart = None, None
                charts_note = (
                    f"charts not drawn ({exc}); every figure and case below is complete. "
                    f"`evalloop report {report.run_dir}` draws them again"
                )
        tags = sorted({t for c in report.cases for t in c.tags})
        splits = sorted({c.split for c in report.cases if c.split})
        html = (
            _env()
            .get_template("report.html.j2")
            .render(
                r=report,
                links=links or {},
                pass_rate=pass_rate_text(report),
                css=Markup(css),
                js=Markup(js),
                # pygal's SVG of our figures; its ElementTree escapes every data value it writes.
                plots_svg=Markup(plots) if plots else None,
                flips_svg=Markup(flip_chart) if flip_chart else None,
                charts_note=charts_note,
                case_data=case_data,
                tags=tags,
                splits=splits,
            )
        )
    # Only our own script may run: its hash replaces 'unsafe-inline' in the policy.
    html = html.replace("script-src 'unsafe-inline'", f"script-src {_csp_hash(js)}", 1)
    if review is not None:
        html = html.replace("img-src data:", "img-src data:; connect-src 'self'", 1)
        attrs = " ".join(f'data-review-{k}="{escape(v)}"' for k, v in sorted(review.items()))
        html = html.replace("<body>", f"<body {attrs}>", 1)
    return html


def _write_atomically(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
        # mkstemp makes the file private; a report is for sharing (a CI artifact), like the
        # run's other files.
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_report(
    run_dir: Path, *, baseline_dir: Path | None = None, out: Path | None = None
) -> Path:
    """Build and write a run's report (default `<run_dir>/report.html`); returns its path."""
    charts.warm_up()
    return write(build(run_dir, baseline_dir=baseline_dir), out)


def rewrite_report(run_dir: Path) -> Path | None:
    """Rewrite a run's `report.html` from its ledger when it has one, keeping its flip view
    (the baseline it was gated or tested against); None when it has none. What a review and
    `evalloop diagnose` call after they append, so no report shows a ledger that moved on."""
    if not (run_dir / REPORT_FILE).is_file():
        return None
    info = ledger_reader.read_run_info(run_dir)
    recorded = [(info.gate or {}).get("baseline"), (info.paired_tests or {}).get("baseline")]
    baseline = None
    for name in (n for n in recorded if isinstance(n, str) and n):
        try:
            baseline = resolve_run(name, set_dir=None, runs_dir=run_dir.parent)
            break
        except ValueError:
            continue
    return write_report(run_dir, baseline_dir=baseline)


def write(report: Report, out: Path | None = None, *, charts_on: bool = True) -> Path:
    """Write a built report (default `<run_dir>/report.html`); returns its path."""
    path = out if out is not None else report.run_dir / REPORT_FILE
    # Relative links hold only where the report sits in its run directory.
    links = static_links(report) if path.parent.resolve() == report.run_dir.resolve() else None
    _write_atomically(path, render(report, charts_on=charts_on, links=links))
    return path


# --- runs/index.html ---------------------------------------------------------------------


def history_svg(rows: list[dict[str, Any]]) -> str | None:
    """The pass-rate-over-time chart of `index_rows` (None with no published pass rate)."""
    points, changes = history_points(rows)
    if not points:
        return None
    charts.warm_up()
    return charts.render(charts.history(points, changes))


def history_points(rows: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The history's points and pin breaks from `index_rows` (newest first), oldest first.

    A point only for a run the gate could compare (`comparable.alone` admits it: complete,
    whole split, not a shard, sealed, one model) with a published rate; a narrowed, aborted or
    shard run is listed in the table with its mark and is no point. Each pin break starts a
    new segment, so the line never joins runs a breaking pin separates.
    """
    points, changes = [], []
    segment = 0
    for order, row in enumerate(reversed(rows), start=1):
        if row["changed"]:
            segment += 1
            changes.append(
                {"run": row["name"], "order": order - 0.5, "pins": ", ".join(row["changed"])}
            )
        if row["rate"] is None or row["not_comparable"]:
            continue
        low, high = row["interval"] or (row["rate"], row["rate"])
        date = (row["started"] or "")[:10]
        points.append(
            {
                "run": row["name"],
                "label": f"{row['name']} · {date}" if date else row["name"],
                "order": order,
                "segment": segment,
                "rate": row["rate"],
                "low": low,
                "high": high,
            }
        )
    return points, changes


def render_index(runs_dir: Path, *, served: bool = False, charts_on: bool = True) -> str:
    """The runs index page (`served`: every run links to `evalloop view`'s page of it;
    `charts_on=False`: without the history chart)."""
    css = (_TEMPLATES / "report.css").read_text(encoding="utf-8")
    from markupsafe import Markup

    rows = index_rows(runs_dir)
    for row in rows:
        other = row["compare_with"]
        if served:
            row["href"] = "runs/" + quote(row["dir"]) + "/"
            row["compare_href"] = f"compare/{quote(other)}/{quote(row['dir'])}/" if other else None
        else:
            row["compare_href"] = None
        # Absolute, so the line pasted into a terminal anywhere finds the run (the baseline is
        # found beside it).
        run_path = shlex.quote(str((runs_dir / row["dir"]).resolve()))
        row["compare_cmd"] = (
            f"evalloop report {run_path} --baseline {shlex.quote(other)}" if other else None
        )
    try:
        svg = history_svg(rows) if charts_on else None
    except (RuntimeError, OSError, ValueError):
        # The chart process is gone (Ctrl-C reaches the whole process group): the index is
        # still written, every run listed, without its chart; the next write draws it again.
        svg = None
    return (
        _env()
        .get_template("index.html.j2")
        .render(
            runs_dir=runs_dir.name,
            rows=rows,
            served=served,
            css=Markup(css),
            # pygal's SVG of our figures; its ElementTree escapes every data value it writes.
            history_svg=Markup(svg) if svg else None,
        )
    )


def write_index(runs_dir: Path, *, charts_on: bool = True) -> Path:
    """Write `<runs_dir>/index.html` listing every run there; returns its path."""
    html = render_index(runs_dir, charts_on=charts_on)
    path = runs_dir / INDEX_FILE
    _write_atomically(path, html)
    return path


# --- the end of a session ----------------------------------------------------------------


def session_outputs(
    run_dirs: list[Path],
    *,
    baseline: str | None,
    html: bool,
    summary_md: Path | None,
    charts_on: bool = True,
) -> dict[Path, list[str]]:
    """Write each closed run's report, the runs index and the Markdown summary (controller).

    Returns, per run, the lines the terminal summary prints about them. A report that cannot
    be written says why in one line; it never fails the session.
    """
    from pytest_evalloop.report.summary_md import markdown

    lines: dict[Path, list[str]] = {run_dir: [] for run_dir in run_dirs}
    if not html and summary_md is None:
        return lines
    texts = []
    if html and charts_on:
        charts.warm_up()
    for run_dir in run_dirs:
        try:
            report = build(run_dir, baseline_dir=_baseline_dir(run_dir, baseline))
            if html:
                lines[run_dir].append(f"report: {write(report, charts_on=charts_on)}")
            texts.append(markdown(report))
        except Exception as exc:  # noqa: BLE001 -- the report is an extra: never the run's outcome
            lines[run_dir].append(
                f"report: not written ({type(exc).__name__}: {exc}); write it later with "
                f"`evalloop report {run_dir}`"
            )
    if html:
        for runs_dir in sorted({run_dir.parent for run_dir in run_dirs}):
            last = max(d for d in run_dirs if d.parent == runs_dir)
            try:
                lines[last].append(f"runs index: {write_index(runs_dir, charts_on=charts_on)}")
            except Exception as exc:  # noqa: BLE001 -- as above
                lines[last].append(f"runs index: not written ({type(exc).__name__}: {exc})")
    if summary_md is not None and run_dirs:
        try:
            summary_md.parent.mkdir(parents=True, exist_ok=True)
            summary_md.write_text("\n".join(texts), encoding="utf-8")
            lines[run_dirs[-1]].append(f"summary (Markdown): {summary_md}")
        except OSError as exc:
            lines[run_dirs[-1]].append(
                f"--eval-summary-md={summary_md}: not written ({exc.strerror or exc}); "
                "give a writable file path"
            )
    return lines


def session_outputs_aside(
    run_dirs: list[Path],
    *,
    baseline: str | None,
    html: bool,
    summary_md: Path | None,
    charts_on: bool = True,
    meanwhile: Callable[[], None] | None = None,
) -> dict[Path, list[str]]:
    """`session_outputs`, written by the chart process (controller).

    A report reads its run's ledger and set again and builds a view per case: at 4,000 cases
    that was the controller's peak. In the chart process, started while the items ran, that
    memory is the child's and goes back to the system when the session ends; the controller's
    stays flat in the run's size. With charts off there is no such process, and a gone one
    (a Ctrl-C reaches the process group) is not started again for this: then here.
    `meanwhile` runs once, here, while the chart process writes (before, when it writes here).
    """
    pending = [meanwhile] if meanwhile is not None else []
    failed: list[Exception] = []
    if not run_dirs:
        # No run closed (a session of plain tests, a --collect-only): nothing to write, and no
        # chart process to start for it (a Python start: 0.25 s of every such session's wall).
        if meanwhile is not None:
            meanwhile()
        return {}

    def run_meanwhile() -> None:
        # Its failure is raised once the reports are written: it must not pass for the chart
        # process's (which would throw a good reply away and write every report again here).
        while pending:
            try:
                pending.pop()()
            except Exception as exc:  # noqa: BLE001 -- raised below, after the reports
                failed.append(exc)

    if html and charts_on:
        try:
            request = {
                "run_dirs": [str(d) for d in run_dirs],
                "baseline": baseline,
                "summary_md": None if summary_md is None else str(summary_md),
                # Relative paths (the Markdown file, a --baseline path) mean what they mean
                # here: the child started before a conftest may have changed directory.
                "cwd": os.getcwd(),
            }
            reply = charts.ask({"outputs": request}, run_meanwhile)
            lines = {Path(run_dir): list(said) for run_dir, said in reply["lines"]}
            if set(lines) == set(run_dirs):
                if failed:
                    raise failed[0]
                return lines
        except (OSError, RuntimeError, KeyError, TypeError, ValueError):
            pass  # gone, or it failed, or no directory to send: written here, as without it
        # Whatever it answered is not to be trusted for the charts drawn here either (a reply
        # still queued would answer the next request): a fresh one draws them.
        charts.shutdown()
    run_meanwhile()  # when the chart process was never reached, or there is none
    written = session_outputs(
        run_dirs, baseline=baseline, html=html, summary_md=summary_md, charts_on=charts_on
    )
    if failed:
        raise failed[0]
    return written


def serve() -> None:
    """The chart process's loop (`charts._ChartProcess`): a request per stdin line (a spec
    to draw, or a session's outputs to write, charts on) and a reply per line on the reply
    pipe `charts.REPLY_FD` names, until stdin closes."""
    import sys

    # Replies go out on their own pipe (stdout is the null device): nothing printed can
    # pass for one. Not handed on to anything this process starts.
    channel = os.fdopen(int(os.environ.pop(charts.REPLY_FD)), "w", encoding="utf-8")
    charts.start_drawing_here()
    for name in TEMPLATES:  # compiled while the items still run
        _env().get_template(name)
    for line in sys.stdin:
        channel.write(json.dumps(_served(json.loads(line))) + "\n")
        channel.flush()


def _served(request: dict[str, Any]) -> dict[str, Any]:
    if "draw" in request:
        try:
            return {"svg": charts.draw_here(request["draw"])}
        except ValueError as exc:
            return {"error": str(exc)}
    asked = request["outputs"]
    try:
        os.chdir(asked["cwd"])
        lines = session_outputs(
            [Path(d) for d in asked["run_dirs"]],
            baseline=asked["baseline"],
            html=True,
            summary_md=None if asked["summary_md"] is None else Path(asked["summary_md"]),
        )
    except Exception as exc:  # noqa: BLE001 -- the controller writes them itself then
        return {"error": f"{type(exc).__name__}: {exc}"}
    return {"lines": [[str(run_dir), said] for run_dir, said in lines.items()]}


def _baseline_dir(run_dir: Path, baseline: str | None) -> Path | None:
    """The `--baseline` run directory, found the way the comparison finds it (None: none)."""
    if not baseline:
        return None
    set_dir = run_dir.parent.parent
    try:
        return resolve_run(
            baseline,
            set_dir=set_dir if (set_dir / "set.json").is_file() else None,
            runs_dir=run_dir.parent,
        )
    except ValueError:
        # The comparison already printed why the baseline cannot be found.
        return None
