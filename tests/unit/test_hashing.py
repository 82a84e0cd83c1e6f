"""Page-chain hashes and namespaces: golden vectors of docs/hashing.md, chain rules, validation."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from radixlink.hashing import (
    DIGEST_SIZES,
    HASH_FORMAT_VERSION,
    NAMESPACE_TAG,
    Namespace,
    key_hashes,
    namespace_id,
    page_hashes,
)
from radixlink.tokens import token_bytes

TOKENS = [1, 2, 3, 4, 5, 6, 7, 8]
SHA_H0 = "cf97adeedb59e05bfd73a2b4c2a8885708c4f4f70c84c64b27120e72ab733b72"
SHA_H1 = "4ebfa8a1f3c341517621838c6e1b9aa350307e3f00b3cbd1a07ef740f54396d6"
TINY = Namespace(model="tiny", layout="bf16")
TINY_FRAMED = "72616469786c696e6b2e6e616d657370616365000400000074696e790400000062663136"
TINY_SEED = "c84a41a1dc8989947b8052e8a8c16a5795052a001f3a99bb7e09e3f952b7c34c"
TINY_H = [
    "6479ebd03836f83eaf5c3ecd4f3d3dfeba4de61b4eb70ba17cc4d210c9f770ea",
    "7a45bd7606bd5d4947fd07cf655afa025887ec238d52f0b443b8742c9c12a880",
]
XXH3_H = ["903ce79ac359c3eb2de5421794dd19f0", "b51e0214fc0b8c66b0445f16c5d1509d"]
XXH3_TINY_SEED = "d3c079af139391f60628a066fe169ce0"
XXH3_TINY_H = ["cb88674269e6f72d8149714564354539", "e78f8f39d374bafeaa57aba1ba763068"]
EMPTY_NS_ID = "3db556f9a9a8e251"


def _reference(tokens: list[int], page_size: int, seed: bytes = b"") -> list[str]:
    """Straight-from-the-spec sha256 chain, one struct.pack per page."""
    prev, out = seed, []
    for start in range(0, len(tokens) - page_size + 1, page_size):
        page = struct.pack(f"<{page_size}I", *tokens[start : start + page_size])
        prev = hashlib.sha256(prev + page).digest()
        out.append(prev.hex())
    return out


def test_golden_vectors_sha256_no_namespace() -> None:
    """The docs' worked example: [1..8], page_size 4, no namespace."""
    assert page_hashes(TOKENS, 4) == [SHA_H0, SHA_H1]
    assert HASH_FORMAT_VERSION == 1


def test_golden_vectors_sha256_namespace() -> None:
    """The docs' namespaced example: framing bytes, seed, id and both page hashes."""
    framed = NAMESPACE_TAG + b"\x04\x00\x00\x00tiny\x04\x00\x00\x00bf16"
    assert framed.hex() == TINY_FRAMED
    assert TINY.seed().hex() == TINY_SEED == hashlib.sha256(framed).hexdigest()
    assert TINY.id == TINY_SEED[:16]
    assert page_hashes(TOKENS, 4, TINY) == TINY_H


def test_golden_vectors_xxh3() -> None:
    """xxh3-128 vectors of the docs, with and without a namespace."""
    assert page_hashes(TOKENS, 4, algo="xxh3") == XXH3_H
    assert TINY.seed("xxh3").hex() == XXH3_TINY_SEED
    assert page_hashes(TOKENS, 4, TINY, algo="xxh3") == XXH3_TINY_H
    assert TINY.id == namespace_id(TINY)  # the id does not depend on the algo


@pytest.mark.parametrize("page_size", [1, 3, 16, 64])
def test_matches_reference_implementation(page_size: int) -> None:
    """Random tokens, including 0 (trailing zero bytes) and 2**32-1, match the spec."""
    rng = np.random.default_rng(page_size)
    tokens = rng.integers(0, 2**32, size=10 * page_size + 1, dtype=np.uint64).tolist()
    tokens[page_size - 1] = 0
    tokens[0] = 2**32 - 1
    assert page_hashes(tokens, page_size) == _reference(tokens, page_size)
    seed = TINY.seed()
    assert page_hashes(tokens, page_size, TINY) == _reference(tokens, page_size, seed)


