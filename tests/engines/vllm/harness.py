"""Nodes of a CPU "cluster" for the vLLM connector tests: vLLM's real ``Scheduler`` and
``KVCacheManager`` with ``RadixlinkConnector`` (built by vLLM from the kv-transfer config) on the
scheduler side, worker-role connectors over CPU KV tensors, and a stand-in forward pass.

The forward pass writes, for every scheduled token, KV that depends on the token's whole
prefix, its layer and its TP rank (``expected_kv``), then checks that the KV every scheduled
token attends to equals that function: so a page loaded into the wrong block, from the wrong
rank or layer, or a corrupt page that slipped through, fails the test. As in a real forward,
every request of the step writes before any attends: a request admitted with a vLLM
prefix-cache hit on blocks another request of the same step computes reads them after they
were written (checking requests one by one reported wrong KV for that case).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from vllm import SamplingParams
from vllm.config import (
    CacheConfig,
    DeviceConfig,
    KVEventsConfig,
    KVTransferConfig,
    ModelConfig,
    ParallelConfig,
    SchedulerConfig,
    VllmConfig,
)
from vllm.distributed.kv_transfer.kv_connector.utils import KVOutputAggregator
from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole
from vllm.utils.hashing import sha256
from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.kv_cache_interface import (
    FullAttentionSpec,
    KVCacheConfig,
    KVCacheGroupSpec,
    SlidingWindowSpec,
)
from vllm.v1.outputs import KVConnectorOutput, ModelRunnerOutput
from vllm.v1.request import Request
from vllm.v1.structured_output import StructuredOutputManager

from radixlink.integrations.vllm import RadixlinkConnector

BLOCK = 16
HEADS = 2
HEAD_SIZE = 8
WINDOW = 40  # sliding window of the hybrid layout, tokens (3 pages of 16 for the next token)
FULL_LAYERS = ("model.layers.0.attn", "model.layers.1.attn")
SWA_LAYERS = ("model.layers.2.attn", "model.layers.3.attn")

init_none_hash(sha256)


def write_model_dir(path: Path) -> str:
    """A local model directory holding only a small Llama ``config.json`` (no hub, no weights)."""
    path.mkdir(parents=True, exist_ok=True)
    config = {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 32,
        "intermediate_size": 64, "num_attention_heads": 4, "num_key_value_heads": HEADS,
        "head_dim": HEAD_SIZE, "num_hidden_layers": 4, "vocab_size": 1024,
        "max_position_embeddings": 4096, "torch_dtype": "float32", "rms_norm_eps": 1e-5,
        "bos_token_id": 1, "eos_token_id": 2,
    }  # fmt: skip
    (path / "config.json").write_text(json.dumps(config))
    return str(path)


def kv_cache_config(num_blocks: int, hybrid: bool) -> KVCacheConfig:
    """One full-attention group, plus a sliding-window group when ``hybrid``."""
    spec = dict(block_size=BLOCK, num_kv_heads=HEADS, head_size=HEAD_SIZE, dtype=torch.float32)
    groups = [KVCacheGroupSpec(list(FULL_LAYERS), FullAttentionSpec(**spec))]
    if hybrid:
        groups.append(KVCacheGroupSpec(list(SWA_LAYERS),
                                       SlidingWindowSpec(**spec, sliding_window=WINDOW)))
    return KVCacheConfig(num_blocks=num_blocks, kv_cache_tensors=[], kv_cache_groups=groups)


def vllm_config(model_dir: str, extra: dict[str, Any], *, hybrid: bool = False, tp_size: int = 1,
                rank: int = 0, max_batched: int = 256, hash_algo: str = "sha256",
                sched_extra: dict[str, Any] | None = None) -> VllmConfig:  # fmt: skip
    """A CPU ``VllmConfig`` whose kv-transfer config loads RadixlinkConnector by module path
    (``sched_extra``: more ``SchedulerConfig`` fields, e.g. ``max_num_seqs``)."""
    model = ModelConfig(model=model_dir, skip_tokenizer_init=True, dtype="float32", seed=0,
                        max_model_len=2048)
    sched = SchedulerConfig(**{
        "max_num_seqs": 8, "max_num_batched_tokens": max_batched, "max_model_len": 2048,
        "enable_chunked_prefill": True, "is_encoder_decoder": False, **(sched_extra or {})})
    cache = CacheConfig(block_size=BLOCK, enable_prefix_caching=True,
                        prefix_caching_hash_algo=hash_algo)
    cache.kv_cache_layout = "LBNHC"  # NOTE: the engine core resolves this before connectors
    transfer = KVTransferConfig(
        kv_connector="RadixlinkConnector", kv_connector_module_path="radixlink.integrations.vllm",
        kv_role="kv_both", kv_load_failure_policy="recompute", kv_connector_extra_config=extra,
    )  # fmt: skip
    config = VllmConfig(model_config=model, scheduler_config=sched, cache_config=cache,
                        kv_transfer_config=transfer, device_config=DeviceConfig("cpu"),
                        parallel_config=ParallelConfig(tensor_parallel_size=tp_size))
    config.parallel_config.rank = rank
    # NOTE: VllmConfig turns the hybrid manager off on CPU platforms; a GPU keeps it on, and
    # then vLLM's connector factory accepts only SupportsHMA connectors. Mirror the GPU.
    config.scheduler_config.disable_hybrid_kv_cache_manager = not hybrid
    return config


def prefix_codes(tokens: Sequence[int]) -> torch.Tensor:
    """One float per position that depends on every token up to it (and its position)."""
    t = torch.tensor(tokens, dtype=torch.float64)
    pos = torch.arange(1, len(tokens) + 1, dtype=torch.float64)
    return torch.remainder(torch.cumsum(t * pos, 0), 1_000_003.0)


def expected_kv(codes: torch.Tensor, layer: int, rank: int) -> torch.Tensor:
    """The KV ``[len(codes), HEADS, 2 * HEAD_SIZE]`` the stand-in model computes."""
    lanes = torch.arange(1, HEADS * 2 * HEAD_SIZE + 1, dtype=torch.float64)
    vals = torch.sin(codes[:, None] * 1e-3 * lanes + 0.37 * layer + 0.91 * rank)
    return vals.to(torch.float32).view(len(codes), HEADS, 2 * HEAD_SIZE)


def next_token(tokens: Sequence[int]) -> int:
    return int(prefix_codes(tokens)[-1].item()) % 1000 + 3


@dataclass
class Node:
    """One vLLM instance: a scheduler and ``tp_size`` workers, sharing a store with others."""

    model_dir: str
    store_url: str
    hybrid: bool = False
    tp_size: int = 1
    num_blocks: int = 64
    max_batched: int = 256
    extra: dict[str, Any] = field(default_factory=dict)
    hash_algo: str = "sha256"
    kv_events: bool = False  # vLLM's KV events on (the test installs the publisher)
    sched_extra: dict[str, Any] = field(default_factory=dict)  # more SchedulerConfig fields
    checked_tokens: int = 0
    preemptions: int = 0
    steps: int = 0
    connector_stats: dict[str, int] = field(default_factory=dict)  # what vLLM's loggers got
    external_tokens: dict[str, int] = field(default_factory=dict)  # req -> prefill stats
    hits_by_source: dict[str, int] = field(default_factory=dict)  # vLLM's connector hit tiers

    def __post_init__(self) -> None:
        extra = {"store": self.store_url, **self.extra}
        configs = [vllm_config(self.model_dir, extra, hybrid=self.hybrid, tp_size=self.tp_size,
                               rank=r, max_batched=self.max_batched, hash_algo=self.hash_algo,
                               sched_extra=self.sched_extra)
                   for r in range(self.tp_size)]  # fmt: skip
        if self.kv_events:
            for config in configs:
                config.kv_events_config = KVEventsConfig(enable_kv_cache_events=True,
                                                         publisher="null")
        self.config = configs[0]
        self.kv_config = kv_cache_config(self.num_blocks, self.hybrid)
        configs[0].cache_config.num_gpu_blocks = self.num_blocks
        self.scheduler = Scheduler(
            vllm_config=configs[0], kv_cache_config=self.kv_config,
            structured_output_manager=StructuredOutputManager(configs[0]), block_size=BLOCK,
            log_stats=True,
        )  # fmt: skip
        self.workers: list[RadixlinkConnector] = []
        self.kv: list[dict[str, torch.Tensor]] = []
        for config in configs:
            worker = RadixlinkConnector(config, KVConnectorRole.WORKER, self.kv_config)
            caches = {name: _layer_tensor(self.num_blocks) for name in self.layer_names}
            worker.register_kv_caches(caches)
            self.workers.append(worker)
            self.kv.append(caches)
        self.aggregator = KVOutputAggregator(expected_finished_count=self.tp_size)

    @property
    def layer_names(self) -> tuple[str, ...]:
        return FULL_LAYERS + (SWA_LAYERS if self.hybrid else ())

    @property
    def connector(self) -> RadixlinkConnector:
        """The scheduler-role connector vLLM built."""
        connector = self.scheduler.get_kv_connector()
        assert isinstance(connector, RadixlinkConnector)
        return connector

    def add(self, req_id: str, tokens: Sequence[int], max_tokens: int = 4) -> Request:
        request = Request(
            request_id=req_id, prompt_token_ids=list(tokens),
            sampling_params=SamplingParams(max_tokens=max_tokens, ignore_eos=True),
            pooling_params=None, block_hasher=get_request_block_hasher(BLOCK, sha256),
        )  # fmt: skip
        self.scheduler.add_request(request)
        return request

    def step(self) -> Any:
        """One engine step: schedule, worker connector hooks around the stand-in forward,
        outputs aggregated over ranks with vLLM's KVOutputAggregator, update_from_output."""
        out = self.scheduler.schedule()
        self.steps += 1
        self.preemptions += len(out.preempted_req_ids or ())
        runs = self._scheduled(out)
        outputs = []
        for rank, worker in enumerate(self.workers):
            worker.bind_connector_metadata(out.kv_connector_metadata)
            worker.start_load_kv(None)  # type: ignore[arg-type]
            self._forward(rank, runs)
            worker.wait_for_save()
            results = worker.get_transfer_results(out.finished_req_ids)
            kv_out = release_dataclass(
                KVConnectorOutput,
                finished_sending=results.finished_sending or None,
                finished_recving=results.finished_recving or None,
                failed_recving=results.failed_recving,
                invalid_block_ids=worker.get_block_ids_with_load_errors(),
                kv_connector_stats=worker.get_kv_connector_stats(),
                kv_cache_events=worker.get_kv_connector_kv_cache_events(),
            )  # fmt: skip
            worker.clear_connector_metadata()
            outputs.append(self._runner_output(runs, kv_out))
        merged = self.aggregator.aggregate(outputs)
        for eco in self.scheduler.update_from_output(out, merged).values():
            self._record(eco)
        return out

    def run(self, max_steps: int = 200) -> None:
        """Step until every request finished and every transfer was reported."""
        for _ in range(max_steps):
            if not self.scheduler.has_unfinished_requests() and not self.scheduler.requests:
                return
            self.step()
            self.wait_io()
        raise AssertionError(f"requests still running after {max_steps} steps")

    def wait_io(self) -> None:
        for worker in self.workers:
            assert worker.worker.flush(timeout=30), "worker transfers did not finish"

    def close(self) -> None:
        self.wait_io()
        for worker in self.workers:
            worker.shutdown()
        self.scheduler.shutdown()

    def assert_no_leak(self) -> None:
        """vLLM's pool holds every block again (the connector held none past its save)."""
        pool = self.scheduler.kv_cache_manager.block_pool
        assert pool.get_num_free_blocks() == self.num_blocks - 1  # the null block is never free
        assert not self.scheduler.requests

    def _record(self, eco: Any) -> None:
        """Sum the connector stats vLLM hands its stat loggers; keep each request's prefill
        stats (its external-token count, as ``prompt_tokens_by_source`` reports it)."""
        stats = eco.scheduler_stats
        for name, value in ((stats and stats.kv_connector_stats) or {}).items():
            self.connector_stats[name] = self.connector_stats.get(name, 0) + value
        prefix = stats and stats.connector_prefix_cache_stats
        for source, hits in (getattr(prefix, "hits_by_source", None) or {}).items():
            self.hits_by_source[str(source)] = self.hits_by_source.get(str(source), 0) + hits
        for output in eco.outputs:
            if output.prefill_stats is not None:
                self.external_tokens[output.request_id] = (
                    output.prefill_stats.num_external_cached_tokens)

    def _scheduled(self, out: Any) -> list[tuple[str, int, int]]:
        runs = [(r.req_id, r.num_computed_tokens, out.num_scheduled_tokens[r.req_id])
                for r in out.scheduled_new_reqs]  # fmt: skip
        cached = out.scheduled_cached_reqs
        runs += [(req_id, cached.num_computed_tokens[i], out.num_scheduled_tokens[req_id])
                 for i, req_id in enumerate(cached.req_ids)]  # fmt: skip
        return runs

    def _forward(self, rank: int, runs: list[tuple[str, int, int]]) -> None:
        """The step's forward on ``rank``: every run writes its tokens' KV, then every run's
        tokens are checked against what they attend to (``[low, start + count)``: the cached
        prefix, or the window's part of it, and the step's own tokens, which also catches two
        runs writing one slot with different KV)."""
        tables = self.scheduler.kv_cache_manager.get_block_ids
        work = []
        for req_id, start, count in runs:
            tokens = self.scheduler.requests[req_id].all_token_ids[: start + count]
            work.append((req_id, start, prefix_codes(tokens), tables(req_id)))
        for _, start, codes, table in work:
            for gid, names in enumerate(self._groups()):
                for name in names:
                    kv = expected_kv(codes[start:], self._layer_number(name), rank)
                    _write(self.kv[rank][name], table[gid], start, kv)
        for req_id, start, codes, table in work:
            self._check(rank, req_id, start, codes, table)

    def _check(self, rank: int, req_id: str, start: int, codes: torch.Tensor,
               table: Sequence[Sequence[int]]) -> None:  # fmt: skip
        for gid, names in enumerate(self._groups()):
            low = 0 if gid == 0 else max(0, start - WINDOW + 1)
            for layer_index, name in enumerate(names):
                got = _read(self.kv[rank][name], table[gid], low, len(codes))
                want = expected_kv(codes[low:], self._layer_number(name), rank)
                if not torch.equal(got, want):
                    bad = low + int((got != want).flatten(1).any(1).nonzero()[0])
                    raise AssertionError(
                        f"{req_id}: KV of token {bad} (attended tokens {low}..{len(codes)}, "
                        f"computed from {start}; group {gid}, {name}, rank {rank}) differs "
                        "from what the storing node computed")  # fmt: skip
                self.checked_tokens += start - low if layer_index == 0 else 0

    def _groups(self) -> list[tuple[str, ...]]:
        return [FULL_LAYERS, SWA_LAYERS] if self.hybrid else [FULL_LAYERS]

    def _layer_number(self, name: str) -> int:
        return self.layer_names.index(name)

    def _runner_output(self, runs: list[tuple[str, int, int]],
                       kv_out: KVConnectorOutput) -> ModelRunnerOutput:  # fmt: skip
        req_ids = [req_id for req_id, _, _ in runs]
        sampled = []
        for req_id, start, count in runs:
            request = self.scheduler.requests[req_id]
            done = start + count >= request.num_tokens
            sampled.append([next_token(request.all_token_ids)] if done else [])
        return release_dataclass(
            ModelRunnerOutput,
            req_ids=req_ids, req_id_to_index={r: i for i, r in enumerate(req_ids)},
            sampled_token_ids=sampled, logprobs=None, prompt_logprobs_dict={},
            pooler_output=None, kv_connector_output=kv_out,
        )  # fmt: skip


