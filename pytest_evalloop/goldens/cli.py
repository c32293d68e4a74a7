"""`evalloop golden <action> <set dir> <qid> ...`: the parser, the call, the exit status."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Literal

from pytest_evalloop.goldens.change import (
    Change,
    GoldenRefused,
    GoldenUsageError,
)
from pytest_evalloop.goldens.repair import hold, release, repair
from pytest_evalloop.goldens.verify import BulkAttestation, attest, attest_all, promote
from pytest_evalloop.targets.embedded.goldens import NOTHING_TO_DERIVE

EXIT_OK = 0
EXIT_REFUSED = 1
EXIT_USAGE = 2


def build_parser() -> argparse.ArgumentParser:
    """The parser of `evalloop golden <action> <set dir> <qid> ...`."""
    parser = argparse.ArgumentParser(
        prog="evalloop golden",
        description="Change one golden through the side door: a recorded change with "
        "goldenRevision/datasetVersion bumps (docs/golden-side-door.md).",
    )
    sub = parser.add_subparsers(dest="action", required=True)

    def action(name: str, text: str, *, one: bool = True) -> argparse.ArgumentParser:
        cmd = sub.add_parser(name, help=text, description=text)
        cmd.add_argument("set_dir", type=Path, help="the set directory (set.json, cases.jsonl)")
        if one:
            cmd.add_argument("qid", help="the case whose golden changes")
        else:
            cmd.add_argument("qid", nargs="?", help="the case whose golden changes")
        return cmd

    def target(cmd: argparse.ArgumentParser) -> None:
        cmd.add_argument(
            "--eval-target",
            dest="target",
            metavar="malloy:DIR",
            help="the package that answers the set, as given to pytest (its truth package is "
            "looked for beside it; its model runs the modelQuery route)",
        )

    cmd = action("promote", "provisional -> verified, once two derivations on the truth agree")
    cmd.add_argument(
        "--by", help="who promotes it (default: git config user.name, else the login name)"
    )
    target(cmd)
    cmd = action(
        "attest",
        "a named person vouches for the golden (status verified); with --all-provisional, "
        "every provisional golden the truth data reproduces",
        one=False,
    )
    cmd.add_argument("--by", required=True, help="the person attesting (required)")
    cmd.add_argument("--note", "--reason", dest="note", help="what they checked (recorded)")
    cmd.add_argument(
        "--all-provisional",
        action="store_true",
        help="attest every provisional golden the truth data reproduces (one recorded change "
        "each); list and refuse the ones it contradicts or cannot derive",
    )
    target(cmd)
    cmd = action("repair", "replace the golden's value; the old one goes to golden.history")
    key = cmd.add_mutually_exclusive_group()
    key.add_argument("--value", help="the new golden value as JSON")
    key.add_argument("--rows-file", type=Path, help="a JSON rows artifact inside the set dir")
    cmd.add_argument("--kind", choices=["scalar", "rows", "unanswerable", "criteria"])
    cmd.add_argument("--canonical-query", help="new golden.canonicalQuery (truth SQL)")
    cmd.add_argument("--second-query", help="new golden.verification.secondQuery")
    cmd.add_argument("--primary-axis", help="new verification.primaryAxis (canonical's route)")
    cmd.add_argument("--varies-axis", help="new verification.variesAxis (what the second varies)")
    cmd.add_argument("--reason", required=True, help="why the old golden was wrong")
    cmd.add_argument("--force", action="store_true", help="repair despite drift (recorded)")
    cmd.add_argument(
        "--by", help="who repairs it (default: git config user.name, else the login name)"
    )
    target(cmd)
    cmd = action("hold", "mark the golden ambiguous (or invalid): it is not scored")
    cmd.add_argument("--reason", required=True, help="the defect and competing replacements")
    cmd.add_argument("--invalid", action="store_true", help="the question itself is unusable")
    cmd.add_argument(
        "--by", help="who holds it (default: git config user.name, else the login name)"
    )
    cmd = action("release", "undo a hold: the golden returns to its status before the hold")
    cmd.add_argument("--reason", required=True, help="why the held key stands after all")
    cmd.add_argument(
        "--by", help="who releases it (default: git config user.name, else the login name)"
    )
    return parser


def _run(args: argparse.Namespace) -> Change | BulkAttestation:
    common = {"by": args.by}
    if args.action == "promote":
        return promote(args.set_dir, args.qid, target=args.target, **common)
    if args.action == "attest":
        if args.all_provisional == (args.qid is not None):
            raise GoldenUsageError(
                "attest takes one qid, or --all-provisional for every provisional golden the "
                "truth data reproduces (not both, not neither)"
            )
        if args.all_provisional:
            return attest_all(args.set_dir, by=args.by, note=args.note, target=args.target)
        return attest(args.set_dir, args.qid, by=args.by, note=args.note, target=args.target)
    if args.action == "hold":
        status: Literal["ambiguous", "invalid"] = "invalid" if args.invalid else "ambiguous"
        return hold(args.set_dir, args.qid, reason=args.reason, status=status, **common)
    if args.action == "release":
        return release(args.set_dir, args.qid, reason=args.reason, **common)
    value = None
    if args.value is not None:
        try:
            value = json.loads(args.value)
        except json.JSONDecodeError as exc:
            raise GoldenUsageError(
                f"--value {args.value!r:.80} is not JSON ({exc.msg} at column {exc.colno}); "
                "quote it, e.g. --value '{\"orders\": 125}'"
            ) from exc
    elif args.rows_file is None and args.kind not in NOTHING_TO_DERIVE:
        raise GoldenUsageError(
            f"repair of {args.qid} needs the new key: --value '<json>' or --rows-file F "
            "(or --kind unanswerable/criteria)"
        )
    return repair(
        args.set_dir,
        args.qid,
        reason=args.reason,
        value=value,
        rows_file=args.rows_file,
        kind=args.kind,
        canonical_query=args.canonical_query,
        second_query=args.second_query,
        primary_axis=args.primary_axis,
        varies_axis=args.varies_axis,
        force=args.force,
        target=args.target,
        **common,
    )


def golden_main(argv: list[str]) -> int:
    """Run `evalloop golden ...`: 0 changed, 1 refused (under --all-provisional: any golden
    refused, the others attested), 2 usage error."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:
        return EXIT_OK if exc.code in (0, None) else EXIT_USAGE
    try:
        change = _run(args)
    except GoldenUsageError as exc:
        print(f"evalloop golden {args.action}: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except GoldenRefused as exc:
        print(f"evalloop golden {args.action}: refused: {exc}", file=sys.stderr)
        return EXIT_REFUSED
    print("\n".join(change.lines()))
    if isinstance(change, BulkAttestation) and change.refused:
        return EXIT_REFUSED
    return EXIT_OK
