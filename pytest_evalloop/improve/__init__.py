"""Improving what is under test from a diagnosis, and checking the change by another run. Empty
until the improve issue builds it; it is here so that its code has a home and a layer before it
exists.

Layer 12 of the declared order (`tests/test_architecture.py`), the highest below the pytest
face. It may import `report`, `diagnose` and every layer below them (`goldens`, `answer`,
`targets`, `pytest_evalloop.roles`, `measure`, `ledger`, `judge`, `model_api`, `sets`, the
bottom layer); never the pytest face (`plugin`, `runtime`, `cli`, ...).
"""
