"""The scheduler's per-request page names: the batched hex and key joins give the bytes of the
per-page code, and the hash cache follows vLLM's block hashes as they grow or are redone."""

from __future__ import annotations

import os
import random

import pytest

from .conftest import VLLM_MISSING  # noqa: E402, I001

pytest.importorskip("vllm", reason=VLLM_MISSING)

from radixlink.contract import PoolName  # noqa: E402
from radixlink.integrations.vllm.keys import GroupLayout, KeyScheme  # noqa: E402
from radixlink.integrations.vllm.names import PageNames, hex_names  # noqa: E402
from radixlink.stores.keys import page_key  # noqa: E402

_GROUP = GroupLayout(group_id=0, pool=PoolName.KV, window_pages=0, block_size=16,
                     layer_names=("l0",), description="vllm-kv;kv;w0;test")  # fmt: skip


def _request(tokens: list[int], block_size: int, algo: str = "sha256"):
    from vllm import SamplingParams
    from vllm.utils.hashing import get_hash_fn_by_name
    from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
    from vllm.v1.request import Request

    hash_fn = get_hash_fn_by_name(algo)
    init_none_hash(hash_fn)
    return Request(request_id="r", prompt_token_ids=tokens, pooling_params=None,
                   sampling_params=SamplingParams(max_tokens=1),
                   block_hasher=get_request_block_hasher(block_size, hash_fn))  # fmt: skip


def test_batched_hex_and_keys_are_the_per_page_bytes():
    """hex_names is bytes.hex per hash (mixed lengths too); KeyScheme.keys (one join over
    the page layer's cached template) is the store's per-page key, byte for byte, for both
    schemes, ranks and salts (the salt names token chains only)."""
    raws = [os.urandom(32) for _ in range(50)]
    assert hex_names(raws) == [h.hex() for h in raws]
    mixed = [os.urandom(n) for n in (8, 32, 16)]
    assert hex_names(mixed) == [h.hex() for h in mixed]
    assert hex_names([]) == []
    hashes = hex_names(raws)
    for scheme in (KeyScheme(model="m", scheme="vllm", algo="sha256", hash_block_size=16),
                   KeyScheme(model="m", scheme="token_chain", algo="xxh3", hash_block_size=16)):
        for rank in (0, 3):
            for salt in ("", "tenant-a"):
                ns = scheme.namespace_id(_GROUP, salt if scheme.scheme == "token_chain" else "")
                assert scheme.keys(_GROUP, hashes, rank, salt) == \
                    [page_key(ns, h, _GROUP.pool, rank) for h in hashes]  # fmt: skip


@pytest.mark.parametrize("block_size, hash_block_size", [(16, 16), (32, 16)])
def test_page_names_follow_vllm_hashes_as_they_grow_and_are_redone(block_size,
                                                                   hash_block_size):
    """Page i is named by vLLM's hash at its last hash block; the cache extends as vLLM hashes
    more blocks and starts over when vLLM's hashes change under it (a rehashed request)."""
    scheme = KeyScheme(model="m", scheme="vllm", algo="sha256", hash_block_size=hash_block_size)
    ratio = block_size // hash_block_size
    rng = random.Random(0)
    tokens = [rng.randrange(32000) for _ in range(10 * block_size + 3)]
    req = _request(tokens[: 4 * block_size], hash_block_size)

    def expected(num_pages: int) -> list[str]:
        hashes = req.block_hashes
        count = min(num_pages, len(hashes) // ratio)
        return [bytes(hashes[(i + 1) * ratio - 1]).hex() for i in range(count)]

    names = PageNames()
    assert names.first(scheme, req, block_size, 2) == expected(2)
    assert names.first(scheme, req, block_size, 99) == expected(99) and len(expected(99)) == 4
    req.append_output_token_ids(tokens[4 * block_size :])  # vLLM hashes the new blocks
    assert names.first(scheme, req, block_size, 99) == expected(99) and len(expected(99)) == 10
    assert names.first(scheme, req, block_size, 3) == expected(3)
    other = _request([t + 1 for t in tokens], hash_block_size)
    req.block_hashes = other.block_hashes  # the same request, hashed anew
    assert names.first(scheme, req, block_size, 3) == expected(3)
    assert names.first(scheme, req, block_size, 99) == expected(99)
