"""Skill evals: the SKILL.md release gate as pytest items, scenario files, and the scorecard.

`lint` holds the checks as pure functions, `scenarios` the schema of `<skill>/evals/<name>.yaml`,
`collect` the pytest nodes, `plugin` the options and collection hooks, and `scorecard` the
dogfood scorecard computed from a run's ledger.
"""

from __future__ import annotations
