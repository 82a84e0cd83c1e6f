"""The SGLang-on-CPU engine spec (``integrations/sglang/engines.py``): bad specs are ValueErrors
before any process starts, and one dict of flags serves ``sglang.Engine`` and
``python -m sglang.launch_server`` alike."""

from __future__ import annotations

import json

import pytest

from radixlink.integrations.sglang.engines import CacheMode, EngineSpec, launch_args, server_args


@pytest.mark.parametrize(("kwargs", "match"), [
    ({"cache": CacheMode.LINKER}, "store=None"),
    ({"cache": CacheMode.OFF, "store": "file:///tmp/x"}, "cache=off"),
    ({"page_size": 0}, "page_size=0"),
    ({"max_total_tokens": 8, "page_size": 16}, "max_total_tokens=8"),
])
def test_a_bad_spec_is_a_value_error_naming_it(kwargs: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        EngineSpec(model="m", **kwargs)


def test_flags_for_each_cache_mode() -> None:
    """Off disables SGLang's tree; the linker and HiCache carry radixlink's class and store."""
    assert server_args(EngineSpec(model="m"))["disable_radix_cache"] is True
    linker = server_args(EngineSpec(model="m", cache=CacheMode.LINKER, store="file:///s"))
    assert linker["unified_cache_external_linker_config"]["linker_extra_config"] == {
        "store": "file:///s"}
    hicache = server_args(EngineSpec(model="m", cache=CacheMode.HICACHE, store="file:///s"))
    extra = json.loads(hicache["hicache_storage_backend_extra_config"])
    assert extra["class_name"] == "RadixlinkHiCacheStorage" and extra["interface_v1"] == 1
    assert hicache["hicache_mem_layout"] == "layer_first"
    for args in (linker, hicache):
        assert args["device"] == "cpu" and args["dtype"] == "float32" and args["sleep_on_idle"]
        assert args["attention_backend"] == "torch_native" and "disable_radix_cache" not in args


def test_launch_args_are_the_same_flags() -> None:
    """Booleans become bare flags, dicts JSON, the rest strings."""
    spec = EngineSpec(model="m", cache=CacheMode.LINKER, store="file:///s")
    args = launch_args(spec)
    assert "--enable-unified-cache-external-linker" in args
    config = args[args.index("--unified-cache-external-linker-config") + 1]
    assert json.loads(config)["linker"] == "RadixlinkLinker"
    assert args[args.index("--page-size") + 1] == "16"
