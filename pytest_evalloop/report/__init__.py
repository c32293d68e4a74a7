"""The run report: what it shows, gathered from the ledger as pure data, and the Markdown
summary for CI (`report`), the report as one self-contained HTML file and `runs/index.html`
(`html`, with its Jinja2 `templates/`), and the charts drawn to inline SVG by pygal in a child
process (`charts`).

Layer 11 of the declared order (`tests/test_architecture.py`). It may import `diagnose`,
`goldens`, `answer`, `targets`, `roles`, `measure`, `ledger`, `judge`,
`model_api`, `sets` and the bottom layer (the package root, `failures`, `stash`); never
`improve` or the pytest face, which calls it at the end of a session.
"""
