"""Answering a case, and one attempt end to end: the pipeline (`pipeline`: answer, re-execute,
contamination, golden gate, judge, retrieval, events), the built-in roles built from settings
(`backends`), the answerers (`answerer` over the Messages API; `claude_code` over the `claude`
CLI, with `claude_process`, `claude_stream` and `claude_env`), what the judge is shown of an
attempt and the model files it is read from (`materials`), the checks on what an answerer
did (`contamination`, `recall`) and `--eval-rejudge-from`'s stored answers served as roles
(`replay`).

Layer 8 of the declared order (`tests/test_architecture.py`). It may import `targets`,
`roles`, `measure`, `ledger`, `judge`, `model_api`, `sets` and the bottom layer
(the package root, `failures`, `stash`); never `goldens`, `diagnose`, `report`, `improve` or
the pytest face.
"""
