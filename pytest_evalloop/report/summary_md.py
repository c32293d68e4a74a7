"""The CI summary of a run: its headline, flips and gate decision as GitHub-flavoured Markdown
(`--eval-summary-md`, `$GITHUB_STEP_SUMMARY`), from the same `Report` the HTML page renders."""

from __future__ import annotations

from pytest_evalloop.measure import aggregates
from pytest_evalloop.measure.shardrule import SHARDS_TITLE, shard_note
from pytest_evalloop.report.report import Report, pass_rate_text


def markdown(report: Report) -> str:
    """The headline, the flip table and the gate decision, as GitHub-flavoured Markdown."""
    tally = report.tally
    lines = [f"### evalloop: {_md(report.name)} ({report.info.status or 'open'})", ""]
    counts = ", ".join(f"{n} {word}" for word, n in tally.outcomes.items()) or "none"
    lines.append(f"- verdicts: {counts}")
    lines.append(f"- pass rate: {pass_rate_text(report)}")
    lines.append(f"- {tally.submitted_text}")
    lines.extend(f"- {_md(line)}" for line in report.agreement)
    if tally.human_settled:
        lines.append(f"- {tally.human_text}")
    note = shard_note(report.info)
    if note:
        lines.append(f"- {SHARDS_TITLE}: {_md(note)}")
    if tally.recall is not None:
        lines.append(f"- retrieval recall: mean {tally.recall:.2f} over {len(tally.recalls)}")
    lines += [f"- {_md(line)}" for line in report.figures]
    for role, cost in sorted(report.costs.items()):
        if cost.calls:
            money = "unknown" if cost.cost_usd is None else f"${cost.cost_usd:.4f}"
            lines.append(
                f"- {role}: {cost.input_tokens} in / {cost.output_tokens} out tokens, {money}"
            )
    lines += [f"- {_md(line)}" for line in report.cost_notes]
    for word, n, why in report.left_out:
        if word in aggregates.OUT_OF_EVERY_AGGREGATE:
            lines.append(f"- left out: {n} {word} ({why})")
    base = report.baseline
    if base is not None:
        lines += ["", f"Against baseline {_code(base.name)}:", ""]
        lines += [f"- {_md(line)}" for line in base.context_lines]
        lines += ["", "| flips | cases |", "|---|---|"]
        lines += [f"| {name} | {n} |" for name, n in base.table.items()]
        if base.comparison.submitted_fell:
            lines += ["", f"**{_md(base.comparison.submitted_fell)}**"]
        lines += ["", f"**Gate: {base.decision}** ({_code(base.mode)}): {_md(base.reason)}"]
        lines += [f"- {_md(line.strip())}" for line in base.paired_lines]
        for flip in base.flipped:
            lines.append(f"- {flip.direction}: {_code(flip.qid)}")
    return "\n".join(lines) + "\n"


def _code(text: str) -> str:
    # A code span shows its text literally; only a backtick could end it.
    return "`" + text.replace("`", "'").replace("\n", " ") + "`"


def _md(text: str) -> str:
    # Run text in Markdown: no HTML, no table breaks, no link syntax taken literally.
    out = text.replace("\\", "\\\\")
    for ch in "<>|[]`*_":
        out = out.replace(ch, "\\" + ch)
    return out.replace("\n", " ")
