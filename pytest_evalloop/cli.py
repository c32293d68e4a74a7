"""The `evalloop` console script: the work that is not a test run.

Sub-commands: `validate` (check a run directory against the ledger contract), `schema` (print the
contract as JSON Schema), `serve` (run a set's embedded MCP server), `flips` (compare two stored
runs), `merge` (the shards of a sharded run as one run), `gate` (a stored run against a
baseline, as the in-run gate decides), `report` (summarise a stored run and write its HTML
report), `golden` (the golden side door: promote, attest, repair, hold or release one golden as
a recorded change), `diagnose` (why a run's dev cases failed, clustered into issues), `issues`
and `issue` (their statuses), `improve` (one probed model edit for a model-owned issue),
`accept` (its acceptance check over two blind arms, then a checkpoint or a revert), `restore`
(the model back to a checkpoint), `loop` (one batch of all of it), `review` (a person's verdict
on one attempt), `view` (the runs and reports served on loopback, with a review panel) and
`malloy-data` (the malloy-samples ecommerce tables the Malloy example needs, generated).

Exit codes of `validate`: 0 the run is valid (warnings may be printed), 1 errors were found,
2 the path is not a readable run directory (no run.json, or a ledger file that is no regular
file: a directory, a named pipe, a link; `ledger.files`).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

EXIT_OK = 0
EXIT_INVALID = 1
EXIT_USAGE = 2


def _validate(args: argparse.Namespace) -> int:
    from pytest_evalloop.diagnose.bounds import issue_findings
    from pytest_evalloop.ledger import contract as ledger
    from pytest_evalloop.ledger import reader as ledger_reader

    run_dir = Path(args.run_dir)
    if not run_dir.is_dir() or not os.path.lexists(run_dir / "run.json"):
        what = "is not a directory" if not run_dir.is_dir() else "holds no run.json"
        print(
            f"evalloop validate: {run_dir} {what}; give a run directory (<set>/runs/<runId>)",
            file=sys.stderr,
        )
        return EXIT_USAGE
    if _refused("validate", run_dir):
        return EXIT_USAGE
    read = ledger_reader.read_run(run_dir)
    # An issue names cases of its own set, and a model issue a dev case (diagnose/bounds.py).
    read.findings += issue_findings(read, run_dir.parent.parent)
    for finding in read.findings:
        if finding.level == "error" or not args.quiet:
            print(finding)
    counts = {kind: len(read.of_kind(kind)) for kind in ledger.EVENT_KINDS if read.of_kind(kind)}
    verdict = "INVALID" if read.errors else "valid"
    print(
        f"{run_dir}: {verdict}: {len(read.errors)} errors, {len(read.warnings)} warnings; "
        f"events: {json.dumps(counts)}"
    )
    return EXIT_INVALID if read.errors else EXIT_OK


def _refused(command: str, run_dir: Path) -> bool:
    """Print why `run_dir` is refused before it is read (a ledger file that is a directory, a
    pipe, a link: `ledger.files`), if it is; such a run is not a readable run directory."""
    from pytest_evalloop.ledger import files

    refused = files.refusal_lines(run_dir)
    for line in refused:
        print(f"evalloop {command}: {line}", file=sys.stderr)
    return bool(refused)


def _schema(args: argparse.Namespace) -> int:
    from pytest_evalloop.ledger import contract as ledger

    print(json.dumps(ledger.json_schema(), indent=2))
    return EXIT_OK


def _serve(args: argparse.Namespace) -> int:
    from pytest_evalloop.targets.embedded.server import serve

    set_dir = Path(args.set_dir)
    if not (set_dir / "set.json").is_file():
        print(f"evalloop serve: {set_dir} has no set.json; give a set directory", file=sys.stderr)
        return EXIT_USAGE
    if args.transport == "stdio" and (sys.stdin is None or sys.stdout is None):
        print("evalloop serve: stdin or stdout is closed; stdio needs both", file=sys.stderr)
        return EXIT_USAGE
    try:
        serve(set_dir, args.transport, host=args.host, port=args.port)
    except KeyboardInterrupt:
        # Ctrl-C is how a server is stopped: the HTTP server re-raises it once it has shut down.
        return 130
    return EXIT_OK


def _flips(argv: list[str]) -> int:
    from pytest_evalloop.measure.flips import flips_main

    return flips_main(argv)


def _golden(argv: list[str]) -> int:
    from pytest_evalloop.goldens.cli import golden_main

    return golden_main(argv)


def _run_summary_lines(**fields: Any) -> list[str]:
    """The terminal summary of a stored run (`summary.RunSummary`'s fields): what `evalloop
    merge` prints after its shard lines, handed to it because the summary is the face's."""
    from pytest_evalloop.summary import RunSummary, summary_lines

    return summary_lines(RunSummary(**fields))


def _report(args: argparse.Namespace) -> int:
    from pytest_evalloop.judge import judgesamples
    from pytest_evalloop.ledger import reader as ledger_reader
    from pytest_evalloop.measure import aggregates
    from pytest_evalloop.measure.comparison import resolve_run
    from pytest_evalloop.measure.shardrule import shard_note
    from pytest_evalloop.measure.unmeasured import unmeasured
    from pytest_evalloop.session.runs import invalid_reason
    from pytest_evalloop.summary import RunSummary, summary_lines

    run_dir = Path(args.run_dir)
    if _refused("report", run_dir):
        return EXIT_USAGE
    read = ledger_reader.read_run(run_dir)
    if read.info is None:
        print(f"evalloop report: {run_dir}: no readable run.json", file=sys.stderr)
        return EXIT_USAGE
    baseline = None
    if args.baseline:
        try:
            baseline = resolve_run(args.baseline, set_dir=None, runs_dir=run_dir.parent)
        except ValueError as exc:
            print(f"evalloop report: --baseline: {exc}", file=sys.stderr)
            return EXIT_USAGE
        if _refused("report", baseline):
            return EXIT_USAGE
    # A ledger that does not validate (changed after it closed, a torn line) is counted as
    # invalid, as closing would: its pass rate is withheld with the first problem named.
    broken = invalid_reason(read)
    tally = aggregates.tally(read, status="invalid" if broken else None, invalid_reason=broken)
    summary = RunSummary(
        run_dir=run_dir,
        label=read.info.label or run_dir.name,
        status=read.info.status or "?",
        tally=tally,
        costs=aggregates.role_costs(read),
        judge_samples=judgesamples.summary(list(read.score_groups().values())),
        shards=shard_note(read.info),
        unmeasured=unmeasured(tally, run_dir),
    )
    print("\n".join(summary_lines(summary)))
    if baseline is not None:
        # The same flip table `evalloop flips` prints (and the run's own summary did).
        sys.stdout.flush()
        _flips([str(baseline), str(run_dir)])
    return _write_html(args, run_dir, baseline)


def _write_html(args: argparse.Namespace, run_dir: Path, baseline: Path | None) -> int:
    from pytest_evalloop.report.html import write_report

    out = Path(args.output) if args.output else None
    try:
        path = write_report(run_dir, baseline_dir=baseline, out=out)
    except (OSError, ValueError) as exc:
        print(f"evalloop report: report not written: {exc}", file=sys.stderr)
        return EXIT_USAGE
    print(f"report: {path}")
    return EXIT_OK


def _check_judge(argv: list[str]) -> int:
    """`evalloop check-judge <set> [pytest options]`: `pytest <set> --eval-check-judge`."""
    import pytest

    if not argv or argv[0].startswith("-"):
        print("usage: evalloop check-judge <set dir> [pytest options]", file=sys.stderr)
        return EXIT_USAGE
    return int(pytest.main([argv[0], "--eval-check-judge", *argv[1:]]))


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of `evalloop` (flips parses its own arguments)."""
    parser = argparse.ArgumentParser(prog="evalloop", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    validate = sub.add_parser("validate", help="Check a run directory against the ledger contract")
    validate.add_argument("run_dir")
    validate.add_argument("-q", "--quiet", action="store_true", help="Print errors only")
    validate.set_defaults(func=_validate)
    schema = sub.add_parser("schema", help="Print the ledger contract as JSON Schema")
    schema.set_defaults(func=_schema)
    serve = sub.add_parser("serve", help="Serve a set's embedded target over MCP")
    serve.add_argument("set_dir")
    serve.add_argument("--transport", choices=["stdio", "http"], default="stdio")
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=int, default=8765)
    serve.set_defaults(func=_serve)
    report = sub.add_parser(
        "report", help="Summarise a stored run and write its HTML report (report.html)"
    )
    report.add_argument("run_dir")
    report.add_argument(
        "--baseline", help="A run (directory, label or run id) to show the flips against"
    )
    report.add_argument(
        "-o", "--output", help="Where to write the HTML (default <run_dir>/report.html)"
    )
    report.set_defaults(func=_report)
    sub.add_parser(
        "flips", help="Flips and the acceptance bar between two stored runs", add_help=False
    )
    sub.add_parser(
        "noise", help="Split an A/A pair's flips into answerer and judge noise", add_help=False
    )
    sub.add_parser(
        "golden", help="Promote, attest, repair, hold or release a golden", add_help=False
    )
    sub.add_parser("merge", help="Merge the shards of one sharded run into one run", add_help=False)
    sub.add_parser(
        "gate", help="Gate a stored (merged) run against a baseline, once", add_help=False
    )
    sub.add_parser("diagnose", help="Why a run's dev cases failed: issues", add_help=False)
    sub.add_parser("issues", help="A run's issues with their latest status", add_help=False)
    sub.add_parser("issue", help="Record an issue's status change", add_help=False)
    sub.add_parser("improve", help="One probed model edit for a model-owned issue", add_help=False)
    sub.add_parser("accept", help="The acceptance check of a candidate edit", add_help=False)
    sub.add_parser("restore", help="Return the model to a checkpoint", add_help=False)
    sub.add_parser("loop", help="One batch: baseline, diagnose, improve, accept", add_help=False)
    sub.add_parser("review", help="Record a person's verdict on one attempt", add_help=False)
    sub.add_parser(
        "check-judge", help="Re-judge the set's human-settled fixtures: kappa", add_help=False
    )
    sub.add_parser("view", help="Serve the runs and reports locally, with review", add_help=False)
    sub.add_parser("init", help="Write a minimal eval set to start from", add_help=False)
    sub.add_parser(
        "malloy-data", help="Generate the malloy-samples ecommerce tables", add_help=False
    )
    sub.add_parser(
        "demo", help="The example set, twice, against the loopback fake: no key", add_help=False
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run the `evalloop` command line (a reader that closes the pipe early, `| head`, ends
    it quietly: what was printed was what it asked for)."""
    try:
        return _main(argv)
    except BrokenPipeError:
        # Python would print a second BrokenPipeError flushing stdout at exit: point it at
        # devnull (the documented recipe) and exit as `head` expects.
        import os

        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 1
    except KeyboardInterrupt:
        # Ctrl-C before a command's own handling began (while it imports what it needs).
        print("evalloop: interrupted", file=sys.stderr)
        return 130


def _main(argv: list[str] | None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "flips":
        return _flips(argv[1:])
    if argv and argv[0] == "noise":
        from pytest_evalloop.measure.noise import noise_main

        return noise_main(argv[1:])
    if argv and argv[0] == "merge":
        from pytest_evalloop.scale.merge import merge_main

        return merge_main(argv[1:], _run_summary_lines)
    if argv and argv[0] == "gate":
        from pytest_evalloop.options import gate_settings
        from pytest_evalloop.scale.rungate import gate_main

        return gate_main(argv[1:], gate_settings)
    if argv and argv[0] == "review":
        from pytest_evalloop.review.review import review_main

        return review_main(argv[1:])
    if argv and argv[0] == "check-judge":
        return _check_judge(argv[1:])
    if argv and argv[0] == "init":
        from pytest_evalloop.scaffold import init_main

        return init_main(argv[1:])
    if argv and argv[0] == "demo":
        from pytest_evalloop.demo.command import demo_main

        return demo_main(argv[1:])
    if argv and argv[0] == "view":
        from pytest_evalloop.review.view import view_main

        return view_main(argv[1:])
    if argv and argv[0] == "golden":
        return _golden(argv[1:])
    if argv and argv[0] == "malloy-data":
        from pytest_evalloop.targets.malloy.gen_data import main as malloy_data_main

        return malloy_data_main(argv[1:])
    if argv and argv[0] in ("diagnose", "issues", "issue"):
        from pytest_evalloop.diagnose import cli as diagnose_cli

        if argv[0] == "diagnose":
            from pytest_evalloop.report.html import rewrite_report

            return diagnose_cli.diagnose_main(argv[1:], views=rewrite_report)
        entry = {"issues": diagnose_cli.issues_main, "issue": diagnose_cli.issue_main}
        return entry[argv[0]](argv[1:])
    if argv and argv[0] in ("improve", "accept", "restore"):
        from pytest_evalloop.improve import cli as improve_cli

        entries = {
            "improve": improve_cli.improve_main,
            "accept": improve_cli.accept_main,
            "restore": improve_cli.restore_main,
        }
        return entries[argv[0]](argv[1:])
    if argv and argv[0] == "loop":
        from pytest_evalloop.improve.loop import loop_main

        return loop_main(argv[1:])
    args = build_parser().parse_args(argv)
    code: int = args.func(args)
    return code


if __name__ == "__main__":
    sys.exit(main())
