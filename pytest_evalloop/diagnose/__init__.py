"""Diagnosing a run: why its dev cases failed and who owns the fix, clustered by shared cause.

`evidence` (which attempts, the mechanical evidence of one), `shapes` (the failure shape),
`claims` (what a diagnosis may claim given its evidence, what a cluster may join), `agent` (the
diagnose agent and the clustering call, their doctrine), `conductor` (a stored run diagnosed
into issue events), `bounds` (what any issue may rest on: its set's cases, a dev case for a model
issue), `cli` (`evalloop diagnose`, `issues`, `issue`). docs/diagnose.md.

Layer 10 of the declared order (`tests/test_architecture.py`). It may import `goldens`,
`answer`, `targets`, `roles`, `measure`, `ledger`, `judge`, `model_api`, `sets`
and the bottom layer (the package root, `failures`, `stash`); never `report` (which may show a
diagnosis), `improve` (which acts on one) or the pytest face.
"""
