"""Bench: RadixlinkConnector costs on CPU, side by side in one run (needs vLLM: run it with
``.venv-vllm/bin/python -m radixlink.bench.vllm_connector``; the bench package never imports it).

1. Scheduler side, per request, each phase timed alone on a fresh request: lookup (hit and
   miss), load plan, save planning of every step and the finish hook, on vLLM's own
   ``Request`` objects and a ``memory://`` store; vLLM's block hashing of the same request
   (building the ``Request``, untimed in the phases) is timed beside it for scale.
2. Worker side: page gather / scatter GB/s over LBNHC KV tensors, against a plain torch copy
   of the same bytes and an ``index_select`` of the same blocks from one contiguous tensor.
"""

from __future__ import annotations

import argparse
import json
import random
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch


def _vllm_config(model_dir: str, block_size: int, store: str) -> Any:
    from vllm.config import CacheConfig, DeviceConfig, KVTransferConfig, ModelConfig, VllmConfig

    config = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64,
              "intermediate_size": 128, "num_attention_heads": 8, "num_key_value_heads": 8,
              "num_hidden_layers": 2, "vocab_size": 32000, "max_position_embeddings": 32768}
    Path(model_dir, "config.json").write_text(json.dumps(config))
    transfer = KVTransferConfig(
        kv_connector="RadixlinkConnector", kv_connector_module_path="radixlink.integrations.vllm",
        kv_role="kv_both", kv_connector_extra_config={"store": store},
    )  # fmt: skip
    cache = CacheConfig(block_size=block_size, enable_prefix_caching=True)
    cache.kv_cache_layout = "LBNHC"
    return VllmConfig(
        model_config=ModelConfig(model=model_dir, skip_tokenizer_init=True, max_model_len=32768),
        cache_config=cache, kv_transfer_config=transfer, device_config=DeviceConfig("cpu"),
    )  # fmt: skip


