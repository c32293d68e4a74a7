"""`ledger.writer.contained_dir`, the fence every artifact and run folder is built through.

It asks the disk once (`lstat`) and resolves both sides only when the entry is a link; the
rule it keeps is the plain one, `(root / name).resolve().parent == root.resolve()`. These tests
hold it to that rule for every name and every thing that can already stand at `root / name`,
under a `root` that is itself reached through a link or not.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pytest_evalloop.ledger.writer import contained_dir

# What already stands at root/name when the fence is asked.
_ENTRIES = (
    "nothing",
    "folder",
    "file",
    "fifo",
    "link-inside",
    "link-outside",
    "link-dangling",
    "link-to-root",
    "link-loop",
)

_NAMES = st.one_of(
    st.sampled_from(["q1", "a.b", "..", ".", "", "a/b", "/abs", "x\0y", "\\w", "..."]),
    st.text(min_size=0, max_size=12),
)


def _plain_rule(root: Path, name: str) -> bool:
    """The rule as first written: refuse a bad name, then resolve both sides."""
    if not name or "\0" in name or name in (".", "..") or "/" in name or "\\" in name:
        return False
    return (root / name).resolve().parent == root.resolve()


def _arrange(base: Path, entry: str, root_is_link: bool, name: str) -> Path:
    real_root = base / "real-root"
    real_root.mkdir()
    (base / "outside").mkdir()
    (real_root / "sibling").mkdir()
    root = real_root
    if root_is_link:
        root = base / "root-link"
        root.symlink_to(real_root)
    if not _plain_name(name):
        return root
    target = root / name
    if entry == "folder":
        target.mkdir()
    elif entry == "file":
        target.write_bytes(b"x")
    elif entry == "fifo":
        os.mkfifo(target)
    elif entry == "link-inside":
        target.symlink_to(real_root / "sibling")
    elif entry == "link-outside":
        target.symlink_to(base / "outside")
    elif entry == "link-dangling":
        target.symlink_to(base / "nowhere")
    elif entry == "link-to-root":
        target.symlink_to(real_root)
    elif entry == "link-loop":
        target.symlink_to(target)
    return root


def _plain_name(name: str) -> bool:
    return (
        bool(name)
        and "\0" not in name
        and name not in (".", "..")
        and "/" not in name
        and ("\\" not in name)
    )


@settings(max_examples=120, deadline=None)
@given(name=_NAMES, entry=st.sampled_from(_ENTRIES), root_is_link=st.booleans())
def test_the_fence_keeps_the_resolving_rule(name: str, entry: str, root_is_link: bool) -> None:
    with tempfile.TemporaryDirectory() as folder:
        base = Path(folder)
        try:
            root = _arrange(base, entry, root_is_link, name)
        except (OSError, ValueError):  # a name this filesystem cannot hold: nothing to fence
            return
        try:
            allowed = _plain_rule(root, name)
        except (OSError, RuntimeError):  # a loop the plain rule itself cannot resolve
            allowed = None
        try:
            got: Path | None = contained_dir(root, name)
        except ValueError:
            got = None
        if allowed is None:  # the plain rule raised: the fence refuses, and says why
            assert got is None
            return
        assert (got is not None) == allowed, (name, entry, root_is_link)
        if got is not None:
            assert got == root / name


@pytest.mark.parametrize("entry", ["link-outside", "link-dangling", "link-to-root", "link-loop"])
def test_a_link_planted_under_the_root_that_leads_out_is_refused(
    tmp_path: Path, entry: str
) -> None:
    root = _arrange(tmp_path, entry, False, "planted")
    with pytest.raises(ValueError, match="resolves outside|cannot be resolved"):
        contained_dir(root, "planted")


def test_a_link_to_a_sibling_inside_the_root_is_allowed_as_before(tmp_path: Path) -> None:
    root = _arrange(tmp_path, "link-inside", False, "planted")
    assert contained_dir(root, "planted") == root / "planted"
