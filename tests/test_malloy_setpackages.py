"""Which packages a Malloy set names, where they are found, and the tables made for them.

No compiler here: set.json is read (`targets.malloy.setpackages`), folders are found, and the
malloy-samples tables are linked from the per-machine cache (`targets.malloy.gen_data`).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from pytest_evalloop import cli
from pytest_evalloop.sets.cases import load_set_config
from pytest_evalloop.targets.choice import no_truth_reason, truth_source
from pytest_evalloop.targets.malloy import gen_data
from pytest_evalloop.targets.malloy.package import malloy_spec
from pytest_evalloop.targets.malloy.setpackages import (
    MalloyError,
    PackageNotFound,
    set_packages,
    truth_package,
)
from tests.conftest import REPO

PRODUCTS = REPO / "evals" / "ecommerce-malloy" / "ecommerce" / "data" / "products.parquet"


def _tree(root: Path, meta: dict[str, Any], *, set_at: str = "evals/shop") -> Path:
    """malloy-samples' layout: packages at the root, the set two levels down."""
    for package, model in (("shop", "shop.malloy"), ("shop-truth", "truth.malloy")):
        (root / package / "data").mkdir(parents=True)
        (root / package / model).write_text("source: s is duckdb.table('data/products.parquet')\n")
    shutil.copyfile(PRODUCTS, root / "shop" / "data" / "products.parquet")
    set_dir = root / set_at
    set_dir.mkdir(parents=True)
    (set_dir / "set.json").write_text(json.dumps({"name": "shop", **meta}))
    (set_dir / "cases.jsonl").write_text("")
    return set_dir


def test_the_truth_package_is_found_above_the_set_and_beside_the_package(tmp_path: Path) -> None:
    set_dir = _tree(tmp_path, {"truthPackage": "shop-truth", "truthTableRewrite": True})
    config = load_set_config(set_dir)
    truth = truth_package(set_dir, config)
    assert truth is not None and truth.root == (tmp_path / "shop-truth").resolve()
    assert (truth.model_path, truth.table_rewrite) == ("truth.malloy", True)
    # --eval-target=malloy:<dir>: the same truth, whatever answers the set.
    spec = malloy_spec(set_dir, config, f"malloy:{tmp_path / 'shop'}")
    assert spec.truth_root == truth.root and spec.truth_rewrite
    source = truth_source(set_dir, config, target=f"malloy:{tmp_path / 'shop'}")
    assert source is not None and source.package == truth
    assert source.data_from == (tmp_path / "shop" / "data").resolve()
    # answered by another server (a Publisher): the same truth package, found from the set.
    assert truth_source(set_dir, config, target="http://publisher.example/mcp") is not None
    assert set_packages(set_dir, config) == [truth.root]


def test_the_set_itself_is_never_taken_for_a_package_named_like_it(tmp_path: Path) -> None:
    set_dir = _tree(tmp_path, {"targetPackage": "shop"}, set_at="evals/shop")
    assert set_packages(set_dir, load_set_config(set_dir)) == [(tmp_path / "shop").resolve()]


def test_a_truth_package_that_is_not_there(tmp_path: Path) -> None:
    set_dir = _tree(tmp_path, {"truthPackage": "nowhere"})
    config = load_set_config(set_dir)
    with pytest.raises(PackageNotFound, match="truthPackage 'nowhere' is no folder beside the set"):
        truth_package(set_dir, config)
    # Answered elsewhere: no truth connection here, and every route says why.
    assert truth_source(set_dir, config, target=None) is None
    assert "truthPackage 'nowhere' is no folder" in no_truth_reason(set_dir, config)
    # Answered by a local package: the package check's usage error.
    with pytest.raises(MalloyError, match="nowhere"):
        malloy_spec(set_dir, config, f"malloy:{tmp_path / 'shop'}")


def test_the_package_under_test_is_never_its_own_truth(tmp_path: Path) -> None:
    set_dir = _tree(tmp_path, {"truthPackage": "shop"})
    with pytest.raises(MalloyError, match="the package the answerer queries"):
        malloy_spec(set_dir, load_set_config(set_dir), f"malloy:{tmp_path / 'shop'}")


def test_a_key_given_twice_must_agree(tmp_path: Path) -> None:
    block = {"kind": "malloy", "package": "../../shop", "truthPackage": "shop-truth"}
    set_dir = _tree(tmp_path, {"target": block, "truthPackage": "shop-truth"})
    assert malloy_spec(set_dir, load_set_config(set_dir), None).truth_root is not None
    block["truthPackage"] = "other-truth"
    set_dir = _tree(tmp_path / "b", {"target": block, "truthPackage": "shop-truth"})
    with pytest.raises(MalloyError, match="truthPackage is given twice, 'shop-truth' at the top"):
        malloy_spec(set_dir, load_set_config(set_dir), None)


def test_malloy_data_links_both_packages_and_never_replaces_a_table_of_your_own(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    set_dir = _tree(tmp_path, {"targetPackage": "shop", "truthPackage": "shop-truth"})
    assert cli.main(["malloy-data", str(set_dir)]) == 0
    for folder in (tmp_path / "shop" / "data", tmp_path / "shop-truth" / "data"):
        assert sorted(p.name for p in folder.glob("*.parquet")) == sorted(gen_data.TABLE_FILES)
        assert (folder / "order_items.parquet").is_symlink()
    # The truth package had no products.parquet: it links to the package's own file.
    truth_products = tmp_path / "shop-truth" / "data" / "products.parquet"
    assert truth_products.resolve() == (tmp_path / "shop" / "data" / "products.parquet").resolve()
    own = tmp_path / "shop-truth" / "data" / "users.parquet"
    own.unlink()
    own.write_bytes(b"PAR1 a table of the user's own")
    assert cli.main(["malloy-data", str(set_dir)]) == 2
    assert f"{own} is a file of its own, not a link this command made" in capsys.readouterr().err
    assert own.read_bytes() == b"PAR1 a table of the user's own"
    assert cli.main(["malloy-data", str(tmp_path / "nowhere")]) == 2
    assert "no such folder" in capsys.readouterr().err


def test_the_missing_table_command_names_the_folders_that_make_them(tmp_path: Path) -> None:
    data = tmp_path / "shop" / "data"
    data.mkdir(parents=True)
    missing = [tmp_path / "truth" / "data" / "order_items.parquet"]
    assert gen_data.fix_command(missing, [data]) is None  # no products.parquet anywhere
    shutil.copyfile(PRODUCTS, data / "products.parquet")
    assert gen_data.fix_command(missing, [data]) == (
        f"evalloop malloy-data {data} {tmp_path / 'truth' / 'data'}"
    )
    assert gen_data.fix_command([data / "sessions.parquet"], [data]) is None  # not one of ours
