"""People's verdicts on attempts: recording one (`review`: the `review` event, the set's
`judge-regressions.jsonl` fixture, the golden side door a verdict may open), serving them
(`view`: `evalloop view`, the runs index and reports on loopback with a review panel and a
review queue), and holding the judge to them (`checkjudge`: `--eval-check-judge`, each settled
verdict an item the judge must reproduce, and the agreement summary).

How people's reviews count is `measure.people`'s and judge-human agreement (kappa) is
`measure.agreement`'s: `measure.aggregates` and `report` need them, so they sit below.

May import: `improve` and every stage below it (`report`, `diagnose`, `goldens`, `answer`,
`targets`, `roles`, `measure`, `ledger`, `judge`, `model_api`, `sets`) and the bottom
(`failures`, `stash`); never `session`, `scale` or the pytest face.
"""
