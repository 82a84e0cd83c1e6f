"""The test oracle: what a deterministic "model" writes for a request, as a function of the
request's WHOLE token history and its namespace, never of a (token, position) pair alone.

K/V at position ``i`` (full pool and SWA pool, per layer, K and V) derive from two rolling
polynomial hashes of ``tokens[0..i]`` seeded by the namespace; the Mamba state after ``n``
tokens from the same hashes of ``tokens[0..n)``. So a page served for another history (the same
tokens at the same positions after different earlier tokens) or another namespace differs from
the oracle. Hashes are computed with cumulative numpy ops (no per-token Python loop) and every
value is an integer below ``2**20``: exact in float32.

The namespace a request lives in is the cache's own layered with the request's
(``resolved(cache, ns)``); pass the request's ``namespace``.
``verify_tree`` checks every node's slots against the oracle for the node's whole path (root to
node end). Owns nothing of the library; uses only its public API (pools via ``cache.pool``).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from radixlink.contract import PoolName
from radixlink.hashing import layer_namespaces, namespace_id

PRIMES = np.array([1_048_573, 1_048_571], dtype=np.int64)  # the two largest primes < 2**20
BASES = np.array([916_789, 611_953], dtype=np.int64)
_POOL_CODE = {PoolName.KV: 1, PoolName.SWA: 2}
_powers = np.ones((1, 2), dtype=np.int64)  # _powers[j] = BASES**j mod PRIMES, grown on demand
_seeds: dict[str, np.ndarray] = {}
_codes: dict[tuple[Any, int, int], tuple[np.ndarray, np.ndarray, np.ndarray]] = {}

Hash = np.ndarray
"""``int64 [2]``: the two rolling hashes after some prefix (the namespace's seed when empty)."""


def resolved(cache: Any, namespace: Any) -> Any:
    """The namespace a request in ``namespace`` lives in: the cache's, layered with it."""
    return layer_namespaces(cache.config.namespace, namespace)


def _power_table(n: int) -> np.ndarray:
    """``BASES**j mod PRIMES`` for ``j < n`` (rows), grown by doubling."""
    global _powers
    while _powers.shape[0] < n:
        step = _powers[-1] * BASES % PRIMES
        _powers = np.concatenate([_powers, _powers * step % PRIMES])
    return _powers


def seed(resolved: Any) -> Hash:
    """The hashes of the empty prefix in the (already resolved) namespace ``resolved``."""
    nid = namespace_id(resolved)
    out = _seeds.get(nid)
    if out is None:
        digest = int(nid, 16)
        out = _seeds[nid] = np.array([digest % int(PRIMES[0]), (digest >> 24) % int(PRIMES[1])],
                                     dtype=np.int64)
    return out


def extend(init: Hash, tokens: Any, start: int) -> np.ndarray:
    """``int64 [n, 2]``: row ``r`` is the hashes after position ``start + r``, continuing the
    prefix ``[0, start)`` whose hashes are ``init``. ``tokens`` are those at ``start..``."""
    tok = np.asarray(tokens, dtype=np.int64).reshape(-1)
    n = tok.shape[0]
    if n == 0:
        return np.empty((0, 2), dtype=np.int64)
    powers = _power_table(start + n + 1)[start + 1 : start + n + 1]
    terms = (tok[:, None] + 1) % PRIMES * powers % PRIMES  # each < 2**20: the cumsum is exact
    return (np.cumsum(terms, axis=0) + init) % PRIMES


def hashes(history: Any, resolved: Any, start: int = 0) -> np.ndarray:
    """``int64 [len(history) - start, 2]``: the hashes after each position ``start..`` of
    ``history`` (the whole token history from position 0) in namespace ``resolved``."""
    rows = extend(seed(resolved), history, 0)
    return rows[start:]


def after(history: Any, resolved: Any) -> Hash:
    """The hashes after all of ``history`` (the seed when it is empty)."""
    rows = extend(seed(resolved), history, 0)
    return rows[-1] if rows.shape[0] else seed(resolved)


def kv_of(rows: np.ndarray, pool: PoolName, num_layers: int,
          shape: tuple[int, ...]) -> torch.Tensor:
    """``float32 [2, num_layers, n, *shape]``: K (row 0) and V (row 1) of ``pool``'s layers at
    the positions whose hashes are ``rows``, laid out as a pool's storage. Head ``j`` carries
    hash ``j % 2`` plus an offset naming (pool, layer, K|V, head); every value is an integer
    below 2**20."""
    heads = shape[0]
    key = (pool, num_layers, heads)
    if key not in _codes:
        j = np.arange(heads)
        which = np.arange(2)[:, None, None]
        layer = np.arange(num_layers)[None, :, None]
        code = ((_POOL_CODE[pool] * 64 + layer) * 2 + which) * 7919 + j * 104_729
        _codes[key] = (j % 2, code[:, :, None, :], PRIMES[j % 2])  # code: [2, L, 1, heads]
    pick, code, primes = _codes[key]
    vals = (rows[:, pick] + code) % primes
    out = torch.from_numpy(vals.astype(np.float32))
    return out.view(*out.shape, *([1] * (len(shape) - 1))).expand(
        2, num_layers, rows.shape[0], *shape)


def state_of(h: Hash, n: int, nbytes: int) -> torch.Tensor:
    """``uint8 [nbytes]``: the recurrent state after ``n`` tokens whose hashes are ``h``
    (words 0 and 1 are the two hashes themselves)."""
    words = -(-nbytes // 4)
    k = np.arange(max(words, 2), dtype=np.int64)
    w = (h[0] + k * h[1] + k * k * (n + 1)) % (1 << 31)
    w[0], w[1] = h[0], h[1]
    return torch.from_numpy(w.astype("<i4").view(np.uint8)[:nbytes].copy())


# ---------------------------------------------------------------- on a cache


def _pools(cache: Any) -> list[tuple[PoolName, Any]]:
    return [(name, pool) for name in (PoolName.KV, PoolName.SWA)
            if (pool := cache.pool(name)) is not None]


def _expected(pool: Any, name: PoolName, rows: np.ndarray) -> torch.Tensor:
    return kv_of(rows, name, pool.layout.num_layers, tuple(pool.k(0).shape[1:]))


def _write_rows(pool: Any, name: PoolName, slots: torch.Tensor, rows: np.ndarray) -> None:
    want = _expected(pool, name, rows)
    for layer in range(pool.layout.num_layers):
        pool.k(layer)[slots] = want[0, layer]
        pool.v(layer)[slots] = want[1, layer]


def _rows_match(pool: Any, name: PoolName, slots: torch.Tensor, rows: np.ndarray) -> bool:
    if slots.numel() != rows.shape[0]:
        return False
    want = _expected(pool, name, rows)
    return all(torch.equal(pool.k(layer)[slots], want[0, layer])
               and torch.equal(pool.v(layer)[slots], want[1, layer])
               for layer in range(pool.layout.num_layers))


def write(cache: Any, slots: torch.Tensor, history: Any, start: int,
          namespace: Any = None) -> None:
    """The model computes positions ``start..len(history)`` of ``history`` (the request's whole
    token list) at full slots ``slots``: full K/V, and SWA K/V where the cache has SWA."""
    history = np.asarray(history, dtype=np.int64)
    assert slots.numel() == history.shape[0] - start, (
        f"{slots.numel()} slots for positions [{start}, {history.shape[0]})"
    )
    rows = hashes(history, resolved(cache, namespace), start)
    for name, pool in _pools(cache):
        where = slots if name is PoolName.KV else cache.hybrid.swa_slots(slots)
        _write_rows(pool, name, where, rows)


def kv_matches(cache: Any, slots: torch.Tensor, history: Any, start: int = 0,
               namespace: Any = None) -> bool:
    """Whether full slots ``slots`` hold exactly the model's K/V of positions
    ``start..len(history)`` of ``history`` (its whole token list from position 0)."""
    pool = cache.pool(PoolName.KV)
    rows = hashes(history, resolved(cache, namespace), start)
    return _rows_match(pool, PoolName.KV, slots, rows)


def swa_matches(cache: Any, swa_slots: torch.Tensor, history: Any, namespace: Any = None) -> bool:
    """Whether SWA slots ``swa_slots`` hold the model's SWA K/V of the LAST
    ``swa_slots.numel()`` positions of ``history`` (a served window)."""
    start = len(history) - swa_slots.numel()
    if start < 0:
        return False
    rows = hashes(history, resolved(cache, namespace), start)
    return _rows_match(cache.pool(PoolName.SWA), PoolName.SWA, swa_slots, rows)


def state(cache: Any, history: Any, namespace: Any = None) -> torch.Tensor:
    """The Mamba state bytes after all of ``history`` in the request's namespace."""
    h = after(history, resolved(cache, namespace))
    return state_of(h, len(history), cache.pool(PoolName.MAMBA).layout.state_bytes)


def served_matches(cache: Any, match: Any, history: Any, namespace: Any = None) -> bool:
    """Whether a match (or a load's ``outcome.match``) of ``history`` serves exactly the model's
    data for ``history[:match.prefix_len]``: full K/V, the live SWA window, the state."""
    served = list(history)[: match.prefix_len]
    if not kv_matches(cache, match.device_indices, served, 0, namespace):
        return False
    swa = getattr(match, "swa_indices", None)
    if swa is not None and cache.pool(PoolName.SWA) is not None and swa.numel() and not (
            swa_matches(cache, swa, served, namespace)):
        return False
    slot = getattr(match, "mamba_slot", None)
    states = cache.pool(PoolName.MAMBA)
    if slot is not None and states is not None and match.prefix_len:
        return torch.equal(states.read_state(slot), state(cache, served, namespace))
    return True


def verify_tree(cache: Any) -> None:
    """Every node's data is exactly what the model wrote for the node's WHOLE PATH (root to
    node end) in its root's namespace: its full K/V, its live SWA suffix and its state."""
    pools = dict(_pools(cache))
    states = cache.pool(PoolName.MAMBA)
    swa_index = 1 if PoolName.SWA in pools else None
    for root in cache.tree.roots():
        stack = [(child, seed(resolved(cache, root.namespace)))
                 for child in root.children.values()]
        while stack:
            node, init = stack.pop()
            start = node.start
            rows = extend(init, np.frombuffer(node.key, dtype="<u4"), start)
            end_hash = rows[-1] if rows.shape[0] else init
            stack.extend((child, end_hash) for child in node.children.values())
            full = node.values[0]
            if full is None:
                continue
            assert _rows_match(pools[PoolName.KV], PoolName.KV, full, rows), (
                f"{node}: full K/V differ from what the model wrote for this path")
            live = None if swa_index is None else node.values[swa_index]
            if live is not None and live.numel():
                assert _rows_match(pools[PoolName.SWA], PoolName.SWA, live,
                                   rows[rows.shape[0] - live.numel():]), (
                    f"{node}: SWA K/V differ from what the model wrote for this path")
            slot = node.values[-1] if states is not None else None
            if slot is not None:
                want = state_of(end_hash, node.seq_len, states.layout.state_bytes)
                assert torch.equal(states.read_state(slot), want), (
                    f"{node}: state differs from the model's after this path")
