"""`evalloop demo`: a whole eval loop in one command, with no key and no network.

It copies the example set that ships in the package (`demo/ecommerce/`: the repository's
`evals/ecommerce`) into a working folder of its own, starts the loopback fake of the Messages
API (`pytest_evalloop.testing`) in this process with the spec that ships beside it
(`demo/spec.json`: every golden query answered; six cases scripted to count order lines where
the question asks for orders, and judged no_match; a near_match, a needs_human, one
contaminated attempt, one answer that submits no query, the four unanswerable cases declined),
and runs the set twice as a user would, with `python -m pytest`:

1. the baseline, `--eval-label=demo-baseline`;
2. after one model doc changed (`demo/change.json`: a sentence on the `orders` source, in the
   copy only), the whole set again against it, `--baseline=demo-baseline --eval-gate=bar`. The
   fake now answers the six cases the sentence is about as the golden does.

It prints where the report is and what the gate decided, stops the fake, and exits with the
gated run's exit status. Nothing outside the working folder is written; the user's own files
are never touched. It sits above `testing` in the layer order, under `cli` alone: the only
part of the package besides the tests that starts a fake. The code is `demo.command`.
"""
