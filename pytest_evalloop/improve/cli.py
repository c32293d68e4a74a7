"""`evalloop improve`, `evalloop accept`, `evalloop restore` (and `evalloop loop`, in loop.py).

Exit statuses: 0 done (a candidate written, an edit accepted, a restore made); 2 a usage error
or a refusal (another owner's issue, a remote target, a dirty tree, an unknown candidate);
3 the endpoint failed (nothing written); 6 the acceptance check did not accept (rejected,
unresolved, or halted on a golden suspect) or improve's candidate was refused.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path
from typing import Any

from pytest_evalloop.ledger import contract as ledger
from pytest_evalloop.ledger import files

EXIT_OK = 0
EXIT_USAGE = 2
EXIT_HARNESS = 3
EXIT_NOT_ACCEPTED = 6
DEFAULT_MODEL = "claude-opus-4-6"


def _fail(command: str, message: str, code: int = EXIT_USAGE) -> int:
    print(f"evalloop {command}: {message}", file=sys.stderr)
    return code


def _run_and_set(command: str, run: str, set_arg: str | None) -> tuple[Path, Path] | None:
    run_dir = Path(run)
    refused = files.not_a_run(run_dir)  # no run.json, or a ledger file that is a pipe, a link...
    if refused:
        _fail(command, refused)
        return None
    set_dir = Path(set_arg) if set_arg else run_dir.parent.parent
    if not (set_dir / "set.json").is_file():
        _fail(command, f"{set_dir} has no set.json; name the set with --set")
        return None
    return run_dir, set_dir


def quiet_sdk_logs() -> None:
    import logging

    # The MCP SDK turns logging on at INFO; each HTTP request line is noise on this screen.
    for name in ("httpx", "httpx2"):
        logging.getLogger(name).setLevel(logging.WARNING)


async def improve_with_client(
    run_dir: Path,
    set_dir: Path,
    issue_id: str,
    model: str,
    probes: bool = True,
    *,
    reviewer: str | None = None,
    wrap: Any = None,
) -> Any:
    """Run improve with a client on the run's own rate limit (`wrap` wraps it: the loop's
    budget); `reviewer` names the expert review's model (None: no review)."""
    from pytest_evalloop.answer.backends import ClientFactory
    from pytest_evalloop.improve.conductor import improve_issue
    from pytest_evalloop.ledger import reader as ledger_reader
    from pytest_evalloop.model_api.pricing import price_table
    from pytest_evalloop.model_api.ratelimit import RunLimiter, session_state_dir

    info = ledger_reader.read_run_info(run_dir)
    limits = info.limiter or {}
    state = session_state_dir(info.session_id) if info.session_id else None
    limiter = RunLimiter(state, rpm=int(limits.get("rpm") or 0), tpm=int(limits.get("tpm") or 0))
    factory = ClientFactory(4, 300.0, limiter)
    try:
        return await improve_issue(
            run_dir,
            set_dir,
            issue_id,
            client=factory() if wrap is None else wrap(factory()),
            model=model,
            prices=price_table(None),
            probes=probes,
            reviewer=reviewer,
        )
    finally:
        await factory.release()


def candidate_lines(candidate: ledger.CandidateEvent) -> list[str]:
    """What `evalloop improve` prints about the candidate it wrote."""
    lines = [f"candidate {candidate.candidate_id}: {candidate.status}"]
    for summary in candidate.diff_summary or []:
        lines.append(f"  edit: {summary}")
    receipts = [p for p in candidate.probes if isinstance(p, dict) and p.get("tool")]
    lines.append(
        f"  probes run: {len(receipts)}; meaning changed: {candidate.meaning_changed or 'none (docs only)'}"
    )
    for check in candidate.checks:
        mark = "ok" if check["ok"] else "FAILED"
        where = f" {check['source']}" if check.get("source") else ""
        lines.append(f"  check {check['check']}{where}: {mark} ({check['detail']})")
    audit = candidate.golden_audit or {}
    if audit:
        lines.append(
            f"  golden audit: {'clean' if audit.get('clean') else 'not clean'}; {audit.get('tail', '')}".rstrip()
        )
    for suspect in candidate.golden_suspect:
        lines.append(
            f"  GOLDEN SUSPECT {suspect.get('qid')} ({suspect.get('entity')}): "
            f"{suspect.get('stored')} -> {suspect.get('rederived')}"
        )
    for flag in candidate.expert_flags:
        lines.append(
            f"  EXPERT FLAG {flag.get('qid') or '(no case)'}: {flag.get('quote', '')!r} "
            f"({flag.get('why', '')})"
        )
    for refusal in candidate.refusals:
        lines.append(f"  refused: {refusal}")
    return lines