def release_dataclass(cls: type, **values: Any) -> Any:
    """``cls(**values)`` for the installed vLLM's version of a record (``ModelRunnerOutput``,
    ``KVConnectorOutput``): values of fields this release lacks are dropped (0.34 dropped
    ``ModelRunnerOutput.req_id_to_index``); a field it requires that ``values`` lacks is an
    error naming it, not a silent default."""
    fields = {f.name: f for f in dataclasses.fields(cls)}
    missing = [name for name, f in fields.items() if name not in values
               and f.default is dataclasses.MISSING
               and f.default_factory is dataclasses.MISSING]  # fmt: skip
    assert not missing, f"{cls.__name__} of this vLLM requires {missing}: extend the harness"
    return cls(**{name: value for name, value in values.items() if name in fields})


def _layer_tensor(num_blocks: int) -> torch.Tensor:
    """A layer's KV in vLLM's LBNHC layout: logical ``[B, H, N, C]``, physically [B, N, H, C]."""
    physical = torch.full((num_blocks, BLOCK, HEADS, 2 * HEAD_SIZE), float("nan"))
    return physical.permute(0, 2, 1, 3)


def _slots(table: Sequence[int], start: int, end: int) -> tuple[torch.Tensor, torch.Tensor]:
    pos = torch.arange(start, end)
    blocks = torch.tensor(table, dtype=torch.int64)[pos // BLOCK]
    assert bool((blocks != 0).all()), f"tokens {start}..{end} map to vLLM's null block"
    return blocks, pos % BLOCK


def _read(cache: torch.Tensor, table: Sequence[int], start: int, end: int) -> torch.Tensor:
    blocks, offsets = _slots(table, start, end)
    return cache[blocks, :, offsets]  # [n, H, C]


def _write(cache: torch.Tensor, table: Sequence[int], start: int, kv: torch.Tensor) -> None:
    blocks, offsets = _slots(table, start, start + len(kv))
    cache[blocks, :, offsets] = kv
