"""Skill evals: the SKILL.md release gate as pytest items, scenario files, and the scorecard.

`lint` holds the checks as pure functions (`body` reads a SKILL.md's Markdown for them, `sidecar`
is the schema of `agileflow.skill.yaml`), `scenarios` the schema of `<skill>/evals/<name>.yaml`,
`collect` the pytest nodes, `plugin` the options and collection hooks, and `scorecard` the
dogfood scorecard computed from a run's ledger; `metrics` the activation figures over every
scenario that the summary and the activation gate both read.

Layer 17 of the declared order (`tests/test_architecture.py`), above the pytest face: the
skills plugin is loaded by the main plugin and shares its options, stash and run
directories, so it may import any layer of the package; nothing but `testing` sits above it.
"""

from __future__ import annotations
