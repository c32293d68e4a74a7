"""The report's charts: small JSON specs, drawn as inline SVG by pygal.

Each chart is a pure function from the report's figures to a spec (a JSON object: the chart's
kind and its few rows); :func:`render` turns a spec into SVG markup with `pygal` (a maintained
pure-Python SVG chart library: no browser, no engine, no network, and no script left in the
file). The SVG goes into the page as markup, so a report opens offline and shows its charts even
where scripts are blocked. The drawing happens in one child process (see `_ChartProcess`),
which also writes a session's reports when its runs close (`html.session_outputs_aside`).

Run text never reaches a chart as markup: a qid or a tag is a data value, and pygal writes it
into the SVG through ElementTree, which escapes it. Per-case charts show one bar per case up to
:data:`PER_CASE_BARS` cases and a histogram over cases above that, so a 10,000-case run draws
a few dozen marks per chart, not 10,000.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import math
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from html import escape
from pathlib import Path
from typing import Any

PER_CASE_BARS = 100
"""Above this many cases, per-case figures are drawn as a histogram over cases."""

OUTCOME_COLOURS = {
    "match": "#2e7d32",
    "no_match": "#c62828",
    "near_match": "#f9a825",
    "needs_human": "#6a1b9a",
    "unscored": "#9e9e9e",
    "gold_wrong": "#795548",
    "contaminated": "#000000",
    "harness_error": "#ef6c00",
}

HISTOGRAM_BINS = 30
_WIDTH = 520
_FACET_WIDTH = 160


_WARM_UP_SPEC: dict[str, Any] = {"chart": "flips", "title": "", "counts": [["better", 0]]}


REPLY_FD = "EVALLOOP_CHART_REPLY_FD"
"""The environment variable naming the chart process's reply pipe (`html.serve` takes it)."""


class _ChartProcess:
    """One child process that draws: a JSON request per line in on its stdin, a JSON reply
    per line out on a pipe of its own (never its stdout: whatever a `sitecustomize` or the
    report's code prints goes nowhere, and cannot pass for a reply).

    Why a process: a closing session's reports are built here too, and a report reads its
    run's ledger and set again and builds a view per case: in its own process that memory never
    joins the run's (at 4,000 cases it was the controller's peak), and its drawing never takes
    the interpreter from the pipelines' event loop. A plain `python -c` child, not a
    multiprocessing pool: a spawned pool re-imports the parent's main script, and a fork would
    copy this process's threads mid-flight.
    """

    def __init__(self) -> None:
        package_root = str(Path(__file__).resolve().parents[2])
        path = os.environ.get("PYTHONPATH")
        env = {**os.environ, "PYTHONPATH": package_root + (os.pathsep + path if path else "")}
        read_end, write_end = os.pipe()
        try:
            # html's loop: it draws, and writes a session's reports out of the controller's heap.
            self.proc = subprocess.Popen(
                [sys.executable, "-c", "from pytest_evalloop.report.html import serve; serve()"],
                stdin=subprocess.PIPE,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                env={**env, REPLY_FD: str(write_end)},
                pass_fds=(write_end,),
                text=True,
                encoding="utf-8",
            )
        except BaseException:
            os.close(read_end)
            raise
        finally:
            os.close(write_end)  # the child's now: its exit ends our reads
        self.replies = os.fdopen(read_end, "r", encoding="utf-8")
        self.lock = threading.Lock()
        self.gone = False
        """Set when a request found the process dead: the next one starts another."""

    def draw(self, spec: dict[str, Any]) -> str:
        reply = self.ask({"draw": spec})
        if "error" in reply:  # the child's `draw_here` says what could not be drawn
            raise ValueError(reply["error"])
        svg = reply.get("svg")
        if not isinstance(svg, str):
            raise RuntimeError("the chart process answered something other than a drawing")
        return svg

    def ask(
        self, request: dict[str, Any], meanwhile: Callable[[], None] | None = None
    ) -> dict[str, Any]:
        """One request line out, its reply line back; RuntimeError when the process is gone.
        `meanwhile` runs here once the request is out, while the child works on it."""
        assert self.proc.stdin is not None
        with self.lock:
            try:
                self.proc.stdin.write(json.dumps(request) + "\n")
                self.proc.stdin.flush()
            except (OSError, ValueError) as exc:
                # ValueError: its pipe closed under us (another thread replaced it).
                self.gone = True
                raise RuntimeError(f"the chart process is gone ({exc})") from exc
            try:
                if meanwhile is not None:
                    meanwhile()
            finally:
                # Read even when `meanwhile` raised: a reply left queued would answer the
                # next request.
                try:
                    line = self.replies.readline()
                except ValueError:
                    line = ""  # closed under us: as gone as an end of file
        if not line:
            self.gone = True
            raise RuntimeError(f"the chart process ended (exit {self.proc.poll()})")
        try:
            reply = json.loads(line)
        except ValueError:
            reply = None
        if not isinstance(reply, dict):
            raise RuntimeError(f"the chart process answered {line[:80]!r}, not a reply")
        return reply

    def stop(self) -> None:
        # Closing its input ends it; waiting reaps it, so its CPU counts as this process's.
        if self.proc.stdin is not None:
            try:
                self.proc.stdin.close()
            except OSError:
                pass  # a child already gone: its pipe cannot flush, and there is none to end
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.replies.close()


