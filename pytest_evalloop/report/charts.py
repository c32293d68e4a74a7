"""The report's charts: Vega-Lite specs, rendered to inline SVG by vl-convert.

Each chart is a pure function from the report's figures to a Vega-Lite spec; :func:`render`
turns a spec into an SVG string with `vl-convert-python` (Vega's own renderer, run in an
embedded JavaScript engine inside the wheel: no browser, no network, no script in the file).
The SVG goes into the page as markup, so a report opens offline and shows its charts even
where scripts are blocked. The drawing happens in one child process (see `_ChartProcess`),
which also writes a session's reports when its runs close (`html.session_outputs_aside`).

Run text never reaches a chart as markup: a qid or a tag is a data value, and Vega writes
data values into SVG text nodes escaped. Per-case charts show one bar per case up to
:data:`PER_CASE_BARS` cases and a histogram over cases above that, so a 10,000-case run draws
a few dozen marks per chart, not 10,000.
"""

from __future__ import annotations

import atexit
import json
import os
import subprocess
import sys
import threading
from collections.abc import Callable, Sequence
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
_FACET_WIDTH = 120


_WARM_UP_SPEC: dict[str, Any] = {"mark": "point", "data": {"values": [{"x": 0}]}, "encoding": {}}


REPLY_FD = "EVALLOOP_CHART_REPLY_FD"
"""The environment variable naming the chart process's reply pipe (`html.serve` takes it)."""


