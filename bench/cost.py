"""What a run costs against the caching-faithful fake, before and after issue 31's breakpoints.

    .venv/bin/python bench/cost.py [--cases N] [--answerer-model M] [--judge-samples J]
                                   [--profile embedded|malloy]

Runs a synthetic copy of an example set once through pytest against the in-process fake,
keeping every request body in arrival order: `--profile embedded` (the default) is the README's
example set on the embedded target (`workload`: five answerer turns over its real 3 KB context
results), `malloy` the Malloy set through Publisher's tools (`malloy`'s script of the same
shape); each case gets J judge calls (`--eval-judge-samples`). The bodies are then replayed
through fresh copies of the fake's prompt cache (the API's rules: per-model floor, look-back,
TTL) under these markings, and priced at the list prices (`model_api.pricing`):

- ``before``: the earlier marking (the last tool and the system prompt only);
- ``after``: as this version sends them (tools, system, the answerer's two moving breakpoints,
  the judge's case prompt when J > 1);
- ``ceiling``: the best any marking could reach: each request reads the longest prefix an
  earlier request of the run shares with it, when that prefix reaches the model's floor (no
  breakpoint count or look-back limit; cache reads only, so it has no cost column);
- ``uncached``: no ``cache_control`` at all.

It prints the answerer's cache-read share of input tokens on turns 2+, the judge's after the
first case (every judge call of the cases after the first), the cost per case and the whole
run's cost under each marking.
"""

from __future__ import annotations

import argparse
import copy
import os
import re
import subprocess
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import workload  # noqa: E402

from pytest_evalloop.model_api.caching import min_cacheable_tokens  # noqa: E402
from pytest_evalloop.model_api.pricing import PriceTable, Usage  # noqa: E402
from pytest_evalloop.testing import FakeAnthropic, FakeRequest, Outcome, ScriptSpec  # noqa: E402
from pytest_evalloop.testing.messages_api import (  # noqa: E402
    FRAMING_TOKENS,
    CacheUsage,
    PromptCache,
    prefix_points,
)

_CASE_HEAD = re.compile(r"^Case (\S+)\. ", re.M)


@dataclass
class Sent:
    role: str | None
    model: str
    turn: int | None
    body: dict[str, Any]
    case: str
    """The judge's case (its prompt's qid); the answerer's question."""


@dataclass
class Recorder:
    """The workload's policy, keeping each request as it came."""

    policy: Callable[[FakeRequest], Outcome]
    sent: list[Sent] = field(default_factory=list)

    def __call__(self, request: FakeRequest) -> Outcome:
        body = copy.deepcopy(dict(request.body))
        found = _CASE_HEAD.search(request.user_text)
        case = found.group(1) if found and request.role == "judge" else request.question
        self.sent.append(Sent(request.role, request.model, request.turn, body, case))
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


class Ceiling:
    """The best cache any marking could give: a request reads the longest prefix (at a block
    boundary) that an earlier request of the run sent too, if that prefix reaches the floor
    (there some earlier request could have written it)."""

    def __init__(self) -> None:
        self.seen: set[str] = set()

    def usage(self, body: dict[str, Any]) -> CacheUsage:
        points = prefix_points(body)
        floor = min_cacheable_tokens(str(body.get("model")))
        read = max((p.end for p in points if p.key in self.seen and p.end >= floor), default=0)
        self.seen.update(p.key for p in points)
        total = (points[-1].end if points else 0) + FRAMING_TOKENS
        return CacheUsage(total - read, 0, read)


def replay(
    sent: list[Sent],
    marking: Callable[[dict[str, Any]], dict[str, Any]],
    cache: PromptCache | Ceiling | None = None,
) -> Figures:
    cache = cache or PromptCache(clock=lambda: 0.0)  # the whole run inside one TTL, as it ran
    out = Figures()
    first_case = next((s.case for s in sent if s.role == "judge"), None)
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
        counted = (role == "answerer" and (s.turn or 1) >= 2) or (
            role == "judge" and s.case != first_case
        )
        if counted:
            out.share_inputs.setdefault(role, []).append((u.cache_read_input_tokens, total))
    return out