_running: list[_ChartProcess] = []
_lock = threading.Lock()


def warm_up() -> None:
    """Start the chart process, which imports what it draws with at once; the first real
    render then finds it ready. Later calls do nothing, and so
    does a call in the chart process itself."""
    if not _drawing_here:
        _process()


def render(spec: dict[str, Any]) -> str:
    """The SVG of a chart spec, drawn in the chart process (here, when this is it)."""
    if _drawing_here:
        return draw_here(spec)
    return _process().draw(spec)


def ask(request: dict[str, Any], meanwhile: Callable[[], None] | None = None) -> dict[str, Any]:
    """Hand the chart process one request of html's loop (`html.serve`) and wait for its reply;
    `meanwhile` (when given) runs in this process while the child works."""
    return _process().ask(request, meanwhile)


def shutdown() -> None:
    """Stop the chart process (done at exit too); the next render starts another."""
    with _lock:
        while _running:
            _running.pop().stop()


atexit.register(shutdown)


def _process() -> _ChartProcess:
    with _lock:
        if _running and _running[0].gone:
            # The last request found it dead (killed, or it died): that page went without
            # charts; this one gets a new process (a long `evalloop view` keeps its charts).
            _running.pop().stop()
        if not _running:
            _running.append(_ChartProcess())
        return _running[0]


_drawing_here = False
"""True in the chart process itself: `render` draws in place."""


def drawing_here() -> bool:
    """Whether this process is the chart process (`render` draws in place)."""
    return _drawing_here


def start_drawing_here() -> None:
    """Make this process the chart process (`html.serve`): pygal is imported now, before the
    first spec comes, and `render` draws here from then on."""
    global _drawing_here
    _drawing_here = True
    import pygal  # noqa: F401 -- outside the drawing's time limit: a slow disk is no failure

    try:
        draw_here(_WARM_UP_SPEC)
    except ValueError:
        pass  # only a warm-up: the first real drawing says what is wrong


DRAW_LIMIT_S = 10.0
"""A drawing that takes longer is stopped (a chart takes well under a second; a figure that
made pygal loop would hold the session's end for good)."""


class _TooLong(BaseException):
    """Raised into a drawing by the limit's alarm (a BaseException: no except in pygal eats it)."""


def draw_here(spec: dict[str, Any]) -> str:
    """Draw in this process (the chart process's own work); ValueError when the spec fails or
    the drawing takes over :data:`DRAW_LIMIT_S` (in the main thread, where the alarm lands)."""
    try:
        with _time_limit(DRAW_LIMIT_S):
            return _draw(spec)
    except _TooLong:
        raise ValueError(f"the chart could not be drawn in {DRAW_LIMIT_S:.0f} s") from None
    except Exception as exc:  # noqa: BLE001 -- a spec from the pipe can fail anywhere in pygal
        raise ValueError(f"the chart could not be drawn: {type(exc).__name__}: {exc}") from exc


