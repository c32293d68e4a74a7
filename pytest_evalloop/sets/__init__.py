"""The eval set on disk: `cases` reads and writes a set's files as models (`set.json`,
`cases.jsonl`, `judge-regressions.jsonl`), checks question seals and computes `datasetSha`.

Layer 1 of the declared order (`tests/test_architecture.py`). It may import only the bottom
layer (the package root, `failures`, `stash`): every stage reads a set, so nothing here may
reach up into one. A set's goldens beyond reading them (the side door, the pre-run check) are
`pytest_evalloop.goldens`, beside this package and above the targets they re-derive on.
"""
