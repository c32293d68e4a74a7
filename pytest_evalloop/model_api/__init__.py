"""The Messages API as every role calls it: one call and its failures (`endpoint`), the one
tool-use conversation every role holds with its policy per role (`toolloop`), the
session's shared requests/tokens budget (`ratelimit`, its arithmetic in `budget`), what a call's tokens cost and the usage
record itself (`pricing`), and the one redaction every text passes before a file or a screen
(`redaction`).

Layer 2 of the declared order (`tests/test_architecture.py`). It may import `sets` and the
bottom layer (the package root, `failures`, `stash`); never a role, the ledger or anything
above them. An endpoint failure is `failures.HarnessError`, so this package needs no role.
"""