@contextlib.contextmanager
def _time_limit(seconds: float) -> Iterator[None]:
    if threading.current_thread() is not threading.main_thread():
        yield  # a signal lands in the main thread only: no limit here
        return

    armed = [True]

    def expire(signum: int, frame: Any) -> None:
        if armed[0]:
            raise _TooLong

    before = signal.signal(signal.SIGALRM, expire)
    started = time.monotonic()
    # Whatever timer was set before (pytest-timeout's, say) is set again after, less the time
    # this took.
    earlier = (0.0, 0.0)
    try:
        # Set inside the try: an alarm due at once still finds the finally to undo it.
        earlier = signal.setitimer(signal.ITIMER_REAL, seconds)
        yield
    finally:
        while True:
            try:
                armed[0] = False  # an alarm from here on is ignored, never raised
                signal.setitimer(signal.ITIMER_REAL, 0)
                signal.signal(signal.SIGALRM, before)
                break
            except _TooLong:
                continue  # it landed before the line above: the drawing is done, undo again
        if earlier[0] > 0:
            left = max(earlier[0] - (time.monotonic() - started), 0.001)
            signal.setitimer(signal.ITIMER_REAL, left, earlier[1])


def _draw(spec: dict[str, Any]) -> str:
    kind = spec.get("chart") if isinstance(spec, dict) else None
    if kind == "stack":
        return "".join(_draw(part) for part in spec["charts"])
    draw = _DRAWERS.get(kind) if isinstance(kind, str) else None
    if draw is None:
        raise ValueError(f"no chart kind {kind!r} (one of: stack, {', '.join(_DRAWERS)})")
    return draw(spec)