class _ChartProcess:
    """One child process that draws: a JSON request per line in on its stdin, a JSON reply
    per line out on a pipe of its own (never its stdout: whatever a `sitecustomize` or the
    report's code prints goes nowhere, and cannot pass for a reply).

    Why a process: vl-convert holds the GIL while it draws (measured: a Python thread beside
    its first render runs at 1% of its speed for 0.65 s), so in this process it would stall the
    pipelines' event loop, and its JavaScript engine would add ~110 MB to this process. A
    plain `python -c` child, not a multiprocessing pool: a spawned pool re-imports the parent's
    main script, and a fork would copy this process's threads mid-flight.
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
            except OSError as exc:
                raise RuntimeError(f"the chart process is gone ({exc})") from exc
            try:
                if meanwhile is not None:
                    meanwhile()
            finally:
                # Read even when `meanwhile` raised: a reply left queued would answer the
                # next request.
                line = self.replies.readline()
        if not line:
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
    """Start the chart process, which starts its engine at once (about a second, once per
    process); the first real render then finds it running. Later calls do nothing, and so
    does a call in the chart process itself."""
    if not _drawing_here:
        _process()


def render(spec: dict[str, Any]) -> str:
    """The SVG of a Vega-Lite spec, drawn in the chart process (here, when this is it)."""
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
        if not _running:
            _running.append(_ChartProcess())
        return _running[0]


_drawing_here = False
"""True in the chart process itself: `render` draws in place."""


def start_drawing_here() -> None:
    """Make this process the chart process (`html.serve`): the engine starts now, before the
    first spec comes, and `render` draws here from then on."""
    global _drawing_here
    _drawing_here = True
    draw_here(_WARM_UP_SPEC)


def draw_here(spec: dict[str, Any]) -> str:
    """Draw in this process (the chart process's own work); ValueError when the spec fails."""
    import vl_convert

    try:
        svg: str = vl_convert.vegalite_to_svg(spec)
    except Exception as exc:  # noqa: BLE001 -- vl-convert's own errors name no common type
        raise ValueError(f"the chart could not be drawn: {type(exc).__name__}: {exc}") from exc
    return svg


def combined(specs: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Several charts stacked into one spec: one render call (vl-convert's cost is per call)."""
    parts = [{k: v for k, v in s.items() if k != "$schema"} for s in specs]
    return {
        "$schema": "https://vega.github.io/schema/vega-lite/v5.json",
        "vconcat": parts,
        "spacing": 28,
        "resolve": {"scale": {"color": "independent"}},
    }


def outcomes_by(counts: dict[tuple[str, str], int], title: str) -> dict[str, Any]:
    """Stacked bars: attempts per outcome, per group (tag, coverage, split); counts by
    (group, outcome), counted by the caller so Vega gets a few rows, not one per attempt."""
    words = [w for w in OUTCOME_COLOURS if any(o == w for _, o in counts)]
    values = [{"group": g, "outcome": o, "n": n} for (g, o), n in sorted(counts.items())]
    return {
        "$schema": "https://vega.github.io/schema/vega-lite/v5.json",
        "title": title,
        "width": _WIDTH,
        "data": {"values": values},
        "mark": "bar",
        "encoding": {
            "y": {"field": "group", "type": "nominal", "title": None, "sort": "ascending"},
            "x": {"aggregate": "sum", "field": "n", "type": "quantitative", "title": "attempts"},
            "color": {
                "field": "outcome",
                "type": "nominal",
                "scale": {"domain": words, "range": [OUTCOME_COLOURS[w] for w in words]},
            },
            "order": {"field": "outcome", "type": "nominal"},
        },
    }


def per_case(
    measures: Sequence[tuple[str, Sequence[tuple[str, float]]]], *, title: str
) -> dict[str, Any]:
    """One bar per case for each measure (cost, turns, wall time, recall...), side by side.

    `measures` are (axis title, [(case, value)]) pairs. One faceted chart, not one chart per
    measure: the case names down its side are laid out once for all measures. Vega measures
    every label's text to lay an axis out, and that is most of a render's cost (measured:
    0.7 s of CPU for 100 labels, 0.08 s for the same chart without them), so five charts with
    their own labels cost five times the one.
    """
    order = [axis for axis, values in measures if values]
    data = [
        {"case": case, "measure": axis, "value": value}
        for axis, values in measures
        for case, value in values
    ]
    return {
        "$schema": "https://vega.github.io/schema/vega-lite/v5.json",
        "title": title,
        "data": {"values": data},
        "facet": {"column": {"field": "measure", "type": "nominal", "sort": order, "title": None}},
        "spec": {
            "width": _FACET_WIDTH,
            "height": {"step": 12},
            "mark": {"type": "bar", "color": "#1565c0"},
            "encoding": {
                "y": {"field": "case", "type": "nominal", "title": None, "sort": None},
                "x": {"field": "value", "type": "quantitative", "title": None},
            },
        },
        "resolve": {"scale": {"x": "independent"}},
    }


def per_case_histogram(
    values: Sequence[tuple[str, float]], *, measure: str, title: str
) -> dict[str, Any]:
    """A histogram over cases of one measure: for runs with too many cases for a bar each."""
    return {
        "$schema": "https://vega.github.io/schema/vega-lite/v5.json",
        "title": f"{title} (histogram over {len(values)} cases)",
        "width": _WIDTH,
        "data": {"values": _bins([value for _, value in values])},
        "mark": {"type": "bar", "color": "#1565c0"},
        "encoding": {
            "x": {"field": "start", "type": "quantitative", "title": measure},
            "x2": {"field": "end"},
            "y": {"field": "cases", "type": "quantitative", "title": "cases"},
        },
    }


def _bins(values: Sequence[float], count: int = HISTOGRAM_BINS) -> list[dict[str, float]]:
    # Binned here, not by Vega: its dataflow over 10,000 values per chart costs a second.
    low, high = min(values), max(values)
    width = (high - low) / count or 1.0
    tally = [0] * count
    for value in values:
        tally[min(count - 1, int((value - low) / width))] += 1
    return [
        {"start": low + i * width, "end": low + (i + 1) * width, "cases": n}
        for i, n in enumerate(tally)
    ]


def flips(counts: dict[str, int], title: str) -> dict[str, Any]:
    """Bars of the flip table: better, worse, stable pass/fail, neither."""
    colours = {
        "better": "#2e7d32",
        "worse": "#c62828",
        "stable pass": "#81c784",
        "stable fail": "#e57373",
        "undecided after a pass": "#ef6c00",
        "unscored / neither": "#9e9e9e",
    }
    return {
        "$schema": "https://vega.github.io/schema/vega-lite/v5.json",
        "title": title,
        "width": _WIDTH,
        "data": {"values": [{"group": k, "cases": v} for k, v in counts.items()]},
        "mark": "bar",
        "encoding": {
            "y": {"field": "group", "type": "nominal", "title": None, "sort": list(colours)},
            "x": {"field": "cases", "type": "quantitative", "title": "cases"},
            "color": {
                "field": "group",
                "type": "nominal",
                "legend": None,
                "scale": {"domain": list(colours), "range": list(colours.values())},
            },
        },
    }


def history(points: Sequence[dict[str, Any]], changes: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """A set's pass rate per run over time, its 95% interval as a bar, each point labelled
    (run, date), and a dashed rule where a pin that breaks comparison changed (labelled with
    the pins): the line is broken there, one line per `segment`.

    `points`: `{run, label, order, segment, rate, low, high}` (rate in 0..1); `changes`:
    `{run, order, pins}`. The marks are named (`history_line`, `history_point_label`,
    `history_break`) so a test can find them in the SVG.
    """
    x = {
        "field": "order",
        "type": "quantitative",
        "title": "run (oldest first)",
        "axis": {"tickMinStep": 1, "labels": False, "ticks": False},
    }
    y = {
        "field": "rate",
        "type": "quantitative",
        "title": "pass rate",
        "scale": {"domain": [0, 1]},
        "axis": {"format": ".0%"},
    }
    layers: list[dict[str, Any]] = [
        {
            "data": {"values": list(points)},
            "mark": {"type": "rule", "color": "#90a4ae"},
            "encoding": {
                "x": x,
                "y": {"field": "low", "type": "quantitative"},
                "y2": {"field": "high"},
            },
        },
        {
            "name": "history_line",
            "data": {"values": list(points)},
            "mark": {"type": "line", "point": True, "color": "#1565c0"},
            # One line per segment: a pin break is never bridged.
            "encoding": {
                "x": x,
                "y": y,
                "detail": {"field": "segment", "type": "nominal"},
                "tooltip": [{"field": "label"}, {"field": "rate", "format": ".1%"}],
            },
        },
        {
            "name": "history_point_label",
            "data": {"values": list(points)},
            "mark": {
                "type": "text",
                "angle": 300,
                "align": "left",
                # Started clear of the point, so a line rising from it never crosses the label.
                "dx": 10,
                "dy": 0,
                "fontSize": 9,
                "color": "#333",
            },
            "encoding": {"x": x, "y": y, "text": {"field": "label"}},
        },
    ]
    if changes:
        layers.append(
            {
                "name": "history_break",
                "data": {"values": list(changes)},
                "mark": {"type": "rule", "strokeDash": [4, 3], "color": "#c62828"},
                "encoding": {"x": {**x, "field": "order"}},
            }
        )
        layers.append(
            {
                "data": {"values": list(changes)},
                "mark": {
                    "type": "text",
                    "align": "left",
                    "dx": 3,
                    "dy": -4,
                    "color": "#c62828",
                    "fontSize": 9,
                },
                "encoding": {
                    "x": {**x, "field": "order"},
                    "y": {"value": 8},
                    "text": {"field": "pins"},
                },
            }
        )
    return {
        "$schema": "https://vega.github.io/schema/vega-lite/v5.json",
        "title": "pass rate over time: complete whole-split runs only (95% Wilson interval; "
        "dashed: a breaking pin changed, the line breaks there)",
        "width": _WIDTH,
        "height": 220,
        "layer": layers,
    }
