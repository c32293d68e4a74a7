"""What a run costs against the caching-faithful fake, before and after issue 31's breakpoints.

    .venv/bin/python bench/cost.py [--cases N]

Runs the synthetic copy of the example set (`workload`: five answerer turns over the embedded
target's real 3 KB context results, one judge call per case) once through pytest against the
in-process fake, keeping every request body in arrival order. The bodies are then replayed
through fresh copies of the fake's prompt cache (the API's rules: per-model floor, look-back,
TTL) under three markings, and priced at the list prices (`model_api.pricing`):

- ``after``: as this version sends them (tools, system, and the two moving breakpoints);
- ``before``: the earlier marking (the last tool and the system prompt only);
- ``uncached``: no ``cache_control`` at all.

It prints the answerer's cache-read share of input tokens on turns 2+, the judge's after the
first case, the cost per case and the whole run's cost under each marking.
"""

from __future__ import annotations

import argparse
import copy
import os
import subprocess
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import workload  # noqa: E402

from pytest_evalloop.model_api.pricing import PriceTable, Usage  # noqa: E402
from pytest_evalloop.testing import FakeAnthropic, FakeRequest, Outcome, ScriptSpec  # noqa: E402
from pytest_evalloop.testing.messages_api import PromptCache  # noqa: E402


@dataclass
class Sent:
    role: str | None
    model: str
    turn: int | None
    body: dict[str, Any]


@dataclass
class Recorder:
    """The workload's policy, keeping each request as it came."""

    policy: Callable[[FakeRequest], Outcome]
    sent: list[Sent] = field(default_factory=list)

    def __call__(self, request: FakeRequest) -> Outcome:
        body = copy.deepcopy(dict(request.body))
        self.sent.append(Sent(request.role, request.model, request.turn, body))
        return self.policy(request)


def _unmark(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _unmark(v) for k, v in value.items() if k != "cache_control"}
    if isinstance(value, list):
        return [_unmark(v) for v in value]
    return value


def before(body: dict[str, Any]) -> dict[str, Any]:
    """The marking before issue 31: the last tool and the system prompt, nothing in messages."""
    out = dict(body)
    out.pop("cache_control", None)
    out["messages"] = _unmark(body.get("messages"))
    return out


def uncached(body: dict[str, Any]) -> dict[str, Any]:
    return _unmark(body)


@dataclass
class Figures:
    usage: dict[str, Usage] = field(default_factory=dict)
    share_inputs: dict[str, list[tuple[int, int]]] = field(default_factory=dict)


def replay(sent: list[Sent], marking: Callable[[dict[str, Any]], dict[str, Any]]) -> Figures:
    cache = PromptCache(clock=lambda: 0.0)  # the whole run inside one TTL, as it ran
    out = Figures()
    judged = 0
    for s in sent:
        role = s.role or "?"
        u = cache.usage(marking(s.body))
        usage = out.usage.setdefault(role, Usage())
        usage.add(
            Usage(
                input_tokens=u.input_tokens,
                cache_read_tokens=u.cache_read_input_tokens,
                cache_creation_tokens=u.cache_creation_input_tokens,
                output_tokens=30,  # the same in every marking; the workload's replies are short
                calls=1,
            )
        )
        total = u.input_tokens + u.cache_read_input_tokens + u.cache_creation_input_tokens
        counted = (role == "answerer" and (s.turn or 1) >= 2) or (role == "judge" and judged > 0)
        if role == "judge":
            judged += 1
        if counted:
            out.share_inputs.setdefault(role, []).append((u.cache_read_input_tokens, total))
    return out


def share(pairs: list[tuple[int, int]]) -> float:
    read = sum(r for r, _ in pairs)
    total = sum(t for _, t in pairs)
    return read / total if total else 0.0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", type=int, default=20)
    parser.add_argument("--answerer-model", default=None, help="--eval-answerer-model to run")
    args = parser.parse_args(argv)
    root = Path(tempfile.mkdtemp(prefix="evalloop-cost-"))
    set_dir = workload.make_set(root, args.cases)
    spec = ScriptSpec.model_validate(workload.script_spec(set_dir / "cases.jsonl", 0.0))
    recorder = Recorder(spec.policy())
    with FakeAnthropic(recorder) as fake:
        env = {**os.environ, **fake.env(), "PYTHONPATH": os.pathsep.join(sys.path)}
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "pytest",
                str(set_dir),
                "-p",
                "no:cacheprovider",
                "-q",
                *([f"--eval-answerer-model={args.answerer_model}"] if args.answerer_model else []),
            ],
            cwd=root,
            env=env,
            capture_output=True,
            text=True,
            timeout=900,
        )
    if done.returncode != 0:
        print(done.stdout[-3000:], done.stderr[-2000:], sep="\n")
        return 1
    models = {s.role: s.model for s in recorder.sent}
    prices = PriceTable()
    rows = []
    for name, marking in (("before", before), ("after", lambda b: b), ("uncached", uncached)):
        found = replay(recorder.sent, marking)
        costs = {r: prices.cost(models[r], u) or 0.0 for r, u in found.usage.items()}
        total = sum(costs.values())
        rows.append(
            (
                name,
                share(found.share_inputs.get("answerer", [])),
                share(found.share_inputs.get("judge", [])),
                costs.get("answerer", 0.0) / args.cases,
                costs.get("judge", 0.0) / args.cases,
                total,
            )
        )
    print(
        f"{args.cases} cases, answerer {models.get('answerer')}, judge {models.get('judge')}, "
        f"{len(recorder.sent)} requests"
    )
    print(
        "| marking | answerer cache-read share, turns 2+ | judge cache-read share, after case 1 "
        "| answerer $/case | judge $/case | run $ |"
    )
    print("|---|---|---|---|---|---|")
    for name, a, j, ac, jc, total in rows:
        print(f"| {name} | {a:.1%} | {j:.1%} | {ac:.4f} | {jc:.4f} | {total:.4f} |")
    base = rows[0][5]
    after = rows[1][5]
    print(f"run cost drop, before -> after: {(base - after) / base:.1%}" if base else "")
    return 0


if __name__ == "__main__":
    sys.exit(main())