def improve_main(argv: list[str]) -> int:
    """`evalloop improve <run> --issue <id>`."""
    parser = argparse.ArgumentParser(prog="evalloop improve", description=__doc__)
    parser.add_argument("run_dir")
    parser.add_argument("--issue", required=True, help="The model-owned issue to work on")
    parser.add_argument("--set", dest="set_dir")
    parser.add_argument("--model", default=DEFAULT_MODEL, help="The improver's model")
    parser.add_argument("--no-probes", action="store_true", help="Offer no probe tools")
    parser.add_argument(
        "--reviewer-model", help="The expert review's model (default: the improver's)"
    )
    parser.add_argument("--no-review", action="store_true", help="Skip the expert review call")
    args = parser.parse_args(argv)
    found = _run_and_set("improve", args.run_dir, args.set_dir)
    if found is None:
        return EXIT_USAGE
    run_dir, set_dir = found
    from pytest_evalloop.failures import HarnessError
    from pytest_evalloop.improve.workcopy import ImproveRefused

    quiet_sdk_logs()
    try:
        result = asyncio.run(
            improve_with_client(
                run_dir,
                set_dir,
                args.issue,
                args.model,
                not args.no_probes,
                reviewer=None if args.no_review else (args.reviewer_model or args.model),
            )
        )
    except ImproveRefused as exc:
        return _fail("improve", str(exc))
    except HarnessError as exc:
        return _fail("improve", f"harness error, nothing written: {exc}", EXIT_HARNESS)
    print("\n".join(candidate_lines(result.candidate)))
    if result.candidate.status == "proposed":
        print(
            f"next: evalloop accept {run_dir} --candidate {result.candidate.candidate_id} "
            "(two blind arms decide; the edit is in the working tree until then)"
        )
        return EXIT_OK
    return EXIT_NOT_ACCEPTED


def acceptance_lines(result: Any) -> list[str]:
    """What `evalloop accept` prints."""
    event = result.event
    lines = [*result.lines]
    lines.append(
        f"acceptance check: {event.decision} ({event.class_}); baseline {event.baseline_run_id}; "
        f"arms {', '.join(event.final_run_ids) or 'none (halted before any run)'}"
    )
    lines.append(
        f"  regressions: {', '.join(event.regressions) or 'none'}; holdout delta: "
        f"{event.holdout_delta if event.holdout_delta is not None else 'n/a'}"
    )
    lines.append(f"  reason: {event.reason}")
    if result.reverted:
        lines.append("  working copy restored to the commit the candidate started from")
    if result.checkpoint is not None:
        cp = result.checkpoint
        lines.append(
            f"checkpoint {cp.label}: commit {cp.model_git_sha} closes {', '.join(cp.issue_ids)}"
        )
    return lines


def accept_main(argv: list[str]) -> int:
    """`evalloop accept <run> --candidate <id>`."""
    parser = argparse.ArgumentParser(prog="evalloop accept", description=__doc__)
    parser.add_argument("run_dir", help="The baseline run holding the candidate")
    parser.add_argument("--candidate", required=True)
    parser.add_argument("--set", dest="set_dir")
    parser.add_argument("--noise-band", type=int, help="Untargeted flips an A/A pair showed")
    parser.add_argument(
        "--dismiss-suspect",
        nargs=2,
        action="append",
        metavar=("QID", "WHY"),
        default=[],
        help="Dismiss a golden suspect explicitly (a person's call, kept on the event)",
    )
    args = parser.parse_args(argv)
    found = _run_and_set("accept", args.run_dir, args.set_dir)
    if found is None:
        return EXIT_USAGE
    run_dir, set_dir = found
    from pytest_evalloop.improve.acceptance import accept_candidate
    from pytest_evalloop.improve.workcopy import ImproveRefused

    try:
        result = accept_candidate(
            run_dir,
            set_dir,
            args.candidate,
            dismissed=dict(args.dismiss_suspect),
            noise_band=args.noise_band,
        )
    except ImproveRefused as exc:
        return _fail("accept", str(exc))
    print("\n".join(acceptance_lines(result)))
    return EXIT_OK if result.event.decision == "accepted" else EXIT_NOT_ACCEPTED


def restore_main(argv: list[str]) -> int:
    """`evalloop restore <label> [--set DIR]`."""
    parser = argparse.ArgumentParser(prog="evalloop restore")
    parser.add_argument("label", help="A checkpoint label (<set>-checkpoint-<nn>)")
    parser.add_argument("--set", dest="set_dir", default=".", help="The set directory")
    parser.add_argument("--runs-dir", help="Where the set's runs are (default <set>/runs)")
    parser.add_argument(
        "--force",
        action="store_true",
        help="Restore over uncommitted changes, saving them to a patch file first",
    )
    args = parser.parse_args(argv)
    set_dir = Path(args.set_dir)
    if not (set_dir / "set.json").is_file():
        return _fail("restore", f"{set_dir} has no set.json; name the set with --set")
    from pytest_evalloop.improve.checkpoint import restore
    from pytest_evalloop.improve.workcopy import ImproveRefused

    try:
        done = restore(
            set_dir, args.label, Path(args.runs_dir) if args.runs_dir else None, force=args.force
        )
    except ImproveRefused as exc:
        return _fail("restore", str(exc))
    if done["saved"]:
        listed = " ".join(done["dirty"])
        print(
            f"saved the uncommitted changes of {', '.join(done['dirty'])} to {done['saved']}; "
            f"to bring them back: git -C {done['root']} checkout HEAD -- {listed} && "
            f"git -C {done['root']} apply {done['saved']}"
        )
    print(
        f"restored {', '.join(done['files'])} to checkpoint {done['label']} (commit "
        f"{done['sha']}); recorded in {done['run']}. Commit the restored files to pin them."
    )
    return EXIT_OK
