"""Connector settings refused at startup, and the radixlink token-chain key option."""

from __future__ import annotations

import logging

import pytest

from .conftest import VLLM_MISSING  # noqa: E402, I001

pytest.importorskip("vllm", reason=VLLM_MISSING)

from radixlink.contract import PoolName  # noqa: E402
from radixlink.hashing import page_hashes  # noqa: E402
from radixlink.stores import open_store  # noqa: E402
from radixlink.stores.keys import parse_key  # noqa: E402

from .test_round_trip import _first_run, _prompt  # noqa: E402


@pytest.mark.parametrize("algo", ["xxhash", "xxhash_cbor"])
def test_random_seed_hash_is_refused_with_the_setting_to_use(nodes, model_dir, file_url,
                                                             monkeypatch, algo):
    """vLLM's xxhash chains start from a per-process random seed: the connector refuses to
    start and names PYTHONHASHSEED and sha256; with PYTHONHASHSEED set it starts."""
    pytest.importorskip("xxhash")
    monkeypatch.delenv("PYTHONHASHSEED", raising=False)
    with pytest.raises(ValueError, match="PYTHONHASHSEED.*sha256|sha256.*PYTHONHASHSEED"):
        nodes(model_dir, file_url, hash_algo=algo)
    monkeypatch.setenv("PYTHONHASHSEED", "0")
    nodes(model_dir, file_url, hash_algo=algo)


@pytest.mark.parametrize("extra, match", [
    ({"stroe": "file:///tmp/x"}, "unknown kv_connector_extra_config key.*stroe"),
    ({"keys": "md5"}, "'keys' must be one of"),
    ({"num_threads": 0}, "num_threads"),
    ({"save": "yes"}, "'save' must be true or false"),
])  # fmt: skip
def test_bad_extra_config_is_refused(nodes, model_dir, file_url, extra, match):
    """A typo or a bad value in kv_connector_extra_config fails at startup, naming the key."""
    with pytest.raises(ValueError, match=match):
        nodes(model_dir, file_url, extra=extra)


def test_token_chain_keys_are_radixlink_page_hashes(nodes, model_dir, file_url):
    """With keys=token_chain, pages are named by radixlink.hashing.page_hashes of the tokens
    (so other radixlink tools find them) and a second node still gets its full hit."""
    prompt = _prompt(50, 100)
    extra = {"keys": "token_chain"}
    node1 = nodes(model_dir, file_url, extra=extra)
    node1.add("a", prompt, max_tokens=2)
    node1.run()
    with open_store(file_url) as store:
        parts = [parse_key(k) for k, _ in store.scan("")]
    stored = {p.page_hash for p in parts if p is not None and p.pool is PoolName.KV}
    assert stored == set(page_hashes(prompt, 16))
    node2 = nodes(model_dir, file_url, extra=extra)
    node2.add("b", prompt)
    assert _first_run(node2, "b") == (96, 4)
    node2.run()
    node2.assert_no_leak()


def test_a_store_private_to_one_connector_is_warned_about(nodes, model_dir, file_url, caplog):
    """memory:// lives in one connector instance, and vLLM's scheduler and each worker open
    their own: the connector warns at startup and names the stores to use; a file store gets
    no such warning."""
    logger = "radixlink.integrations.vllm.connector"
    with caplog.at_level(logging.WARNING, logger=logger):
        nodes(model_dir, "memory://")
    private = [r for r in caplog.records if "lives in one connector's memory" in r.getMessage()]
    assert private and "file:///path/to/dir" in private[0].getMessage()
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger=logger):
        nodes(model_dir, file_url)
    assert not [r for r in caplog.records if "lives in one connector" in r.getMessage()]
