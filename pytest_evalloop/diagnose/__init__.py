"""Diagnosing a run: why its cases failed, from what the ledger recorded. Empty until the
diagnose issue builds it; it is here so that its code has a home and a layer before it exists.

Layer 10 of the declared order (`tests/test_architecture.py`). It may import `goldens`,
`answer`, `targets`, `pytest_evalloop.roles`, `measure`, `ledger`, `judge`, `model_api`, `sets`
and the bottom layer (the package root, `failures`, `gcpolicy`); never `report` (which may show a
diagnosis), `improve` (which acts on one) or the pytest face.
"""