@settings(max_examples=60, deadline=None, derandomize=True)
@given(
    tokens=st.lists(st.integers(0, 2**32 - 1), max_size=40),
    page_size=st.integers(1, 8),
    split_pages=st.integers(0, 6),
)
def test_parent_continuation_equals_whole_sequence(
    tokens: list[int], page_size: int, split_pages: int
) -> None:
    """Hashing a tail with parent=hash of the page before equals hashing everything at once."""
    whole = page_hashes(tokens, page_size, TINY)
    assert whole == _reference(tokens, page_size, TINY.seed())
    cut = min(split_pages, len(whole))
    if cut == 0:
        return
    tail = page_hashes(tokens[cut * page_size :], page_size, parent=whole[cut - 1])
    assert whole[:cut] + tail == whole
    # The namespace is not applied again on top of a parent.
    assert page_hashes(tokens[cut * page_size :], page_size, ("x",), parent=whole[cut - 1]) == tail


@pytest.mark.parametrize("algo", ["sha256", "xxh3"])
def test_page_hash_depends_on_all_earlier_pages(algo: str) -> None:
    """Changing one token of page j changes hashes j.. and leaves hashes before j alone."""
    tokens = list(range(100, 132))
    base = page_hashes(tokens, 4, algo=algo)
    assert len(set(base)) == len(base) == 8
    for j in range(8):
        changed = tokens.copy()
        changed[4 * j + 2] += 1
        hashes = page_hashes(changed, 4, algo=algo)
        assert hashes[:j] == base[:j]
        assert all(a != b for a, b in zip(hashes[j:], base[j:], strict=True))
    # The same page content at another position hashes differently.
    repeated = page_hashes([7, 7, 7, 7] * 3, 4, algo=algo)
    assert len(set(repeated)) == 3


@pytest.mark.parametrize("algo", ["sha256", "xxh3"])
def test_long_inputs_chain_across_internal_chunks(algo: str) -> None:
    """Inputs of thousands of pages (hashed a chunk at a time) equal the page-by-page chain."""
    rng = np.random.default_rng(7)
    tokens = rng.integers(0, 2**32, size=2 * 1500 + 1, dtype=np.int64)
    whole = page_hashes(tokens, 2, TINY, algo=algo)
    assert len(whole) == 1500 and whole == page_hashes(tokens.tolist(), 2, TINY, algo=algo)
    if algo == "sha256":
        assert whole == _reference(tokens.tolist(), 2, TINY.seed())
    for cut in (1, 511, 512, 513, 1024):
        tail = page_hashes(tokens[2 * cut :], 2, parent=whole[cut - 1], algo=algo)
        assert whole[:cut] + tail == whole


@pytest.mark.parametrize(("index", "value"), [(1500, -3), (2999, 2**32), (3000, -1), (0, 2**40)])
def test_bad_token_anywhere_in_a_long_array_raises(index: int, value: int) -> None:
    """An out-of-range token in any chunk, or in the ignored partial tail, raises naming it."""
    tokens = np.arange(3001, dtype=np.int64)
    tokens[index] = value
    with pytest.raises(ValueError, match=rf"got {value} at index {index} \(dtype int64\)"):
        page_hashes(tokens, 2)


@pytest.mark.parametrize("algo", ["sha256", "xxh3"])
@pytest.mark.parametrize("page_size", [1, 4, 16])
def test_key_hashes_of_packed_tokens_equal_page_hashes(algo: str, page_size: int) -> None:
    """#46: the tree and the lookup hash their packed keys (token_bytes) with key_hashes; it is
    page_hashes of the same tokens: from the namespace seed, continuing a parent hash, with a
    partial tail page ignored, and golden vectors included."""
    rng = np.random.default_rng(page_size)
    tokens = rng.integers(0, 2**32, size=7 * page_size + 3, dtype=np.uint64).tolist()
    key = token_bytes(tokens)
    whole = page_hashes(tokens, page_size, TINY, algo=algo)
    assert key_hashes(key, page_size, algo, namespace=TINY) == whole
    cut = 3 * page_size * 4
    assert key_hashes(key[cut:], page_size, algo, parent=whole[2]) == whole[3:]
    assert key_hashes(key[:3], page_size, algo) == []
    assert key_hashes(token_bytes(TOKENS), 4) == [SHA_H0, SHA_H1]


def test_partial_tail_is_ignored() -> None:
    """Only whole pages are hashed; a short sequence gives no hashes."""
    assert page_hashes(TOKENS + [9, 10, 11], 4) == [SHA_H0, SHA_H1]
    assert page_hashes([1, 2, 3], 4) == []
    assert page_hashes([], 4) == []
    assert page_hashes(np.arange(7), 8, TINY, algo="xxh3") == []


