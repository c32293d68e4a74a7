"""The ledger, a run's append-only record: the contract (`contract`: `run.json` and every event
kind as pydantic models, strict on write, tolerant on read, the JSON Schema), writing a run
directory (`writer`), reading it back (`reader`), which attempts of a run are scored already
(`resume`), and when the cyclic garbage collector runs while a run is read or many objects are
built (`gcpolicy`: standard library only, so the collection path and `evalloop flips` share it).

Layer 4 of the declared order (`tests/test_architecture.py`). It may import `judge`,
`model_api`, `sets` and the bottom layer (the package root, `failures`, `stash`); never
`measure` or a role. The run directories of a session (opened, resumed, closed with their
totals) are `pytest_evalloop.session.runs`, above every stage: closing a run counts it
(`measure`) and names the model's commit (`improve`).
"""
