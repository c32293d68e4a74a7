"""The three roles of an eval (target, answerer, judge) and the records they exchange
(`contract`: tool specs and outcomes, tool uses, the answer record, the protocols a user's own
role satisfies).

Owns the interface between the stages, not any role's behaviour: `targets` implements its
target side, `answer` its answerer side, `judge` is called through it. It sits below `targets`
because a target's session returns its records.

May import: `ledger`, `measure`, `judge`, `model_api`, `sets` and the bottom (`failures`,
`stash`, the package's `__init__`); never `targets`, `answer` or anything above.
"""