def test_namespace_framing_is_injective() -> None:
    """Length-prefixed parts: ("a","bc") != ("ab","c"); empty middle parts count."""
    h = {ns: page_hashes(TOKENS, 4, ns)[0] for ns in [("a", "bc"), ("ab", "c"), ("abc",)]}
    assert len(set(h.values())) == 3
    assert page_hashes(TOKENS, 4, ("", "a")) != page_hashes(TOKENS, 4, ("a",))
    assert namespace_id(("a", "bc")) != namespace_id(("ab", "c"))


def test_each_namespace_field_isolates() -> None:
    """Every Namespace field changes the hashes, and no namespace differs from any namespace."""
    variants = [Namespace()] + [Namespace(**{f.name: "x"}) for f in dataclasses.fields(Namespace)]
    firsts = [page_hashes(TOKENS, 4, ns)[0] for ns in variants]
    assert len(set(firsts)) == len(variants)
    assert len({ns.id for ns in variants}) == len(variants)


@pytest.mark.parametrize("empty", [None, Namespace(), (), [], ("",), ("", "", "", "")])
def test_empty_namespace_is_no_namespace(empty: object) -> None:
    """None, an empty Namespace and all-empty parts start the chain empty and share one id."""
    assert page_hashes(TOKENS, 4, empty) == [SHA_H0, SHA_H1]
    assert namespace_id(empty) == EMPTY_NS_ID
    assert Namespace().seed() == b"" and Namespace().seed("xxh3") == b""


def test_namespace_forms_agree() -> None:
    """A Namespace equals its positional tuple/list; trailing empty parts are dropped."""
    ns = Namespace(model="m", cache_salt="s")
    assert ns.parts() == ("m", "", "s", "")
    for form in [("m", "", "s"), ["m", "", "s", ""], ("m", "", "s", "", "")]:
        assert page_hashes(TOKENS, 4, form) == page_hashes(TOKENS, 4, ns)
        assert namespace_id(form) == ns.id
    assert len(ns.id) == 16 and int(ns.id, 16) >= 0


def test_namespace_is_frozen_and_typed() -> None:
    """Namespace is immutable, keyword-only and rejects non-str fields."""
    with pytest.raises(dataclasses.FrozenInstanceError):
        TINY.model = "other"  # type: ignore[misc]
    with pytest.raises(TypeError):
        Namespace("m")  # type: ignore[misc]
    with pytest.raises(ValueError, match="Namespace.layout must be a str"):
        Namespace(layout=3)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "tokens",
    [
        TOKENS + [9],
        tuple(TOKENS + [9]),
        range(1, 10),
        np.array(TOKENS + [9], dtype=np.int64),
        np.array(TOKENS + [9], dtype=np.int32),
        np.array(TOKENS + [9], dtype=np.uint32),
        np.array(TOKENS + [9], dtype=np.uint16),
        np.array(TOKENS + [9], dtype=np.uint64),
        np.array(TOKENS + [9, 99], dtype=np.int64)[:9],
        np.repeat(np.array(TOKENS + [9], dtype=np.int64), 2)[::2],  # non-contiguous
        torch.tensor(TOKENS + [9]),
        torch.tensor(TOKENS + [9], dtype=torch.int32),
        torch.tensor(TOKENS + [9], dtype=torch.uint8),
        torch.tensor(TOKENS + [9]).repeat_interleave(2)[::2],
        (t for t in TOKENS + [9]),
    ],
    ids=lambda t: type(t).__name__ + "-" + str(getattr(t, "dtype", "")),
)
def test_input_kinds_agree(tokens: object) -> None:
    """Lists, tuples, ranges, generators, numpy arrays and tensors of any int dtype agree."""
    assert page_hashes(tokens, 4) == [SHA_H0, SHA_H1]


@pytest.mark.parametrize(
    ("tokens", "message"),
    [
        ([1, 2.0, 3], "got 2.0 at index 1"),
        ([1, -1], "got -1 at index 1"),
        ([2**32], "got 4294967296 at index 0"),
        ([True, False], "got bool True"),
        ([1, "2"], "got '2' at index 1"),
        (np.array([1.0, 2.0]), "integer dtype, got float64"),
        (np.array([True]), "integer dtype, got bool"),
        (np.array([3, -5]), "got -5 at index 1"),
        (np.array([2**32], dtype=np.uint64), "got 4294967296 at index 0"),
        (np.zeros((2, 4), dtype=np.int64), "must be 1-D, got shape"),
        (torch.tensor([1.0, 2.0]), "integer tensor, got dtype torch.float32"),
        (torch.tensor([True, False]), "integer tensor, got dtype torch.bool"),
        (torch.tensor([0, -7]), "got -7 at index 1"),
        ("1234", "sequence of ints, got str"),
        (b"\x01\x00\x00\x00", "sequence of ints, got bytes"),
        (5, "sequence of ints, got int"),
    ],
)
def test_bad_tokens_raise_value_error(tokens: object, message: str) -> None:
    """Tokens that are not ints in [0, 2**32) raise ValueError naming the value or dtype."""
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace("*", r"\*")):
        page_hashes(tokens, 1)