def share(pairs: list[tuple[int, int]]) -> float:
    read = sum(r for r, _ in pairs)
    total = sum(t for _, t in pairs)
    return read / total if total else 0.0


def _set_and_script(profile: str, root: Path, cases: int) -> tuple[Path, dict[str, Any]]:
    spec: dict[str, Any]
    if profile == "malloy":
        import malloy

        set_dir = malloy.malloy_set(root, cases)
        spec = workload.script_spec(set_dir / "cases.jsonl", 0.0)
        spec["answerer"] = {"default": malloy.PUBLISHER_SCRIPT}
        return set_dir, spec
    set_dir = workload.make_set(root, cases)
    return set_dir, workload.script_spec(set_dir / "cases.jsonl", 0.0)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", type=int, default=20)
    parser.add_argument("--answerer-model", default=None, help="--eval-answerer-model to run")
    parser.add_argument("--judge-samples", type=int, default=1, help="--eval-judge-samples")
    parser.add_argument("--profile", choices=("embedded", "malloy"), default="embedded")
    args = parser.parse_args(argv)
    root = Path(tempfile.mkdtemp(prefix="evalloop-cost-"))
    set_dir, script = _set_and_script(args.profile, root, args.cases)
    spec = ScriptSpec.model_validate(script)
    recorder = Recorder(spec.policy())
    with FakeAnthropic(recorder) as fake:
        env = {**os.environ, **fake.env(), "PYTHONPATH": os.pathsep.join(sys.path)}
        env.pop("PYTEST_ADDOPTS", None)
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "pytest",
                str(set_dir),
                "-p",
                "no:cacheprovider",
                "-q",
                f"--eval-judge-samples={args.judge_samples}",
                *([f"--eval-answerer-model={args.answerer_model}"] if args.answerer_model else []),
            ],
            cwd=root,
            env=env,
            capture_output=True,
            text=True,
            timeout=1800,
        )
    if done.returncode != 0:
        print(done.stdout[-3000:], done.stderr[-2000:], sep="\n")
        return 1
    models = {s.role: s.model for s in recorder.sent}
    prices = PriceTable()
    rows = []
    markings: list[tuple[str, Callable[[dict[str, Any]], dict[str, Any]], Ceiling | None]] = [
        ("before", before, None),
        ("after", lambda b: b, None),
        ("ceiling", uncached, Ceiling()),
        ("uncached", uncached, None),
    ]
    for name, marking, cache in markings:
        found = replay(recorder.sent, marking, cache)
        costs = {r: prices.cost(models[r], u) or 0.0 for r, u in found.usage.items()}
        priced = cache is None  # the ceiling counts reads only: it has no price
        rows.append(
            (
                name,
                share(found.share_inputs.get("answerer", [])),
                share(found.share_inputs.get("judge", [])),
                costs.get("answerer", 0.0) / args.cases if priced else None,
                costs.get("judge", 0.0) / args.cases if priced else None,
                sum(costs.values()) if priced else None,
            )
        )
    answerer, judge = models.get("answerer"), models.get("judge")
    print(
        f"{args.cases} cases ({args.profile}), answerer {answerer} (floor "
        f"{min_cacheable_tokens(answerer or '?'):,}), judge {judge} (floor "
        f"{min_cacheable_tokens(judge or '?'):,}), {args.judge_samples} judge sample(s), "
        f"{len(recorder.sent)} requests"
    )
    print(
        "| marking | answerer cache-read share, turns 2+ | judge cache-read share, after case 1 "
        "| answerer $/case | judge $/case | run $ |"
    )
    print("|---|---|---|---|---|---|")

    def money(value: float | None) -> str:
        return "—" if value is None else f"{value:.4f}"

    for name, a, j, ac, jc, total in rows:
        print(f"| {name} | {a:.1%} | {j:.1%} | {money(ac)} | {money(jc)} | {money(total)} |")
    base, after = rows[0][5], rows[1][5]
    if base and after is not None:
        print(f"run cost drop, before -> after: {(base - after) / base:.1%}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
