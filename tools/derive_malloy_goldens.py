"""Re-derive the goldens of `evals/ecommerce-malloy` from the malloy-samples cases, on this set's data.

For each case of the reference set (`../shared/reference/malloy-samples/evals/ecommerce` by
default) this runs the golden's `canonicalQuery` on the truth package (its `duckdb.table(...)`
rewritten to the truth sources) and the case's `modelQuery` through the model, both on the real
compiler, and writes the case to `evals/ecommerce-malloy/cases.jsonl` with:

- `golden.value`: the canonical query's result, in the reference value's shape (its keys or
  columns), rounded as the reference states `round`;
- `golden.verification`: the second derivation of `tools/malloy_second_queries.py` (SQL run by
  DuckDB on the truth package's table files, no Malloy compiler in between), with the axis the
  canonical query rests on and the one the SQL varies;
- `golden.status`: `verified` where the second derivation and the modelQuery both reproduce
  that value (two derivations on the truth tables, and the model's own route, agree), else
  `provisional` (unscorable: not answered);
- the rubric prefixed with a note that its quoted figures are the original data's, and no
  `alternates` (their values are the original data's).

Run: `python tools/derive_malloy_goldens.py [--reference DIR]`.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
SET_DIR = ROOT / "evals" / "ecommerce-malloy"
REFERENCE = ROOT.parent / "shared" / "reference" / "malloy-samples" / "evals" / "ecommerce"
META = {"round", "currency", "unit", "note"}
RUBRIC_NOTE = (
    "FIGURES: golden.value holds this set's figures (its order_items, inventory_items and users "
    "are synthetic). Figures quoted below are from the original malloy-samples data and only "
    "illustrate the readings; judge the answer's numbers against golden.value.\n"
)


def _rounded(value: Any, places: Any) -> Any:
    if isinstance(value, float) and isinstance(places, int):
        return round(value, places)
    return value


def _is_rank(old: list[dict[str, Any]], column: str) -> bool:
    values = [row.get(column) for row in old]
    return all(isinstance(v, int) and not isinstance(v, bool) for v in values) and sorted(
        values
    ) == list(range(1, len(values) + 1))


def derive(
    case: dict[str, Any],
    truth: Any,
    model: Any,
    second: dict[str, tuple[str, str, str]] | None = None,
) -> tuple[dict[str, Any], str]:
    from pytest_evalloop.targets.embedded.pairing import compare_golden, normalize

    golden = dict(case.get("golden") or {})
    kind = golden.get("kind")
    if kind not in ("scalar", "rows") or not golden.get("canonicalQuery"):
        golden["status"] = "verified"
        golden["verifiedBy"] = "unanswerable: nothing to derive; kept from malloy-samples"
        return {**case, "golden": golden}, "kept"
    rows = truth.rows(golden["canonicalQuery"])
    old = golden.get("value")
    if kind == "scalar":
        if len(rows) != 1:
            raise ValueError(f"{case['qid']}: canonicalQuery returned {len(rows)} rows")
        places = old.get("round")
        value = {k: _rounded(normalize(rows[0].get(k)), places) for k in old if k not in META}
        value.update({k: v for k, v in old.items() if k in META})
    else:
        columns = list(old[0]) if old else list(rows[0]) if rows else []
        # A column the reference numbers 1..n (its `rank`) is the row's place in the
        # canonical query's order: the comparison pairs it with the route's row order.
        ranks = [c for c in columns if c not in (rows[0] if rows else {}) and _is_rank(old, c)]
        value = [
            {c: index + 1 if c in ranks else normalize(r.get(c)) for c in columns}
            for index, r in enumerate(rows)
        ]
    golden["value"] = value
    golden.pop("alternates", None)
    golden["rubric"] = RUBRIC_NOTE + str(golden.get("rubric") or "")
    golden.pop("verification", None)
    seconded, second_route = False, "no second derivation"
    if second and case["qid"] in second:
        sql, primary, varies = second[case["qid"]]
        golden["verification"] = {
            "primaryAxis": primary,
            "variesAxis": varies,
            "note": f"canonical: {primary} (Malloy on the truth package); second derivation "
            f"varies: {varies} (SQL on DuckDB over the same table files).",
            "secondQuery": sql,
        }
        try:
            why_second = compare_golden(value, truth.rows(sql), kind)
        except ValueError as exc:
            why_second = f"failed: {exc}"
        seconded = why_second is None
        second_route = (
            "verification.secondQuery (SQL on the table files) agrees"
            if seconded
            else f"verification.secondQuery disagrees: {why_second}"
        )
    route = "model query not run"
    agreed = False
    if case.get("modelQuery"):
        try:
            # Compared by value: the model names its figure after its measure (user_count
            # for buyers), which is no difference.
            why = compare_golden(value, model.rows(case["modelQuery"]), kind)
        except ValueError as exc:
            why = f"failed: {exc}"
        agreed = why is None
        route = "modelQuery agrees" if agreed else f"modelQuery disagrees: {why}"
    golden["status"] = "verified" if agreed and seconded else "provisional"
    golden["verifiedBy"] = (
        "tools/derive_malloy_goldens.py: canonicalQuery on the truth package (ecommerce-truth), "
        f"{second_route}, {route}"
    )
    return {**case, "golden": golden}, golden["status"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--reference", type=Path, default=REFERENCE)
    args = parser.parse_args(argv)
    sys.path.insert(0, str(ROOT))
    sys.path.insert(0, str(ROOT / "tools"))
    from malloy_second_queries import SECOND

    from pytest_evalloop.sets.cases import load_set_config
    from pytest_evalloop.targets.malloy.package import malloy_spec
    from pytest_evalloop.targets.malloy.truth import PackageQueries

    config = load_set_config(SET_DIR)
    spec = malloy_spec(SET_DIR, config, None)
    assert spec.truth is not None, "set.json names the truth package"
    truth = PackageQueries(spec.truth, sql=True)
    # The model route: the same synchronous client, pointed at the model package instead.
    model = PackageQueries(spec.package)
    out = []
    counts: dict[str, int] = {}
    try:
        for line in (args.reference / "cases.jsonl").read_text(encoding="utf-8").splitlines():
            if not line.strip():
                continue
            case, status = derive(json.loads(line), truth, model, SECOND)
            counts[status] = counts.get(status, 0) + 1
            if status == "provisional":
                print(f"{case['qid']}: {case['golden']['verifiedBy']}", file=sys.stderr)
            out.append(json.dumps(case, ensure_ascii=False))
    finally:
        truth.close()
        model.close()
    (SET_DIR / "cases.jsonl").write_text("\n".join(out) + "\n", encoding="utf-8")
    print(f"wrote {SET_DIR / 'cases.jsonl'}: {len(out)} cases, {counts}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