@pytest.mark.parametrize("page_size", [0, -4, 1.5, True, "4", None])
def test_bad_page_size(page_size: object) -> None:
    """page_size must be a positive int."""
    with pytest.raises(ValueError, match="page_size must be a positive int"):
        page_hashes(TOKENS, page_size)  # type: ignore[arg-type]


def test_bad_algo_parent_and_namespace() -> None:
    """Unknown algo, malformed parent and non-str namespace parts raise ValueError."""
    with pytest.raises(ValueError, match="unknown hash algo 'md5'; expected one of sha256, xxh3"):
        page_hashes(TOKENS, 4, algo="md5")
    with pytest.raises(ValueError, match="unknown hash algo"):
        Namespace().seed("blake2")
    for parent in ["zz" * 32, SHA_H0[:-2], SHA_H0 + "00", "", XXH3_H[0]]:
        with pytest.raises(ValueError, match="parent must be a 64-char hex sha256 digest"):
            page_hashes(TOKENS, 4, parent=parent)
    with pytest.raises(ValueError, match="parent must be a 32-char hex xxh3 digest"):
        page_hashes(TOKENS, 4, parent=SHA_H0, algo="xxh3")
    for namespace in [3, ("a", 1), "model", {"model": "m"}]:
        with pytest.raises(ValueError, match="namespace"):
            page_hashes(TOKENS, 4, namespace)
    assert DIGEST_SIZES == {"sha256": 32, "xxh3": 16}


def test_xxh3_without_xxhash_names_the_fix(monkeypatch: pytest.MonkeyPatch) -> None:
    """algo='xxh3' without the xxhash package raises ImportError with an install hint."""
    monkeypatch.setitem(sys.modules, "xxhash", None)
    with pytest.raises(ImportError, match="pip install xxhash"):
        page_hashes(TOKENS, 4, algo="xxh3")
    assert page_hashes(TOKENS, 4) == [SHA_H0, SHA_H1]


def test_deterministic_across_processes() -> None:
    """A fresh interpreter (other PYTHONHASHSEED) computes the same hashes and ids."""
    rng = np.random.default_rng(7)
    tokens = rng.integers(0, 200_000, size=203).tolist()
    ns = ("llama", "bf16/32x8x128/p16", "salt", "lora-1")
    code = (
        "import json, sys; from radixlink.hashing import page_hashes, namespace_id; "
        "t, ns = json.loads(sys.argv[1]); ns = tuple(ns); "
        "print(json.dumps([page_hashes(t, 16, ns), page_hashes(t, 7, algo='xxh3', "
        "namespace=ns), page_hashes(t, 5), namespace_id(ns)]))"
    )
    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONHASHSEED": "12345", "PYTHONPATH": str(root)}
    result = subprocess.run(
        [sys.executable, "-c", code, json.dumps([tokens, ns])],
        capture_output=True,
        text=True,
        env=env,
        cwd=root,
        timeout=60,
        check=True,
    )
    expected = [
        page_hashes(tokens, 16, ns),
        page_hashes(tokens, 7, ns, algo="xxh3"),
        page_hashes(tokens, 5),
        namespace_id(ns),
    ]
    assert json.loads(result.stdout) == expected


def test_namespace_checked_even_with_parent() -> None:
    """A malformed namespace is rejected even when parent makes it unused."""
    with pytest.raises(ValueError, match="namespace"):
        page_hashes(TOKENS, 4, 42, parent=SHA_H0)


def test_bench_hash_smoke(tmp_path: Path) -> None:
    """`radixlink bench hash` runs small and writes one JSON row per case and page size."""
    from radixlink.bench.hash import main

    out = tmp_path / "hash.json"
    assert main(["--num-tokens", "512", "--rounds", "2", "--json", str(out)]) == 0
    payload = json.loads(out.read_text())
    assert {row["page_size"] for row in payload["rows"]} == {16, 64}
    assert all(row["pages_per_s"] > 0 for row in payload["rows"])
