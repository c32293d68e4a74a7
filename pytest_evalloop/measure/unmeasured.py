"""A run that measured nothing, and why: the rule the summary's WARNING and the exit status read.

A run **measured nothing** when most of its attempts that count were not submitted (the
answerer gave no final query: `aggregates.ANSWERER_DID_LESS`), or when not one attempt was
decided (`match` or `no_match`). Such a run can still end "4 passed, 40 unscored" with a pass
rate of 100% over the four: every figure is true and none of them is a measurement. So the
summary leads with a WARNING naming the most common cause, counted over the undecided
attempts from the ledger (a tool call's error, shortened to its gist: `execute_query: Field
required 'sql' × 40`; else the harness error, else the score's reason), and the session exits
`gate.EXIT_NOTHING_MEASURED` unless `--eval-allow-unmeasured` says the case is deliberate.

Decided over the run's `aggregates.Tally`; only a run that measured nothing has its ledger read
again for the causes (its tool calls, which closing never reads). The plugin's summary and
`evalloop report` call the same function.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from pytest_evalloop.ledger.reader import RunLedger, read_run
from pytest_evalloop.measure.aggregates import DECIDED, Key, Tally

MOST = 0.5
"""More than this share of the counted attempts not submitted is "most"."""
CAUSES_SHOWN = 3
CAUSE_CHARS = 100

# pydantic's message, as an MCP server returns it for bad tool arguments:
# "1 validation error for execute_queryArguments\nsql\n  Field required [type=missing, ...".
_VALIDATION = re.compile(r"validation errors? for \S+\s*\n(\S+)\s*\n\s+([^\n\[]+?)\s*\[type=")


@dataclass(frozen=True)
class Unmeasured:
    """Why a run measured nothing, and what most often stood in the way."""

    why: str
    causes: tuple[tuple[str, int], ...]
    """The causes of the undecided attempts, most common first, each with its count."""

    def lines(self, exit_code: int | None = None) -> list[str]:
        """The WARNING the summary leads with; `exit_code` is what the session exits because
        of it (None: `--eval-allow-unmeasured`, or a stored run's report)."""
        lines = [f"WARNING: this run measured nothing: {self.why}"]
        for n, (cause, count) in enumerate(self.causes[:CAUSES_SHOWN]):
            head = "most common cause" if n == 0 else "then"
            lines.append(f"  {head}: {cause} × {count}")
        advice = "fix the cause above (events.jsonl holds each tool call's error)"
        if exit_code is not None:
            advice = (
                f"the session exits {exit_code}: {advice}, or pass --eval-allow-unmeasured "
                "if it is deliberate"
            )
        lines.append(f"  {advice}")
        return lines


CAUSE_KINDS = frozenset({"attempt", "score", "tool_call"})


def unmeasured_why(tally: Tally) -> str | None:
    """Why the run measured nothing, in a line, or None when it measured something (or holds
    no attempt): the one rule the WARNING, the exit status and the comparability rule read."""
    attempts = tally.attempts
    if not attempts:
        return None
    not_submitted = sum(1 for a in attempts if a.counts and a.did_less)
    if tally.answerable and not_submitted / tally.answerable > MOST:
        return (
            f"{not_submitted} of {tally.answerable} attempts were not submitted "
            f"(no final query); {tally.decided} decided"
        )
    if tally.decided == 0:
        return f"none of its {len(attempts)} attempts was decided (match or no_match)"
    return None


def unmeasured(tally: Tally, run_dir: Path) -> Unmeasured | None:
    """`unmeasured_why` with the most common causes, read from the run's tool calls."""
    why = unmeasured_why(tally)
    if why is None:
        return None
    undecided = [(a.qid, a.sample) for a in tally.attempts if a.outcome not in DECIDED]
    read = read_run(run_dir, kinds=CAUSE_KINDS, validate=False)
    return Unmeasured(why=why, causes=tuple(causes(read, undecided).most_common()))


def causes(read: RunLedger, keys: list[Key]) -> Counter[str]:
    """One cause per attempt: its most frequent tool error, else its harness error, else its
    score's reason (the outcome word and reason), else that it submitted no final query."""
    errors: dict[Key, Counter[str]] = {}
    for call in read.of_kind("tool_call"):
        if call.error:
            gist = tool_error_gist(call.tool, call.error)
            errors.setdefault((call.qid, call.sample), Counter())[gist] += 1
    attempt_of = read.attempts()
    score_of = read.scores()
    found: Counter[str] = Counter()
    for key in keys:
        attempt, score = attempt_of.get(key), score_of.get(key)
        if key in errors:
            found[errors[key].most_common(1)[0][0]] += 1
        elif attempt is not None and attempt.error:
            found[f"harness error: {_first_line(attempt.error)}"] += 1
        elif score is not None:
            found[f"{score.verdict or 'unscored'}: {score.reason}"] += 1
        else:
            found["no final query submitted"] += 1
    return found


def tool_error_gist(tool: str, error: str) -> str:
    """`execute_query: Field required 'sql'` from the server's whole validation message; any
    other error's first line, cut at a word."""
    text = error.removeprefix(f"Error executing tool {tool}: ")
    found = _VALIDATION.search(text)
    if found:
        return f"{tool}: {found[2].strip()} {found[1]!r}"
    return f"{tool}: {_first_line(text)}"


def _first_line(text: str) -> str:
    line = " ".join((text.strip().splitlines() or [""])[0].split())
    if len(line) <= CAUSE_CHARS:
        return line
    return line[:CAUSE_CHARS].rsplit(" ", 1)[0] + " …"
