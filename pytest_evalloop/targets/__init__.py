"""The targets an answerer queries: an MCP server reached in-process, over stdio or streamable
HTTP through a tool profile (`target`, `profiles`), MCP results as the roles' records and as
Anthropic tool blocks (`bridge`), and our own ecommerce target (`embedded/`). The Malloy target
goes here too.

Layer 7 of the declared order (`tests/test_architecture.py`). It may import
`roles` (the records a target exchanges), `measure`, `ledger`, `judge`,
`model_api`, `sets` and the bottom layer (the package root, `failures`, `stash`); never
`answer`, which drives a target, or anything above it.
"""
