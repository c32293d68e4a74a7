"""What a run counts and what a comparison decides: outcome words, run figures and role costs
(`aggregates`), pin rules (`pins`), the estimators (`stats`, `repeats`, `significance`), two runs
case by case (`comparison`, as text in `comparison_text`), the acceptance bar and the gates
(`gate`), A/A noise and CALIBRATION.md (`noise`, `calibration`), `evalloop flips` (`flips`) and
this session's run against `--baseline` (`baseline`), people's reviews as one label (`people`)
and the judge's agreement with people (`agreement`).

Layer 5 of the declared order (`tests/test_architecture.py`). It may import `ledger`, `judge`,
`model_api`, `sets` and the bottom layer (the package root, `failures`, `stash`). Every figure
is counted from ledger events, so nothing here imports a role, a target or the pytest face.
"""
