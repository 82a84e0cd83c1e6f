"""What crosses into SGLang (issue 24, items 13-17): no exception from any entry SGLang calls
(a directory store whose root became a file), an unreachable store stops startup with a clear
StoreError, SGLang's own extra-config keys are accepted, unsupported host pools are refused
naming the supported models, and the linker module imports on SGLang's newer linker contract
(no ``LayerWiseLoadCounter``) and refuses to start there with a clear message."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from .conftest import SGLANG_MISSING

pytest.importorskip("sglang", reason=SGLANG_MISSING)

from redis_server import free_port  # noqa: E402
from sglang.srt.mem_cache.hicache_storage import PoolName, PoolTransfer  # noqa: E402

from radixlink.errors import StoreError  # noqa: E402

from .harness import FULL, FULL_SWA, Node  # noqa: E402
from .hicache_harness import BACKEND, PAGE, fill, host_pool, make_backend, page_hashes  # noqa: E402

PROMPT = list(range(3000, 3040))  # 10 pages of 4


def _replace_root_with_a_file(root: Path) -> None:
    os.rename(root, root.with_name(root.name + ".gone"))
    root.write_bytes(b"not a directory")


@pytest.mark.parametrize("shape", [FULL, FULL_SWA], ids=["full", "full_swa"])
def test_linker_entries_never_raise_when_the_store_root_became_a_file(
    tmp_path: Path, nodes, shape
) -> None:
    """Flow: A offloads a prompt; B's store root is replaced by a file; B's scheduler runs
    match (LOOKUP), a new request's offloads and the event polling: nothing raises (lookup
    used to raise NotADirectoryError into match_prefix), B recomputes, no slot leaks."""
    root = tmp_path / "store"
    url = f"file://{root}"
    a, b = nodes(shape, url, 1), nodes(shape, url, 2)
    a.serve(PROMPT)
    _replace_root_with_a_file(root)
    free_before = b.allocator.available_size()
    got = b.restore(PROMPT, "r1")
    assert (got.device_len, got.loaded_len, got.failed) == (0, 0, False)
    b.serve(list(range(6000, 6016)))  # write-through offloads fail: completed as False
    assert b.linker.num_completed_loads() == 0 and b.linker.pop_completed_load() == []
    assert b.allocator.available_size() == free_before - 16


def test_hicache_entries_never_raise_when_the_store_root_became_a_file(tmp_path: Path) -> None:
    """Every v1 / v2 entry of the HiCache backend answers a miss or a failure when the store
    root is a file: no NotADirectoryError, no StoreError, no ValueError into SGLang."""
    root = tmp_path / "store"
    pool = host_pool("page_first")
    node = make_backend("dynamic", {**BACKEND, "store": f"file://{root}"}, pool)
    keys = page_hashes(PROMPT[: 2 * PAGE])
    src = pool.alloc(2 * PAGE)
    fill(pool, src, seed=3)
    assert node.batch_set_v1(keys, src) == [True, True]
    _replace_root_with_a_file(root)
    assert node.batch_exists(keys) == 0 and node.exists(keys[0]) is False
    assert node.batch_get_v1(keys, src) == [False, False]
    transfer = PoolTransfer(name=PoolName.KV, keys=keys, host_indices=src)
    assert not node.batch_exists_v2(keys, [transfer]).restorable_prefix_pages
    assert node.batch_get_v2([transfer]) == {PoolName.KV: [False, False]}
    bad = PoolTransfer(name=PoolName.INDEXER, keys=keys, host_indices=src)
    assert node.batch_exists_v2(keys, [bad]).kv_hit_pages == 0  # was ValueError
    node.clear()
    node.close()


def test_an_unreachable_redis_stops_both_constructors(tmp_path: Path) -> None:
    """A Redis port nobody listens on: the linker (through SGLang's linker factory) and the
    HiCache backend (through its storage factory) raise StoreError at startup naming the
    URL (both used to start and then answer every lookup with silent misses)."""
    url = f"redis://127.0.0.1:{free_port()}/0"
    with pytest.raises(StoreError, match=r"127\.0\.0\.1.*unreachable at startup"):
        Node(FULL, url)
    with pytest.raises(StoreError, match="unreachable at startup"):
        make_backend("dynamic", {**BACKEND, "store": url}, host_pool("page_first"))


def test_sglang_own_hicache_keys_are_accepted(tmp_path: Path) -> None:
    """SGLang adds ``file_storage_path`` to the extra config when --file-storage-path is set
    (unified_radix_cache.py); the backend accepts it (it used to refuse it as an unknown
    key) and still refuses a typo."""
    pool = host_pool("page_first")
    extra = {**BACKEND, "store": f"file://{tmp_path}/s", "file_storage_path": "/tmp/hicache"}
    make_backend("dynamic", extra, pool).close()
    with pytest.raises(ValueError, match="unknown config key"):
        make_backend("dynamic", {**extra, "stroe": "x"}, pool)


@pytest.mark.parametrize("name", [PoolName.INDEXER, PoolName.DEEPSEEK_V4_C1])
def test_unsupported_host_pool_names_the_supported_models(tmp_path: Path, name) -> None:
    """Registering a DSA indexer or DeepSeek V4 host pool is refused at startup with a
    message naming what is supported (it used to list pool names only)."""
    pool = host_pool("page_first")
    node = make_backend("dynamic", {**BACKEND, "store": f"file://{tmp_path}/s"}, pool)
    with pytest.raises(ValueError, match="DeepSeek V2/V3") as caught:
        node.register_mem_host_pool_v2(pool, name)
    assert name.value in str(caught.value) and "Mamba hybrids" in str(caught.value)
    node.close()


NEWER_CONTRACT = textwrap.dedent("""
    import sys
    import conftest  # noqa: F401  (SGLang's import stand-ins)
    import sglang.srt.mem_cache.unified_cache.unified_cache_linker as contract
    del contract.LayerWiseLoadCounter  # SGLang's PR #40595 revision has none
    from radixlink.integrations.sglang import linker
    assert linker.LayerWiseLoadCounter is None
    try:
        linker.RadixlinkLinker(None, None, components=set(), extra_config={})
    except ValueError as exc:
        print("refused:", exc)
""")


def test_linker_imports_without_layer_wise_load_counter() -> None:
    """On SGLang's newer linker contract (no LayerWiseLoadCounter) the module imports (it
    used to fail with ImportError) and the constructor refuses with a message naming the
    supported contract and the HiCache alternative."""
    here = Path(__file__).resolve().parent
    paths = [os.environ.get("PYTHONPATH", ""), str(here), str(here.parents[1]),
             str(here.parents[2])]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, paths))}
    run = subprocess.run([sys.executable, "-c", NEWER_CONTRACT], capture_output=True,
                         text=True, timeout=300, env=env, check=False)
    assert run.returncode == 0, run.stderr[-2000:]
    assert "refused:" in run.stdout and "PR #40595" in run.stdout
    assert "RadixlinkHiCacheStorage" in run.stdout


def test_load_batches_complete_in_order_with_their_request_ids(file_url: str, nodes) -> None:
    """num_completed_loads / pop_completed_load: a started batch counts once its transfer
    has ended and pops with its request ids, oldest first; SGLang 0.5.23's
    finish_external_linker_loads (finish_layer_wise_loading) still gives the verdict, and a
    batch it finished is not counted again."""
    a, b = nodes(FULL, file_url, 1), nodes(FULL, file_url, 2)
    a.serve(PROMPT)
    first = b.admit(PROMPT, "r-pop")
    assert first.loaded_len == len(PROMPT)
    b.cache.ready_to_load_host_cache()  # starts the batch (scheduler.py l. 4353)
    deadline = time.monotonic() + 30
    while b.linker.num_completed_loads() == 0:
        assert time.monotonic() < deadline, "the load batch never ended"
        time.sleep(0.005)
    assert b.linker.pop_completed_load() == ["r-pop"]
    assert b.linker.num_completed_loads() == 0 and b.linker.pop_completed_load() == []
    assert b.cache.finish_external_linker_loads([first.request]) == []
    second = b.restore(PROMPT[: 5 * PAGE] + list(range(9000, 9020)), "r-finished")
    assert second.failed is False
    assert b.linker.num_completed_loads() == 0  # finished by the scheduler's call: consumed


def test_offload_verdicts_pop_in_submission_order_whatever_order_they_end() -> None:
    """SGLang pairs the i-th pop_completed_offload with its i-th offload, and the engine's two
    I/O threads may end offloads out of order: a later verdict waits for the earlier ones, and
    an offload that never started (withdrawn) takes no place."""
    from radixlink.integrations.sglang.workers import InOrder

    line = InOrder()
    first, second, third = line.open(), line.open(), line.open()
    line.end(second, False)
    assert line.num_completed() == 0
    with pytest.raises(IndexError):
        line.pop()
    line.withdraw(third)
    line.end(first, True)
    assert line.num_completed() == 2
    assert (line.pop(), line.pop()) == (True, False)
    assert line.num_completed() == 0
