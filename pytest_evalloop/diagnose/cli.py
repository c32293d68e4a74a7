"""`evalloop diagnose <run>`, `evalloop issues <run>`, `evalloop issue <run> <id> --status S`.

Exit statuses: 0 done; 2 a usage error (not a run, a broken set, the run still running, an
unknown issue); 3 the endpoint failed (a harness error: nothing diagnosed is written).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pytest_evalloop.ledger import contract as ledger
from pytest_evalloop.ledger import files
from pytest_evalloop.ledger.vocabulary import ALL_COMPONENTS

EXIT_OK = 0
EXIT_USAGE = 2
EXIT_HARNESS = 3
DEFAULT_MODEL = "claude-opus-4-6"
NEXT_STEP = {
    "model": "evalloop improve (only model-owned issues go to an edit)",
    "dataset": "the golden side door: evalloop golden repair / hold (or fix the case)",
    "retrieval": "the retrieval engine's owners (not a model edit)",
    "agent-skill": "the answerer's skill or prompt owners (not a model edit)",
    "judge": "a person's review in evalloop view (the rows match the golden; each review is a "
    "fixture of the judge's agreement figures; never a model edit)",
}


def _fail(command: str, message: str, code: int = EXIT_USAGE) -> int:
    print(f"evalloop {command}: {message}", file=sys.stderr)
    return code


def _run_dir(command: str, text: str) -> Path | None:
    path = Path(text)
    refused = files.not_a_run(path)  # no run.json, or a ledger file that is a pipe, a link...
    if refused:
        _fail(command, refused)
        return None
    return path


# --- diagnose ----------------------------------------------------------------------------


def diagnose_main(
    argv: list[str],
    *,
    views: Callable[[Path], Path | None] | None = None,
    wrap: Callable[[Any], Any] | None = None,
) -> int:
    """`evalloop diagnose`. `views` rewrites the run's report once the issue events are
    written (the command line and the loop pass the report's own function: a layer this one
    may not import); `wrap` wraps the Messages API client (the loop's budget reserves each
    call through it)."""
    parser = argparse.ArgumentParser(prog="evalloop diagnose", description=__doc__)
    parser.add_argument("run_dir")
    parser.add_argument("--set", dest="set_dir", help="The set directory (default: <run>/../..)")
    parser.add_argument("--model", default=DEFAULT_MODEL, help="The diagnose agent's model")
    parser.add_argument("--max-cases", type=int, default=None, help="Diagnose at most N cases")
    parser.add_argument("--target", help="MCP URL or command for probes (default: embedded)")
    parser.add_argument("--tool-profile", help="The target's tool profile")
    parser.add_argument("--no-probes", action="store_true", help="Offer the agent no tools")
    parser.add_argument("--rpm", type=int, help="Requests per minute (default: the run's)")
    parser.add_argument("--tpm", type=int, help="Tokens per minute (default: the run's)")
    parser.add_argument("--retries", type=int, default=4)
    parser.add_argument("--timeout", type=float, default=300.0)
    parser.add_argument("--prices", type=Path, help="A price table (as --eval-prices)")
    args = parser.parse_args(argv)
    run_dir = _run_dir("diagnose", args.run_dir)
    if run_dir is None:
        return EXIT_USAGE
    if args.max_cases is not None and args.max_cases < 0:
        return _fail("diagnose", f"--max-cases must be >= 0, got {args.max_cases}")
    set_dir = Path(args.set_dir) if args.set_dir else run_dir.parent.parent
    if not (set_dir / "set.json").is_file():
        return _fail("diagnose", f"{set_dir} has no set.json; name the set with --set")
    import logging

    from pytest_evalloop.diagnose.conductor import DiagnoseError
    from pytest_evalloop.failures import HarnessError

    # The MCP SDK turns logging on at INFO; each HTTP request line is noise on this screen.
    for name in ("httpx", "httpx2"):
        logging.getLogger(name).setLevel(logging.WARNING)
    try:
        result = asyncio.run(_diagnose(args, run_dir, set_dir, wrap))
    except DiagnoseError as exc:
        return _fail("diagnose", str(exc))
    except HarnessError as exc:
        return _fail("diagnose", f"harness error, nothing written: {exc}", EXIT_HARNESS)
    print("\n".join(report_lines(result, run_dir)))
    if views is not None:
        try:
            written = views(run_dir)
        except (OSError, ValueError) as exc:
            print(f"report: not rewritten ({exc}); `evalloop report {run_dir}` writes it")
        else:
            if written is not None:
                print(f"report: {written} (rewritten with the issues)")
    return EXIT_OK


async def _diagnose(
    args: argparse.Namespace,
    run_dir: Path,
    set_dir: Path,
    wrap: Callable[[Any], Any] | None = None,
) -> Any:
    from pytest_evalloop.answer.backends import ClientFactory
    from pytest_evalloop.diagnose import agent, conductor
    from pytest_evalloop.ledger import reader as ledger_reader
    from pytest_evalloop.ledger import writer as ledger_writer
    from pytest_evalloop.measure import aggregates
    from pytest_evalloop.model_api.pricing import price_table
    from pytest_evalloop.model_api.ratelimit import RunLimiter, session_state_dir

    info = ledger_reader.read_run_info(run_dir)
    limits = info.limiter or {}
    rpm = args.rpm if args.rpm is not None else int(limits.get("rpm") or 0)
    tpm = args.tpm if args.tpm is not None else int(limits.get("tpm") or 0)
    # The run's own budget, shared with any process of its session still drawing on it.
    state = session_state_dir(info.session_id) if info.session_id else None
    limiter = RunLimiter(state, rpm=rpm, tpm=tpm)
    factory = ClientFactory(args.retries, args.timeout, limiter)
    client = factory() if wrap is None else wrap(factory())
    target = session = tools = None
    try:
        if not args.no_probes:
            target, session, tools = await _open_target(args, set_dir)
        result = await conductor.diagnose_run(
            run_dir,
            set_dir,
            client=client,
            model=args.model,
            prices=price_table(args.prices),
            session=session,
            tools=tools,
            max_cases=args.max_cases,
        )
    finally:
        if target is not None:
            await target.close()
        await factory.release()
    read = ledger_reader.read_run(run_dir)
    costs = {k: v.model_dump() for k, v in aggregates.role_costs(read).items()}
    ledger_writer.update_run_info(
        run_dir,
        diagnoserModel=args.model,
        diagnoseVersion=agent.DIAGNOSE_VERSION,
        diagnoseSha=agent.doctrine_sha(),
        mode=ledger.raised_mode(info.mode, "triage"),
        costs={**(info.model_dump(by_alias=True).get("costs") or {}), **costs},
    )
    return result


async def _open_target(args: argparse.Namespace, set_dir: Path) -> tuple[Any, Any, Any]:
    from pytest_evalloop.sets import cases as sets
    from pytest_evalloop.targets.bridge import anthropic_tools
    from pytest_evalloop.targets.choice import build_target

    config = sets.load_set_config(set_dir)
    try:
        target = build_target(set_dir, config, target=args.target, tool_profile=args.tool_profile)
    except ValueError as exc:
        from pytest_evalloop.diagnose.conductor import DiagnoseError

        raise DiagnoseError(f"no target for probes ({exc}); pass --target or --no-probes") from exc
    session = await target.open()
    # The probes are the answerer's own two tools, nothing else: context and query.
    specs = [t for t in await session.list_tools() if session.role_of(t.name) is not None]
    return target, session, anthropic_tools(specs)


def report_lines(result: Any, run_dir: Path) -> list[str]:
    """What `evalloop diagnose` prints: histogram, clusters, where each owner's go next."""
    diagnosed = [d for d in result.diagnoses if d.status != "undiagnosed"]
    lines = [f"diagnose: {run_dir}"]
    lines.append(
        f"cases: {len(diagnosed)} diagnosed, "
        f"{sum(d.status == 'undiagnosed' for d in result.diagnoses)} undiagnosed, "
        f"{len(result.skipped)} not diagnosed; construction eligibility {result.eligibility}"
    )
    for title, counter in (
        ("components", Counter(d.component for d in diagnosed)),
        ("owners", Counter(d.owner for d in diagnosed)),
    ):
        lines.append(f"{title}:")
        order = ALL_COMPONENTS if title == "components" else ledger.OWNERS
        for word in order:
            if counter[word]:
                lines.append(f"  {word:<22} {counter[word]:>3}  {'#' * counter[word]}")
    lines.append(f"clusters ({len(result.issues)}), most cases first:")
    for n, issue in enumerate(result.issues, 1):
        codes = ", ".join([issue.primary_code, *issue.contributing_codes])
        lines += [
            f"  {n}. {issue.issue_id}  [{issue.owner} / {issue.component}]  "
            f"{len(issue.qids)} case(s)",
            f"     qids: {', '.join(issue.qids)}",
            f"     codes: {codes}; sufficiency {issue.sufficiency}; eligibility "
            f"{issue.eligibility}",
            f"     root cause: {issue.diagnosis}",
        ]
        if issue.evidence:
            lines.append(f"     evidence: {issue.evidence}")
    if result.clustering is not None and result.clustering.reasoning:
        lines.append(f"kept apart: {result.clustering.reasoning}")
    clustering = result.clustering
    if clustering is not None and clustering.status == "singletons":
        lines.append(f"clustering refused twice ({clustering.reason}): one per case")
    elif clustering is not None and clustering.status == "split":
        lines.append(f"clustering refused twice ({clustering.reason}): split by cause")
    elif clustering is not None and clustering.reason:
        lines.append(f"clustering {clustering.reason}")
    for d in result.diagnoses:
        if d.status == "undiagnosed":
            lines.append(f"undiagnosed: {d.qid}: {d.reason}")
        elif d.status == "diagnosed" and d.reason:
            lines.append(f"diagnosed on the retry: {d.qid}: {d.reason}")
        elif d.status == "judge":
            lines.append(f"judge suspect: {d.qid}: {d.reason}; review it in evalloop view")
    reasons = Counter(result.skipped.values())
    if reasons:
        lines.append("not diagnosed: " + "; ".join(f"{n} {why}" for why, n in reasons.items()))
    owners = sorted({i.owner for i in result.issues}, key=ledger.OWNERS.index)
    if owners:
        lines.append("next:")
        lines += [f"  {o}: {NEXT_STEP[o]}" for o in owners]
    return lines


