"""The golden side door: `evalloop golden promote|attest|repair|hold|release <set> <qid>`.

Seed 004's rule: a golden that is wrong, doubted or not yet verified is fixed outside the
improve loop, and every fix is a recorded change. Each action here rewrites exactly one row of
`cases.jsonl` (every other line stays byte-identical, the question and its seal are never
touched), bumps `set.json` `datasetVersion` in place, and appends one line to
`<set>/golden-changes.jsonl` saying who changed what, when and why, with the old and new golden
revision and dataset sha. A change that moves the key a judge scores against (repair) or takes
a golden in or out of scoring (hold, release) also bumps the row's `goldenRevision`, so old
scores keep the revision they were judged under and never mix with new ones.

The modules, one per part of a change: `change` (the record, the refusals, the terminal
report), `rewrite` (finding the row and writing the change to `cases.jsonl`, `set.json` and
the log), `verify` (promote and attest: a golden becomes verified), `repair` (repair, hold and
release: the key or its place in scoring moves, so `goldenRevision` does), `cli` (the command
line).
Before anything is answered, `preflight` says which goldens cannot be scored and runs the
pre-run golden check (`goldenCheck`). `items` is `--eval-verify-goldens`: one pytest item per
case that re-derives its golden and fails on drift (the plugin collects them; the items read the
session's settings and runtime from `config.stash`, at the bottom).

Layer 9 of the declared order (`tests/test_architecture.py`), beside `sets` in the flow but above
`targets`: a golden is re-derived on the embedded target's truth connection and model. It may
import `answer`, `targets`, `roles`, `measure`, `ledger`, `judge`, `model_api`,
`sets` and the bottom layer (the package root, `failures`, `stash`); never `diagnose`,
`report`, `improve` or the pytest face (`evalloop golden` is wired in by `pytest_evalloop.cli`).
"""
