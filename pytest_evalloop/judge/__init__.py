"""Judging one attempt: the doctrine (`doctrine.md`, every released version's sha in
`doctrine_versions.json`), the case prompt with all untrusted text fenced, verdict parsing and
the golden gate (`judge`), and which score of an attempt counts when the judge is asked more
than once (`judgesamples`).

Layer 3 of the declared order (`tests/test_architecture.py`). It may import `model_api`, `sets`
and the bottom layer (the package root, `failures`, `stash`). It sits below the ledger
because reading a run back asks `judgesamples` which score counts; the judge role built from
settings (`AnthropicJudge`) is `pytest_evalloop.answer.backends`, with the other built-in roles.
"""