def _best_us(fn: Callable[[], Any], repeat: int,
             setup: Callable[[], Any] | None = None) -> float:
    """Median of ``repeat`` timings of ``fn``, in microseconds (after one warm-up call);
    ``setup`` runs untimed before each call."""
    if setup is not None:
        setup()
    fn()
    times = []
    for _ in range(repeat):
        if setup is not None:
            setup()
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return sorted(times)[len(times) // 2] * 1e6


def bench_scheduler(num_tokens: int, block_size: int, repeat: int) -> dict[str, float]:
    """Scheduler-side µs per request on a ``num_tokens`` prompt, each phase timed alone
    (requests are built untimed: building one is vLLM's block hashing, the reference)."""
    from vllm import SamplingParams
    from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole
    from vllm.utils.hashing import sha256
    from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
    from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
    from vllm.v1.request import Request

    from radixlink.integrations.vllm import RadixlinkConnector

    init_none_hash(sha256)
    spec = FullAttentionSpec(block_size=block_size, num_kv_heads=8, head_size=128,
                             dtype=torch.float16)
    kv_config = KVCacheConfig(num_blocks=4096, kv_cache_tensors=[],
                              kv_cache_groups=[KVCacheGroupSpec(["l0", "l1"], spec)])
    rng = random.Random(0)
    tokens = [rng.randrange(32000) for _ in range(num_tokens)]
    count = iter(range(1 << 30))

    def request(req_id: str = "") -> Request:
        return Request(request_id=req_id or f"r{next(count)}", prompt_token_ids=tokens,
                       pooling_params=None, sampling_params=SamplingParams(max_tokens=1),
                       block_hasher=get_request_block_hasher(block_size, sha256))

    with tempfile.TemporaryDirectory() as model_dir:
        config = _vllm_config(model_dir, block_size, "memory://?capacity=4GiB")
        conn = RadixlinkConnector(config, KVConnectorRole.SCHEDULER, kv_config)
        side = conn.scheduler_side
        num_pages = (num_tokens - 1) // block_size
        blocks = SimpleNamespace(get_block_ids=lambda: (list(range(1, num_pages + 2)),))
        results = {"vllm block hashing (reference)": _best_us(request, repeat)}
        # a fresh request per call: nothing cached from an earlier call of the same request
        fresh: list[Request] = []

        def new_request() -> None:
            fresh[:] = [request()]
            conn.on_new_request(fresh[0])

        results["lookup, miss"] = _best_us(
            lambda: conn.get_num_new_matched_tokens(fresh[0], 0), repeat, new_request)
        # store every page, as a node that computed the prompt would have
        side.store.put({k: b"x" for k in side.page_keys(request("hit"), num_pages)})
        results["lookup, full hit"] = _best_us(
            lambda: conn.get_num_new_matched_tokens(fresh[0], 0), repeat, new_request)

        def looked_up() -> None:
            new_request()
            conn.get_num_new_matched_tokens(fresh[0], 0)

        def plan_and_meta() -> None:
            conn.update_state_after_alloc(fresh[0], blocks, num_pages * block_size)  # type: ignore
            conn.build_connector_meta(_step(fresh[0], num_tokens, blocks))

        results["load plan + step meta"] = _best_us(plan_and_meta, repeat, looked_up)

        def save_and_finish() -> None:
            req = fresh[0]
            conn.build_connector_meta(_step(req, num_tokens, blocks))
            req.num_computed_tokens = num_tokens
            conn.request_finished_all_groups(req, blocks.get_block_ids())
            conn.build_connector_meta(_step(req, 0, blocks))

        results["save plan (prefill step) + finish"] = _best_us(save_and_finish, repeat,
                                                                new_request)
        results["scheduler side (full hit + load + save)"] = (
            results["lookup, full hit"] + results["load plan + step meta"]
            + results["save plan (prefill step) + finish"])
        conn.shutdown()
    return results


def _step(req: Any, num_scheduled: int, blocks: Any) -> Any:
    """A scheduler output carrying what ``build_connector_meta`` reads."""
    state = SimpleNamespace(get_block_ids=lambda req_id: blocks.get_block_ids())
    scheduled = {req.request_id: num_scheduled} if num_scheduled else {}
    return SimpleNamespace(num_scheduled_tokens=scheduled, kv_connector_block_state=state)


def bench_worker(num_layers: int, num_blocks: int, batch: int, repeat: int) -> dict[str, float]:
    """GB/s of page gather / scatter against plain copies of the same bytes (one run)."""
    from radixlink.integrations.vllm.pages import PagedGroup

    block, heads, content = 16, 8, 256  # head_size 128, K and V
    shape = (num_blocks, block, heads, content)  # physical LBNHC; views are [B, H, N, C]
    layers = [torch.randn(shape, dtype=torch.float16).permute(0, 2, 1, 3)
              for _ in range(num_layers)]  # fmt: skip
    group = PagedGroup(layers)
    ids = random.Random(1).sample(range(num_blocks), batch)
    pages = group.gather(ids)
    num_bytes = pages.numel()
    staging = torch.empty(num_bytes, dtype=torch.uint8)
    src = torch.randn(num_bytes // 2, dtype=torch.float16)
    dst = torch.empty_like(src)
    flat = torch.randn(num_blocks, group.page_bytes // 2, dtype=torch.float16)
    idx = torch.tensor(ids)
    gbps = {
        "gather into a reused staging buffer (saves)": _best_us(
            lambda: group.gather(ids, staging), repeat),
        "gather into a fresh buffer": _best_us(lambda: group.gather(ids), repeat),
        "scatter (PagedGroup.scatter)": _best_us(lambda: group.scatter(ids, pages), repeat),
        "plain copy of the same bytes": _best_us(lambda: dst.copy_(src), repeat),
        "plain clone (fresh buffer, as gather)": _best_us(src.clone, repeat),
        "index_select, one contiguous tensor": _best_us(lambda: flat.index_select(0, idx), repeat),
    }
    return {name: num_bytes / us / 1e3 for name, us in gbps.items()}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tokens", type=int, default=4096, help="prompt tokens per request")
    parser.add_argument("--block-size", type=int, default=16)
    parser.add_argument("--layers", type=int, default=8, help="layers of the KV group")
    parser.add_argument("--blocks", type=int, default=512, help="KV blocks per layer")
    parser.add_argument("--batch", type=int, default=64, help="pages per gather / scatter")
    parser.add_argument("--repeat", type=int, default=30)
    parser.add_argument("--part", choices=("all", "scheduler", "worker"), default="all",
                        help="which half to run")
    args = parser.parse_args(argv)
    torch.manual_seed(0)
    torch.set_num_threads(1)
    print(f"config: {vars(args)}, torch {torch.__version__}, 1 thread")
    if args.part != "worker":
        _print_scheduler(args)
    if args.part != "scheduler":
        _print_worker(args)


def _print_scheduler(args: argparse.Namespace) -> None:
    sched = bench_scheduler(args.tokens, args.block_size, args.repeat)
    print(f"\nscheduler side, {args.tokens}-token request ({args.tokens // args.block_size} "
          "pages), memory:// store, median µs")
    ref = sched["vllm block hashing (reference)"]
    for name, us in sched.items():
        print(f"  {name:40s} {us:10.1f}  ({us / ref:.2f}x vLLM's hashing)")


def _print_worker(args: argparse.Namespace) -> None:
    work = bench_worker(args.layers, args.blocks, args.batch, args.repeat)
    page_mib = args.layers * 16 * 8 * 256 * 2 / 2**20
    print(f"\nworker side, {args.batch} pages of {page_mib:.2f} MiB ({args.layers} layers, fp16, "
          "LBNHC), GB/s")
    base = work["plain copy of the same bytes"]
    for name, rate in work.items():
        print(f"  {name:40s} {rate:8.2f}  ({rate / base:.2f}x plain copy)")


if __name__ == "__main__":
    main()
