"""The ledger, a run's append-only record: the contract (`contract`: `run.json` and every event
kind as pydantic models, strict on write, tolerant on read, the JSON Schema), writing a run
directory (`writer`), reading it back (`reader`) and which attempts of a run are scored already
(`resume`).

Layer 4 of the declared order (`tests/test_architecture.py`). It may import `judge`,
`model_api`, `sets` and the bottom layer (the package root, `failures`, `gcpolicy`); never
`measure` or a role. The run directories of a session (opened, resumed, closed with their
totals) are `pytest_evalloop.session.runs`, in the pytest face: closing a run counts it, which is
`measure`'s, one layer up.
"""
