"""The reference engine: one request at a time through the public ``UnifiedCache`` /
``ExternalCacheLinker`` API (match, load, lock, alloc, prefill the suffix, decode, insert).

Owns request scheduling and per-request timing. Must not reach into the tree, the linker's
internals or the stores: everything goes through the facade and the linker's public calls.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from radixlink.contract import ComponentType, InsertParams, PoolName
from radixlink.engine.config import cache_config as cache_config  # NOTE: re-exported
from radixlink.engine.config import kv_layout
from radixlink.engine.layerwise import LoadFailed, layer_pools, layer_waiter
from radixlink.engine.model import ForwardInput, HybridLM, PagedCache
from radixlink.engine.weights import ChatTokenizer
from radixlink.memory.layout import KVLayout, StateLayout


@dataclass(slots=True, kw_only=True)
class RequestResult:
    """What one request produced and where its prompt's K/V came from.

    ``num_from_device + num_from_store + num_computed == prompt_len``.

    Attributes:
        req_id: the caller's id.
        prompt_len: prompt tokens.
        output_ids: generated token ids (the end-of-sequence token excluded).
        num_from_device: prompt tokens whose K/V were already on device.
        num_from_store: prompt tokens whose K/V were loaded from the store.
        num_computed: prompt tokens prefilled by the model.
        loaded_bytes: store bytes read for this request.
        ttft_s: request start (before the match) through the first generated token.
        load_s: time spent waiting for the store load (layer-wise: for the outcome after
            the prefill; the waits for layers are inside ``prefill_s``).
        prefill_s: time of the prefill forward pass.
        decode_s: time of the decode steps after the first token.
        load_failed: a store load was started and failed (the prefix was recomputed).
        layerwise: the prefix loaded layer by layer under the prefill.
    """

    req_id: Any
    prompt_len: int
    output_ids: list[int] = field(default_factory=list)
    num_from_device: int = 0
    num_from_store: int = 0
    num_computed: int = 0
    loaded_bytes: int = 0
    ttft_s: float = 0.0
    load_s: float = 0.0
    prefill_s: float = 0.0
    decode_s: float = 0.0
    load_failed: bool = False
    layerwise: bool = False


@dataclass(slots=True)
class _Prefix:
    """The cached prefix a request starts from, the lock that protects it and (MAMBA) the
    request's own copy of the state at its end. While a layer-wise load lands, ``landing``
    is set, ``slots`` are where it lands and ``lock`` is None until the outcome."""

    slots: torch.Tensor
    num_device: int
    num_store: int
    lock: Any
    state_slot: int | None = None
    load_s: float = 0.0
    load_failed: bool = False
    landing: Any = None
    lookup_id: Any = None


@dataclass(slots=True)
class _Seq:
    """One request's slots in every pool.

    ``kv``: full slots of positions ``[0, total)``; ``swa``: SWA slots of the same positions;
    ``state``: the Mamba state the model continues; ``snapshot``: the state at the last page
    boundary passed (what ``insert`` caches), when the cache holds Mamba states.
    """

    kv: torch.Tensor
    swa: torch.Tensor
    state: int
    snapshot: int | None


class Engine:
    """Serves requests one at a time on ``model`` over ``cache`` (and ``linker``, if given).

    Per request: match (device + store lookup) -> load and wait on a store hit -> lock ->
    alloc the rest -> prefill only the uncached suffix -> greedy decode -> insert prompt and
    output (whole pages; the partial tail is freed) -> unlock.

    The model always writes K/V (and states) into the cache's pools and reads them back from
    them, so what it attends to is bitwise the same whether computed now, kept on device or
    loaded. Layers whose pool the cache lacks (SWA / Mamba on a cache without those
    components, e.g. ``NoPrefixCache``) use private side pools, and then prefixes are never
    reused: only the cache can keep their state with the prefix.

    A store hit loads layer by layer under the prefill (``layerwise``, models without Mamba
    layers): the forward of layer i starts once layer i has landed, then the engine takes
    the load's outcome (the canonical slots) before decoding. Otherwise the whole load
    completes before the prefill starts.

    Args:
        model: the LM.
        tokenizer: gives the end-of-sequence id.
        cache: a ``UnifiedCache`` or ``NoPrefixCache`` built with ``cache_config(model.spec)``.
        linker: an ``ExternalCacheLinker`` attached to ``cache``, or None (device only).
        layerwise: compute while a store load lands (see above).
    """

    def __init__(self, model: HybridLM, tokenizer: ChatTokenizer, cache: Any,
                 linker: Any = None, *, layerwise: bool = True):
        spec, ps = model.spec, cache.page_size
        kinds = set(spec.layer_types)
        kv = _cache_pool(cache, PoolName.KV, kv_layout(spec, ps))
        if kv is None:
            raise ValueError("the cache has no KV tensors (kv_layout=None); build it with "
                             "engine.cache_config(model.spec, ...)")
        swa = _cache_pool(cache, PoolName.SWA, kv_layout(spec, ps, ComponentType.SWA)) if (
            ComponentType.SWA in kinds) else None
        states = _cache_pool(cache, PoolName.MAMBA, StateLayout(
            shapes=spec.state_shapes, dtype=spec.dtype)) if ComponentType.MAMBA in kinds else None
        self.model, self.tokenizer, self.cache, self.linker = model, tokenizer, cache, linker
        self.page_size: int = ps
        self.pools = PagedCache.from_pools(spec, kv=kv, swa=swa, states=states)
        side = PagedCache.allocate(spec, num_slots=0, num_swa_slots=kv.num_slots, num_states=1,
                                   device=kv.device)
        if swa is None:  # NOTE: private SWA rows indexed by full slots
            self.pools.swa_k, self.pools.swa_v = side.swa_k, side.swa_v
        if states is None:  # NOTE: one private state slot (1)
            self.pools.conv_states, self.pools.ssm_states = side.conv_states, side.ssm_states
        self._swa_cached, self._states = swa is not None, states
        self._window = spec.sliding_window if ComponentType.SWA in kinds else 0
        self._mamba = ComponentType.MAMBA in kinds
        self.reuse_prefix = ((ComponentType.SWA not in kinds or swa is not None)
                             and (not self._mamba or states is not None))
        self._device = kv.device
        self._empty = torch.empty(0, dtype=torch.int64, device=self._device)
        # NOTE: a Mamba state is needed before layer 0 and is copied from the tree's node,
        # which exists only after the outcome: such models load whole.
        self.layerwise = layerwise and linker is not None and not self._mamba
        self._layer_pools = layer_pools(spec)

    def generate(self, prompt_ids: Sequence[int], max_new_tokens: int,
                 req_id: Any = None) -> RequestResult:
        """Serve one request: greedy-decode up to ``max_new_tokens`` after ``prompt_ids``.

        Raises:
            ValueError: empty prompt, ``max_new_tokens < 1``, or a request larger than the
                device pools can hold even after evicting everything unlocked.
        """
        if len(prompt_ids) == 0 or max_new_tokens < 1:
            raise ValueError(f"need a non-empty prompt and max_new_tokens >= 1, got "
                             f"{len(prompt_ids)} tokens and max_new_tokens={max_new_tokens}")
        loaded_before = self._loaded_bytes()
        start = time.perf_counter()
        prompt = [int(t) for t in prompt_ids]
        res = RequestResult(req_id=req_id, prompt_len=len(prompt))
        total = len(prompt) + max_new_tokens - 1  # the last new token's K/V is never needed
        tokens = torch.tensor(prompt, dtype=torch.int64, device=self._device)
        # NOTE: match without the last token: its logits are needed, so it is always computed.
        prefix = self._match(prompt[:-1], req_id)
        t0 = time.perf_counter()
        seq, prefix, logits = self._start(prefix, total, tokens)
        #   0 ........ use ............ len(prompt) ........... total
        #   |-- cached --|-- prefilled --|-- decoded (one by one) --|
        use = prefix.slots.numel()
        res.num_from_device, res.num_from_store = prefix.num_device, prefix.num_store
        res.num_computed = len(prompt) - use
        res.load_s, res.load_failed = prefix.load_s, prefix.load_failed
        res.layerwise = prefix.landing is not None
        next_id = int(logits[-1].argmax())
        res.prefill_s = time.perf_counter() - t0  # NOTE: layer-wise: with the layers' waits
        res.ttft_s = time.perf_counter() - start
        res.loaded_bytes = self._loaded_bytes() - loaded_before
        if self.linker is not None and not res.layerwise:  # NOTE: a pure compute timing
            self.linker.observe_prefill(res.num_computed, use, res.prefill_s)
        out = self._decode(seq, next_id, len(prompt), max_new_tokens, res)
        self._insert(seq, prompt + out[:-1], use, prefix.lock)
        if self.linker is not None:
            self.linker.poll()  # NOTE: sends this request's offloads now (one batch)
        return res

    def _start(self, prefix: _Prefix, total: int,
               tokens: torch.Tensor) -> tuple[_Seq, _Prefix, torch.Tensor]:
        """Slots for the request, then its prefill: under a landing load, layer by layer, then
        the load's outcome; a load that fails there is dropped and the prefix recomputed."""
        seq = self._begin(prefix, total)
        if seq is None and prefix.slots.numel():  # the locked prefix pins too much: recompute
            prefix = self._give_up(prefix)
            seq = self._begin(prefix, total)
        if seq is None:
            self._release(prefix)
            raise ValueError(f"a request of {total} tokens does not fit the device pools "
                             f"({self.cache.stats()['total_tokens']} tokens, some locked); "
                             "raise num_tokens")
        use = prefix.slots.numel()
        if prefix.landing is None:
            return seq, prefix, self._prefill(seq, tokens, use)
        wait = layer_waiter(prefix.landing, self._layer_pools, self.linker.config.load_timeout_s)
        try:
            logits: torch.Tensor | None = self._prefill(seq, tokens, use, wait)
        except LoadFailed:
            logits = None
        settled = self._settle(prefix, seq)
        if settled.landing is not None and logits is not None:
            return seq, settled, logits
        self.cache.free(seq.kv[use:])  # NOTE: the loaded part is the linker's to release
        settled.landing = None  # NOTE: the outcome is taken; recompute over what it left
        settled.load_failed = True
        return self._start(settled, total, tokens)

    def _settle(self, prefix: _Prefix, seq: _Seq) -> _Prefix:
        """Take a landing load's outcome: on success the request moves to the tree's canonical
        slots of the prefix (the same bytes) and holds the outcome's lock; on failure it
        gets the device prefix it had (and its lock) to recompute from."""
        t0 = time.perf_counter()
        out = self.linker.wait_load(prefix.lookup_id)
        waited = time.perf_counter() - t0
        if not out.ok:
            return _Prefix(out.device_indices, out.prefix_len, 0, out.lock, load_s=waited,
                           load_failed=True)
        seq.kv[: out.prefix_len] = out.device_indices
        if self._swa_cached:
            seq.swa = self.cache.hybrid.swa_slots(seq.kv)
        return _Prefix(out.device_indices, out.prefix_len - out.loaded_len, out.loaded_len,
                       out.lock, load_s=waited, landing=prefix.landing)

    def _give_up(self, prefix: _Prefix) -> _Prefix:
        """Drop a prefix that does not leave room for the request (a landing load is taken
        and released first): recompute from scratch."""
        if prefix.landing is not None:
            prefix = self._settle(prefix, _Seq(prefix.slots.clone(), self._empty, 1, None))
        self._release(prefix)
        return _Prefix(self._empty, 0, 0, None, load_failed=prefix.load_failed)

    def _loaded_bytes(self) -> int:
        return 0 if self.linker is None else int(self.linker.stats().get("loaded_bytes", 0))

    def _match(self, key: list[int], req_id: Any) -> _Prefix:
        cache, linker = self.cache, self.linker
        if not self.reuse_prefix or not key:
            return _Prefix(self._empty, 0, 0, None)
        lookup_id = req_id if linker is not None else None
        m = cache.match_prefix(key, req_id=lookup_id)
        if linker is None or not m.external_hit_len or not linker.load(lookup_id):
            return self._own_prefix(_Prefix(m.device_indices, m.prefix_len, 0,
                                            cache.lock(m.last_node)), m.last_node)
        landing = linker.landing(lookup_id) if self.layerwise else None
        if landing is not None:
            return _Prefix(landing.device_indices, landing.prefix_len - landing.loaded_len,
                           landing.loaded_len, None, landing=landing, lookup_id=lookup_id)
        t0 = time.perf_counter()
        out = linker.wait_load(lookup_id)
        prefix = _Prefix(out.device_indices, out.prefix_len - out.loaded_len, out.loaded_len,
                         out.lock, None, time.perf_counter() - t0, not out.ok)
        return self._own_prefix(prefix, out.last_node)

    def _own_prefix(self, prefix: _Prefix, node: Any) -> _Prefix:
        """With cached Mamba states, take the request's own copy of the state at the prefix's
        end (match and load only report the tree's); without one, recompute from scratch."""
        if self._states is None or not prefix.slots.numel():
            return prefix
        prefix.state_slot = self.cache.hybrid.copy_state(node)
        if prefix.state_slot is None:  # every state is held or locked: recompute
            self._release(prefix)
            return _Prefix(self._empty, 0, 0, None, load_failed=prefix.load_failed)
        return prefix

    def _begin(self, prefix: _Prefix, total: int) -> _Seq | None:
        """Slots for positions ``[use, total)`` in every pool (evicting when short); None
        when they do not fit (nothing is then held beyond ``prefix``)."""
        cache, use = self.cache, prefix.slots.numel()
        new = cache.alloc(total - use)
        if new is None:
            return None
        state, snapshot = prefix.state_slot, None
        if self._states is not None:
            state = cache.hybrid.alloc_state() if state is None else state
            snapshot = cache.hybrid.alloc_state()
            if state is None or snapshot is None:
                for slot in (state, snapshot):
                    if slot is not None and slot != prefix.state_slot:
                        cache.hybrid.free_state(slot)
                cache.free(new)
                return None
        kv = torch.cat([prefix.slots, new])
        swa = cache.hybrid.swa_slots(kv) if self._swa_cached else kv
        return _Seq(kv, swa, 1 if state is None else state, snapshot)

    def _release(self, prefix: _Prefix) -> None:
        """Give back what a prefix holds (its lock and its Mamba state copy)."""
        if prefix.state_slot is not None:
            self.cache.hybrid.free_state(prefix.state_slot)
        self._unlock(prefix.lock)

    def _forward(self, seq: _Seq, token_ids: torch.Tensor, start: int,
                 wait: Any = None) -> torch.Tensor:
        end = start + token_ids.numel()
        low = max(0, start - self._window + 1) if self._window else 0  # SWA reads W-1 back
        return self.model(ForwardInput(
            token_ids=token_ids, prefix_len=start, out_slots=seq.kv[start:end],
            seq_slots=seq.kv[:end], swa_out_slots=seq.swa[start:end],
            swa_seq_slots=seq.swa[low:end], state_slot=seq.state, last_only=True,
            wait_layer=wait), self.pools)

    def _snapshot(self, seq: _Seq) -> None:
        if seq.snapshot is not None and self._states is not None:
            self._states.copy(seq.state, seq.snapshot)

    def _prefill(self, seq: _Seq, tokens: torch.Tensor, use: int,
                 wait: Any = None) -> torch.Tensor:
        """Prefill ``tokens[use:]``; with cached Mamba states, split at the last page boundary
        to snapshot the state there. ``wait``: the per-layer wait of a landing prefix."""
        cut = tokens.numel() // self.page_size * self.page_size if seq.snapshot is not None else use
        if cut == use:
            self._snapshot(seq)
        logits = self._empty
        for s, e in ((use, cut), (cut, tokens.numel())):
            if e > s:
                logits = self._forward(seq, tokens[s:e], s, wait)
                if e == cut:
                    self._snapshot(seq)
        return logits

    def _decode(self, seq: _Seq, first_id: int, pos: int, max_new_tokens: int,
                res: RequestResult) -> list[int]:
        """Greedy steps after the first token; returns every sampled id (eos included)."""
        t0, eos, ps = time.perf_counter(), self.tokenizer.eos_token_id, self.page_size
        sampled = [first_id]
        while sampled[-1] != eos and len(sampled) < max_new_tokens:
            step = torch.tensor(sampled[-1:], dtype=torch.int64, device=self._device)
            sampled.append(int(self._forward(seq, step, pos)[-1].argmax()))
            pos += 1
            if pos % ps == 0:
                self._snapshot(seq)
        res.output_ids = sampled[:-1] if sampled[-1] == eos else list(sampled)
        res.decode_s = time.perf_counter() - t0
        return sampled

    def _insert(self, seq: _Seq, tokens: list[int], use: int, lock: Any) -> None:
        """Cache the whole pages of ``tokens`` (those whose K/V were written), free the rest.

        ```
        kv    |-- tree's (use) --|-- ours: whole pages --|-- ours: tail + unused --|
        insert:  prev_prefix_len   adopted, or duplicates   freed here
        state  (MAMBA) the snapshot at the last whole page goes with the insert
        ```
        """
        n = len(tokens) // self.page_size * self.page_size
        assert self.reuse_prefix or use == 0, f"prefix reuse is off but {use} tokens were used"
        keep = seq.snapshot if seq.snapshot is not None and n > 0 else None
        self.cache.insert(InsertParams(key=tokens, value=seq.kv[:n], prev_prefix_len=use,
                                       mamba_value=keep))
        if seq.kv.numel() > n:
            self.cache.free(seq.kv[n:])
        if self._states is not None:
            self.cache.hybrid.free_state(seq.state)
            if keep is None and seq.snapshot is not None:
                self.cache.hybrid.free_state(seq.snapshot)
        self._unlock(lock)

    def _unlock(self, lock: Any) -> None:
        if lock is not None:
            self.cache.unlock(lock)

    def flush(self, timeout: float | None = None) -> bool:
        """Wait for background offloads to reach the store (True without a linker)."""
        return True if self.linker is None else bool(self.linker.flush(timeout))

    def stats(self) -> dict[str, Any]:
        """The cache's counters, plus the linker's under ``"linker"`` when there is one."""
        out = dict(self.cache.stats())
        if self.linker is not None:
            out["linker"] = self.linker.stats()
        return out


def _cache_pool(cache: Any, name: PoolName, layout: KVLayout | StateLayout) -> Any:
    """The cache's pool ``name`` if it has one, checked against the model's ``layout``."""
    pool = cache.pool(name)
    if pool is not None and pool.layout != layout:
        raise ValueError(f"the cache's {name.value} pool has layout {pool.layout}, the model "
                         f"needs {layout}; build the cache with engine.cache_config(spec, ...)")
    return pool
