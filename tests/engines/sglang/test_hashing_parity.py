"""radixlink.integrations.sglang.hashing_compat reproduces SGLang's own page hashes
(get_hash_str and the storage chain with its namespace seed), on random inputs."""

from __future__ import annotations

import random
from array import array

import pytest

from .conftest import SGLANG_MISSING

pytest.importorskip("sglang", reason=SGLANG_MISSING)

from sglang.srt.mem_cache.radix_cache import RadixKey  # noqa: E402
from sglang.srt.mem_cache.utils import (  # noqa: E402
    get_hash_str,
    get_storage_hash_str,
    storage_namespace_seed,
)

from radixlink.hashing import page_hashes  # noqa: E402
from radixlink.integrations.sglang.hashing_compat import (  # noqa: E402
    sglang_namespace_seed,
    sglang_page_hashes,
    sglang_storage_page_hashes,
)

PARTS = [None, "", "a", "lora-7", "ß/日本", "a\x00b"]


def _tokens(rng: random.Random, n: int, wide: float = 0.0) -> list[int]:
    return [rng.randrange(2**32, 2**63) if rng.random() < wide else rng.randrange(2**32)
            for _ in range(n)]


def test_namespace_seed_matches_sglang() -> None:
    """Every combination of absent, empty and non-empty parts gives SGLang's seed."""
    for extra_key in PARTS:
        for cache_salt in PARTS:
            want = storage_namespace_seed(extra_key, cache_salt)
            assert sglang_namespace_seed(extra_key, cache_salt) == want


@pytest.mark.parametrize("seed", range(4))
def test_page_chain_matches_get_hash_str(seed: int) -> None:
    """Random lengths (partial tails included), page sizes, priors, and wide tokens."""
    rng = random.Random(seed)
    for _ in range(40):
        page = rng.choice([1, 2, 4, 16, 64])
        tokens = _tokens(rng, rng.randrange(0, 5 * page + 3), wide=rng.choice([0.0, 0.0, 0.05]))
        prior = rng.choice([None, get_hash_str([rng.randrange(99)], None, page_size=1)[0]])
        want = get_hash_str(array("q", tokens), prior, page_size=page)
        assert sglang_page_hashes(tokens, page, prior) == want


@pytest.mark.parametrize("seed", range(3))
def test_storage_chain_with_namespaces_matches_sglang(seed: int) -> None:
    """get_storage_hash_str on RadixKeys with LoRA extra keys and cache salts."""
    rng = random.Random(100 + seed)
    for _ in range(30):
        page = rng.choice([1, 4, 16])
        tokens = _tokens(rng, rng.randrange(1, 4 * page + 2))
        extra_key, cache_salt = rng.choice(PARTS), rng.choice(PARTS)
        key = RadixKey(array("q", tokens), extra_key=extra_key, cache_salt=cache_salt)
        want = get_storage_hash_str(key, None, page_size=page)
        # NOTE: RadixKey normalises an empty cache_salt to None; hash the parts it keeps.
        got = sglang_storage_page_hashes(
            tokens, page, extra_key=key.extra_key, cache_salt=key.cache_salt
        )
        assert got == want


@pytest.mark.parametrize("seed", range(3))
def test_bigram_chain_matches_sglang(seed: int) -> None:
    """EAGLE bigram keys (pairs of neighbouring tokens), narrow and wide."""
    rng = random.Random(200 + seed)
    for _ in range(30):
        page = rng.choice([1, 2, 4, 8])
        raw = _tokens(rng, rng.randrange(2, 4 * page + 3), wide=rng.choice([0.0, 0.1]))
        key = RadixKey(array("q", raw), is_bigram=True)
        want = get_hash_str(key, None, page_size=page)
        assert len(want) == -(-len(key) // page)
        # the key's len(key) pairs read raw tokens 0..len(key)
        assert sglang_page_hashes(raw[: len(key) + 1], page, bigram=True) == want


def test_plain_whole_pages_agree_with_radixlink_page_hashes() -> None:
    """Without a namespace, SGLang's chain of whole pages is radixlink's own chain."""
    rng = random.Random(7)
    tokens = _tokens(rng, 64)
    assert sglang_page_hashes(tokens, 16) == page_hashes(tokens, 16)


def test_bad_tokens_are_value_errors() -> None:
    """Negative, too large, float and bool tokens, and a bad prior, are clear errors."""
    for bad in ([-1], [2**63], [1.5], [True]):
        with pytest.raises(ValueError):
            sglang_page_hashes(bad, 4)
    with pytest.raises(ValueError, match="prior_hash"):
        sglang_page_hashes([1], 4, "abc")
