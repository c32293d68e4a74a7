"""What one evalloop session does with its runs, below the pytest face that drives it.

- `runs`: which run directory a session writes to (one per set, agreed by every process
  through the session id), the resume checks, and how a run closes (`finish_run`).
- `selection`: what a run selected of its set (its design and every narrowing flag) and, at the
  close, how much of its split it attempted.
- `flagcheck`: every comparison and configuration flag resolved before the first request.
- `estimate`: what the session's attempts will cost (the spend ceiling's reservation,
  `--eval-estimate`).

May import: `review` and every stage below it, and the bottom (`failures`, `stash`); never
`scale` or the pytest face. What the face owns (which items are cases, which are not answered)
is handed in by the plugin.
"""