# --- issues ------------------------------------------------------------------------------


def issues_main(argv: list[str]) -> int:
    """`evalloop issues <run>`: every issue with its latest status."""
    parser = argparse.ArgumentParser(prog="evalloop issues")
    parser.add_argument("run_dir")
    args = parser.parse_args(argv)
    run_dir = _run_dir("issues", args.run_dir)
    if run_dir is None:
        return EXIT_USAGE
    from pytest_evalloop.ledger import reader as ledger_reader

    read = ledger_reader.read_run(run_dir)
    statuses = read.issue_statuses()
    issues = read.issues()
    if not issues:
        print(f"{run_dir}: no issues (run `evalloop diagnose {run_dir}`)")
    for issue_id, issue in issues.items():
        status = statuses.get(issue_id)
        word = status.status if status is not None else "(no status)"
        by = f" by {status.by}" if status is not None and status.by else ""
        print(
            f"{word:<9} {issue_id}  [{issue.owner} / {issue.component} / {issue.primary_code}]"
            f"  {len(issue.qids)} case(s){by}"
        )
    return EXIT_OK


def issue_main(argv: list[str]) -> int:
    """`evalloop issue <run> <id> --status S`: a status change, recorded as an event."""
    parser = argparse.ArgumentParser(prog="evalloop issue")
    parser.add_argument("run_dir")
    parser.add_argument("issue_id")
    parser.add_argument("--status", required=True, choices=ledger.ISSUE_STATUSES)
    parser.add_argument("--note", help="Why (kept on the event)")
    args = parser.parse_args(argv)
    run_dir = _run_dir("issue", args.run_dir)
    if run_dir is None:
        return EXIT_USAGE
    from pytest_evalloop.ledger import reader as ledger_reader
    from pytest_evalloop.ledger.writer import LedgerWriter

    issues = ledger_reader.read_run(run_dir).issues()
    if args.issue_id not in issues:
        known = ", ".join(issues) or "none"
        return _fail("issue", f"no issue {args.issue_id!r} in {run_dir} (issues: {known})")
    event = ledger.IssueStatusEvent(
        issue_id=args.issue_id, status=args.status, by="person", note=args.note
    )
    LedgerWriter(run_dir).append(event)
    print(f"{args.issue_id}: {args.status}")
    return EXIT_OK
