"""Opening a directory store of the earlier two-level layout (``<root>/<aa>/<b>/<page>``)
moves its leaves to the one-level names (``<root>/<aab>/<page>``): every page stays readable,
a page both layouts hold keeps the newer copy, links are never followed or moved, and a
read-only open changes nothing."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest

from radixlink.stores.directory import DirectoryStore

from .conformance import key, payload


def _as_two_level(root: Path) -> list[Path]:
    """Rewrite a store's leaves into the old layout (``aab`` -> ``aa/b``), as the version
    before 2026-12 left them; returns the old leaves."""
    old = []
    for leaf in sorted(p for p in root.iterdir() if p.is_dir() and len(p.name) == 3):
        parent = root / leaf.name[:2]
        parent.mkdir(exist_ok=True)
        leaf.rename(parent / leaf.name[2])
        old.append(parent / leaf.name[2])
    return old


def test_pages_of_the_two_level_layout_stay_readable(tmp_path: Path,
                                                     caplog: pytest.LogCaptureFixture) -> None:
    root = tmp_path / "store"
    store = DirectoryStore(root)
    store.put({key(i): payload(i, 300) for i in range(40)})
    old = _as_two_level(root)
    with caplog.at_level(logging.WARNING, logger="radixlink.stores.directory"):
        ro = DirectoryStore(root, read_only=True)
    assert ro.stats()["pages"] == 0 and ro.stats()["old_layout_leaves"] == len(old)
    assert "radixlink store gc" in caplog.text  # the operator is told what to run
    assert not any(p.is_dir() and len(p.name) == 3 for p in root.iterdir())  # nothing moved
    fresh = DirectoryStore(root)
    assert fresh.stats()["pages"] == 40 and fresh.stats()["old_layout_leaves"] == 0
    assert fresh.get([key(i) for i in range(40)]) == [payload(i, 300) for i in range(40)]
    assert all(len(p.name) == 3 for p in root.iterdir() if p.is_dir())  # no old one left


def _same_shard_keys(store: DirectoryStore, n: int) -> list[str]:
    first = Path(store.path_of(key(0))).parent
    return [k for k in map(key, range(20_000)) if Path(store.path_of(k)).parent == first][:n]


def test_a_page_in_both_layouts_keeps_the_new_copy(tmp_path: Path) -> None:
    """A process of this version wrote a key at its new path meanwhile: that copy stays and
    the old one is dropped; the old pages the new leaf lacks move into it."""
    root = tmp_path / "store"
    store = DirectoryStore(root)
    a, b = _same_shard_keys(store, 2)
    store.put({a: b"old" * 100, b: b"bee" * 100})
    old_leaves = _as_two_level(root)
    new_page = Path(store.path_of(a))
    new_page.parent.mkdir()
    new_page.write_bytes(b"new" * 100)
    fresh = DirectoryStore(root)
    assert fresh.get([a, b]) == [b"new" * 100, b"bee" * 100]
    assert fresh.stats()["pages"] == 2
    assert not any(leaf.exists() for leaf in old_leaves)


def test_links_in_the_old_layout_are_neither_followed_nor_moved(tmp_path: Path) -> None:
    """Links where old or new leaves would be, to directories outside: nothing moves out of
    or into them, nothing outside is touched, the links stay, the real old leaf stays."""
    root = tmp_path / "store"
    store = DirectoryStore(root)
    [a] = _same_shard_keys(store, 1)
    store.put({a: b"page"})
    [old_leaf] = _as_two_level(root)
    outside = tmp_path / "outside"
    (outside / "0").mkdir(parents=True)
    (outside / "0" / "victim").write_bytes(b"not the store's")
    linked_parent = "ab" if old_leaf.parent.name != "ab" else "cd"
    os.symlink(outside, root / linked_parent)  # an old first level that is a link
    os.symlink(outside / "0", old_leaf.parent / "x")  # an old leaf that is a link
    new_leaf = root / (old_leaf.parent.name + old_leaf.name)
    os.symlink(outside / "0", new_leaf)  # the new leaf is a link: the old one must stay
    fresh = DirectoryStore(root)
    assert fresh.get([a]) == [None]  # not read through the link, not moved into it
    assert sorted(p.name for p in (outside / "0").iterdir()) == ["victim"]
    assert (outside / "0" / "victim").read_bytes() == b"not the store's"
    assert (root / linked_parent).is_symlink() and (old_leaf.parent / "x").is_symlink()
    assert not (root / (linked_parent + "0")).exists()
    assert (old_leaf / Path(store.path_of(a)).name).read_bytes() == b"page"
    assert fresh.stats()["old_layout_leaves"] == 1  # kept, and said so
