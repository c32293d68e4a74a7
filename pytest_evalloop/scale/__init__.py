"""Scale-out: one run over many workers and machines.

- `sharding`: the xdist scheduler that deals case items into one shard per worker (within one
  machine), and the crash rerun of a case whose worker died.
- `merge`: `evalloop merge`, the shards of a sharded run (`--eval-shard=I/N` across CI jobs)
  checked to be one run and written as one, closed by `session.runs.finish_run`.
- `rungate`: `evalloop gate`, the in-run gate over the merged (or any stored) run.

Which shard holds a qid is `sets.partition`'s and a sharded run in words is
`measure.shardrule`'s: the options, the selection and every report need them, so they sit low.

May import: `session`, `review` and every stage below them, and the bottom (`failures`,
`stash`); never the pytest face (the terminal summary and the gate's settings are handed in by
`cli`).
"""