def combined(specs: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Several charts in one request: one round trip to the chart process, their SVGs in order."""
    return {"chart": "stack", "charts": list(specs)}


def outcomes_by(counts: dict[tuple[str, str], int], title: str) -> dict[str, Any]:
    """Stacked bars: attempts per outcome, per group (tag, coverage, split); counts by
    (group, outcome), counted by the caller so the chart gets a few rows, not one per attempt."""
    rows = [[g, o, n] for (g, o), n in sorted(counts.items())]
    return {"chart": "outcomes_by", "title": title, "rows": rows}


def per_case(
    measures: Sequence[tuple[str, Sequence[tuple[str, float]]]], *, title: str
) -> dict[str, Any]:
    """One bar per case for each measure (cost, turns, wall time, recall...), side by side.

    `measures` are (header, [(case, value)]) pairs: a narrow chart per measure, in a row; the
    first carries `title` and the case names down its side, the others line up beside it. A
    value that cannot be drawn as it is (`drawn`) is left out or drawn at the edge, and a line
    below the row says how many, per measure.
    """
    kept = []
    for header, values in measures:
        shown, note = drawn([value for _, value in values])
        bars = [
            [case, value]
            for (case, _), value in zip(values, shown, strict=True)
            if value is not None
        ]
        if values:  # a column of values none of which could be drawn still says so
            kept.append([header, bars, note.removeprefix("; ")])
    return {"chart": "per_case", "title": title, "measures": kept}


def per_case_histogram(
    values: Sequence[tuple[str, float]], *, measure: str, title: str
) -> dict[str, Any]:
    """A histogram over cases of one measure: for runs with too many cases for a bar each.
    It counts the cases it draws; those it cannot draw (`drawn`) the title names."""
    shown, note = drawn([value for _, value in values])
    kept = [value for value in shown if value is not None]
    return {
        "chart": "histogram",
        "title": f"{title} (histogram over {len(kept)} cases{note})",
        "measure": measure,
        "bins": _bins(kept) if kept else [],
    }


# pygal's scale divides by a span and rounds to integers: a subnormal (5e-324) divided by zero and
# a value near the float's limit overflowed. A per-case measure (cost, turns, seconds, recall) has
# no meaning at either end, so it is drawn in this range, and the chart says so.
DRAWABLE = (1e-100, 1e100)


def drawn(values: Sequence[float]) -> tuple[list[float | None], str]:
    """Each value as a chart draws it (None: not drawn), and what the chart says of those it
    changed: "; 2 not finite, left out; 1 cut to ±1e+100" ('' when it changed none).

    Not finite (nan, inf, an int too large for a float): left out. Beyond the drawable range:
    at its edge. Closer to 0 than its low end: 0 (a bar's length cannot show it anyway).
    """
    low, high = DRAWABLE
    out: list[float | None] = []
    left_out = at_edge = 0
    for value in values:
        try:
            number = float(value)
        except (OverflowError, TypeError, ValueError):
            number = math.inf
        if not math.isfinite(number):
            out.append(None)
            left_out += 1
        elif abs(number) > high:
            out.append(math.copysign(high, number))
            at_edge += 1
        else:
            out.append(0.0 if abs(number) < low else number)
    note = f"; {left_out} not finite, left out" if left_out else ""
    if at_edge:
        note += f"; {at_edge} cut to ±{high:g}"
    return out, note


def _bins(values: Sequence[float], count: int = HISTOGRAM_BINS) -> list[dict[str, float]]:
    # Binned here: the chart gets 30 bars, whatever the run's size.
    low, high = min(values), max(values)
    if high - low <= 1e-9 * max(abs(low), abs(high)):
        # One value, to the float's precision (0.3 and 0.1 + 0.2): one bar in a span pygal can
        # scale. A span of a few ulps left its axis steps smaller than the ulp, and it spun.
        pad = max(0.5, 0.01 * max(abs(low), abs(high)))
        low, high = low - pad, high + pad
    width = (high - low) / count
    tally = [0] * count
    for value in values:
        tally[min(count - 1, int((value - low) / width))] += 1
    return [
        {"start": low + i * width, "end": low + (i + 1) * width, "cases": n}
        for i, n in enumerate(tally)
    ]


FLIP_COLOURS = {
    "better": "#2e7d32",
    "worse": "#c62828",
    "stable pass": "#81c784",
    "stable fail": "#e57373",
    "undecided after a pass": "#ef6c00",
    "unscored / neither": "#9e9e9e",
}


def flips(counts: dict[str, int], title: str) -> dict[str, Any]:
    """Bars of the flip table: better, worse, stable pass/fail, neither."""
    return {"chart": "flips", "title": title, "counts": [[k, v] for k, v in counts.items()]}


def history(points: Sequence[dict[str, Any]], changes: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """A set's pass rate per run over time, its 95% interval as a bar, each point labelled
    (run, date), and a dashed rule where a pin that breaks comparison changed (labelled with
    the pins): the line is broken there, one line per `segment`.

    `points`: `{run, label, order, segment, rate, low, high}` (rate in 0..1); `changes`:
    `{run, order, pins}`. The series are titled (:data:`HISTORY_SERIES`) in the legend, and
    their groups named (`history_line_marks`, `history_line_labels`, `history_break_marks`...).
    """
    return {"chart": "history", "points": list(points), "changes": list(changes)}


HISTORY_SERIES = ("95% interval", "pass rate", "a breaking pin changed")
HISTORY_TITLE = (
    "pass rate over time: complete whole-split runs only (95% Wilson interval; "
    "dashed: a breaking pin changed, the line breaks there)"
)

# --- drawing (the chart process), with pygal ----------------------------------------------

_BAR = "#1565c0"
_INTERVAL = "#90a4ae"
_BREAK = "#c62828"
_CASE_ROW = 12
"""Pixels per case in a per-case chart: its height grows with the cases (up to 100)."""
_LABEL_WIDTH = 200
"""The case names' column of the first per-case chart."""


def _chart(kind: str, colours: Sequence[str], names: Sequence[str] = (), **config: Any) -> Any:
    """A pygal chart of `kind` with the report's look: inline CSS only, no script, no
    declaration (the SVG goes into the page as markup), series coloured from `colours`.

    `names`, one per series: its marks' group gets the class `<name>_marks` and its printed
    labels' group `<name>_labels`, so a page (and a test) can find a series by what it is.
    """
    import pygal
    from pygal.style import Style

    style = Style(
        background="white",
        plot_background="white",
        foreground="#333",
        foreground_strong="#222",
        foreground_subtle="#ccc",
        font_family="system-ui, sans-serif",
        title_font_size=13,
        label_font_size=10,
        major_label_font_size=10,
        legend_font_size=11,
        value_label_font_size=9,
        colors=tuple(colours) or (_BAR,),
    )
    # Run text (a tag, a qid) is cut to 40 characters on an axis or in a legend (pygal keeps the
    # whole text in the label's tooltip), so a long one cannot squeeze the plot to nothing.
    config.setdefault("truncate_label", 40)
    config.setdefault("truncate_legend", 40)
    chart = getattr(pygal, kind)(
        style=style,
        js=[],
        disable_xml_declaration=True,
        explicit_size=True,
        margin=8,
        **config,
    )
    chart.add_xml_filter(_without_scripts)
    if names:
        chart.add_xml_filter(lambda root: _named_series(root, names))
    return chart


def _named_series(root: Any, names: Sequence[str]) -> Any:
    layers = {"plot": "_marks", "plot text-overlay": "_labels"}
    for layer in root.iter():
        suffix = layers.get(layer.get("class", ""))
        if suffix is None:
            continue
        for group in layer:
            classes = group.get("class", "")
            index = next((int(c[6:]) for c in classes.split() if c.startswith("serie-")), None)
            if index is not None and index < len(names):
                group.set("class", f"{classes} {names[index]}{suffix}")
    return root


def _without_scripts(root: Any) -> Any:
    # pygal writes its configuration (titles included) into a <script> for its tooltips; the
    # page needs no script in a chart, so none is left in (the charts show with scripts off).
    parents = [(parent, child) for parent in root.iter() for child in parent]
    for parent, child in parents:
        if isinstance(child.tag, str) and child.tag.rsplit("}", 1)[-1] == "script":
            parent.remove(child)
    return root


def _svg(chart: Any) -> str:
    svg: str = chart.render(is_unicode=True)
    return svg


def _draw_outcomes_by(spec: dict[str, Any]) -> str:
    rows = [(str(g), str(o), int(n)) for g, o, n in spec["rows"]]
    groups = sorted({g for g, _, _ in rows})
    words = [w for w in OUTCOME_COLOURS if any(o == w for _, o, _ in rows)]
    words += sorted({o for _, o, _ in rows} - set(words))
    counts = {(g, o): n for g, o, n in rows}
    chart = _chart(
        "HorizontalStackedBar",
        [OUTCOME_COLOURS.get(w, _BAR) for w in words],
        # The unit in the title, not as an axis title: pygal wraps an axis title to the plot's
        # width, and a long tag left it none (a 200-character tag: 100 s, then MemoryError).
        title=f"{spec['title']} (attempts)",
        # Room for the legend down the left, a row a word, and for the bars.
        height=90 + max(26 * len(groups), 18 * len(words)),
        width=_WIDTH + 120,
    )
    # pygal draws the first label at the bottom: reversed, the groups read top down.
    chart.x_labels = list(reversed(groups))
    for word in words:
        chart.add(word, [counts.get((g, word)) for g in reversed(groups)])
    return _svg(chart)


def _draw_per_case(spec: dict[str, Any]) -> str:
    measures = spec["measures"]
    if not measures:
        return ""
    # Every case any column has a value for, in order: a case with no cost still has turns.
    cases = list(dict.fromkeys(str(case) for _, values, _ in measures for case, _ in values))
    height = 60 + _CASE_ROW * len(cases)
    out = []
    for i, (header, values, _) in enumerate(measures):
        first = i == 0
        title = f"{spec['title']}\n{header}" if first else f" \n{header}"
        chart = _chart(
            "HorizontalBar",
            [_BAR],
            title=title,
            width=_FACET_WIDTH + (_LABEL_WIDTH if first else 0),
            height=height,
            show_legend=False,
            # A horizontal chart's categories are its y labels to pygal.
            show_y_labels=first,
            # ... and its values' ticks its y labels: three, so a narrow column stays legible.
            y_labels=_three_ticks([float(value) for _, value in values]),
            value_formatter=lambda v: f"{v:.3g}",
        )
        by_case = {str(case): float(value) for case, value in values}
        chart.x_labels = list(reversed(cases))
        chart.add(str(header), [by_case.get(case) for case in reversed(cases)])
        out.append(_svg(chart))
    # Our own markup around pygal's: the measures side by side (report.css: .chart-row), and
    # below them what a column left out or cut, where no column's title grows taller than its
    # neighbours' (the bars of every column line up with the first column's case names).
    notes = [f"{header}: {note}" for header, _, note in measures if note]
    said = f'<p class="chart-note">{escape("; ".join(notes))}</p>' if notes else ""
    return '<div class="chart-row">' + "".join(out) + "</div>" + said


def _three_ticks(values: Sequence[float]) -> list[float]:
    low, high = min([0.0, *values]), max([0.0, *values])
    if high == low:
        high = low + 1.0
    return [low, (low + high) / 2, high]


def _draw_histogram(spec: dict[str, Any]) -> str:
    if not spec["bins"]:
        return ""  # no case's value could be drawn
    chart = _chart(
        "Histogram",
        [_BAR],
        title=str(spec["title"]),
        width=_WIDTH,
        height=200,
        show_legend=False,
        x_title=str(spec["measure"]),
        y_title="cases",
    )
    chart.add(
        "cases", [(int(b["cases"]), float(b["start"]), float(b["end"])) for b in spec["bins"]]
    )
    return _svg(chart)


def _draw_flips(spec: dict[str, Any]) -> str:
    counts = {str(group): int(n) for group, n in spec["counts"]}
    groups = [g for g in FLIP_COLOURS if g in counts] + [g for g in counts if g not in FLIP_COLOURS]
    chart = _chart(
        "HorizontalBar",
        [_BAR],
        title=f"{spec['title']} (cases)",
        width=_WIDTH,
        height=80 + 24 * len(groups),
        show_legend=False,
    )
    chart.x_labels = list(reversed(groups))
    chart.add(
        "cases",
        [{"value": counts[g], "color": FLIP_COLOURS.get(g, _BAR)} for g in reversed(groups)],
    )
    return _svg(chart)


def _draw_history(spec: dict[str, Any]) -> str:
    points, changes = spec["points"], spec["changes"]
    interval: list[Any] = []
    for p in points:
        interval += [(float(p["order"]), float(p["low"])), (float(p["order"]), float(p["high"]))]
        interval.append(None)
    # One series for the line, broken (None) wherever the segment changes: a pin break is
    # never bridged, and the legend stays three rows however many breaks (one series per
    # segment gave pygal a legend taller than the chart at 25 segments, and it never returned).
    line: list[Any] = []
    for i, p in enumerate(points):
        if i and points[i - 1]["segment"] != p["segment"]:
            line.append(None)
        line.append({"value": (float(p["order"]), float(p["rate"])), "label": str(p["label"])})
    rules: list[Any] = []
    for c in changes:
        # Labelled at its foot: pass rates crowd the top, where the points' labels are.
        rules += [{"value": (float(c["order"]), 0.0), "label": c["pins"]}, (float(c["order"]), 1.0)]
        rules.append(None)
    chart = _chart(
        "XY",
        [_INTERVAL, _BAR, _BREAK],
        ["history_interval", "history_line", "history_break"],
        title=HISTORY_TITLE,
        width=_WIDTH + 120,
        height=260,
        margin_right=90,  # the newest point's label runs to the right of it
        range=(0, 1),
        allow_interruptions=True,
        print_labels=True,
        show_x_labels=False,
        legend_at_bottom=True,
        legend_at_bottom_columns=3,
        truncate_legend=-1,
        margin_bottom=24,  # pygal sets the legend's row on the bottom edge: room below it
        x_title="run (oldest first)",
        y_title="pass rate",
        value_formatter=lambda v: f"{v:.0%}",
    )
    interval_name, line_name, break_name = HISTORY_SERIES
    chart.add(interval_name, interval, show_dots=False)
    chart.add(line_name, line, dots_size=3)
    # Dots too small to see: pygal prints a value's label (the pins) at its dot.
    chart.add(break_name, rules, dots_size=0.5, stroke_style={"dasharray": "4, 3"})
    return _svg(chart)


_DRAWERS: dict[str, Callable[[dict[str, Any]], str]] = {
    "outcomes_by": _draw_outcomes_by,
    "per_case": _draw_per_case,
    "histogram": _draw_histogram,
    "flips": _draw_flips,
    "history": _draw_history,
}
