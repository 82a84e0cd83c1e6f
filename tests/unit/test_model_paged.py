"""Tiny hybrid model over paged pools: prefix/suffix equivalence, windows, decode, bad input."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from radixlink.contract import ComponentType
from radixlink.engine import (
    TINY_HYBRID,
    ByteTokenizer,
    ForwardInput,
    HybridLM,
    ModelSpec,
    PagedCache,
    load_model,
    random_model,
)
from radixlink.engine.mamba import ssd_scan

F_, S_, M_ = ComponentType.FULL, ComponentType.SWA, ComponentType.MAMBA
SEQ_LEN = 200  # > 3 SWA windows (64) and > 6 Mamba chunks (32)
NUM_SLOTS = 512
SPECS = {
    "full": dataclasses.replace(TINY_HYBRID, layer_types=(F_, F_)),
    "swa": dataclasses.replace(TINY_HYBRID, layer_types=(S_, S_)),
    "mamba": dataclasses.replace(TINY_HYBRID, layer_types=(M_, M_)),
    "hybrid": TINY_HYBRID,
}


class Seq:
    """One sequence's tokens and its (non-contiguous, shuffled) slots in every pool."""

    def __init__(self, model: HybridLM, seed: int, length: int = SEQ_LEN):
        gen = torch.Generator().manual_seed(seed)
        self.model = model
        self.tokens = torch.randint(0, model.spec.vocab_size, (length,), generator=gen)
        self.slots = torch.randperm(NUM_SLOTS - 1, generator=gen)[:length] + 1
        self.swa_slots = torch.randperm(NUM_SLOTS - 1, generator=gen)[:length] + 1
        self.cache = PagedCache.allocate(model.spec, num_slots=NUM_SLOTS,
                                         num_swa_slots=NUM_SLOTS, num_states=3)

    def step(self, start: int, end: int, *, swa_from: int = 0, state_slot: int = 1,
             last_only: bool = False) -> torch.Tensor:
        """Prefills tokens [start, end) on top of the cached [0, start)."""
        return self.model(ForwardInput(
            token_ids=self.tokens[start:end], prefix_len=start,
            out_slots=self.slots[start:end], seq_slots=self.slots[:end],
            swa_out_slots=self.swa_slots[start:end], swa_seq_slots=self.swa_slots[swa_from:end],
            state_slot=state_slot, last_only=last_only), self.cache)


pytestmark = pytest.mark.usefixtures("one_thread")


_HYBRID = random_model(TINY_HYBRID, seed=0)
_HYBRID_REFERENCE = Seq(_HYBRID, seed=8).step(0, SEQ_LEN)


@pytest.fixture(scope="module", params=list(SPECS))
def model(request: pytest.FixtureRequest) -> HybridLM:
    return random_model(SPECS[request.param], seed=0)


@pytest.mark.parametrize("splits", [(1,), (31,), (64,), (100,), (199,), (40, 41, 150)])
def test_prefix_then_suffix_equals_one_prefill(model: HybridLM, splits: tuple[int, ...]) -> None:
    """Prefill in pieces, continuing from cached K/V and state, gives the one-shot logits."""
    reference = Seq(model, seed=1).step(0, SEQ_LEN)
    seq = Seq(model, seed=1)
    bounds = (0, *splits, SEQ_LEN)
    pieces = [seq.step(a, b) for a, b in zip(bounds, bounds[1:], strict=False)]
    assert torch.allclose(torch.cat(pieces), reference, atol=1e-5, rtol=0)


@pytest.mark.parametrize("prefix_len", [70, 130])
def test_swa_reads_only_the_window(prefix_len: int) -> None:
    """SWA K/V older than the window may be garbage (NaN): the suffix logits do not change."""
    model = random_model(SPECS["swa"], seed=0)
    reference = Seq(model, seed=2).step(0, SEQ_LEN)
    seq = Seq(model, seed=2)
    seq.step(0, prefix_len)
    window = model.spec.sliding_window
    swa_from = prefix_len - (window - 1)
    for k, v in zip(seq.cache.swa_k, seq.cache.swa_v, strict=True):
        k[seq.swa_slots[:swa_from]] = float("nan")
        v[seq.swa_slots[:swa_from]] = float("nan")
    suffix = seq.step(prefix_len, SEQ_LEN, swa_from=swa_from)
    assert torch.allclose(suffix, reference[prefix_len:], atol=1e-5, rtol=0)


def test_swa_window_limits_attention() -> None:
    """A window covering the sequence equals full attention; a short window does not."""
    full = Seq(random_model(SPECS["full"], seed=0), seed=3).step(0, SEQ_LEN)
    wide = dataclasses.replace(SPECS["swa"], sliding_window=SEQ_LEN)
    assert torch.allclose(Seq(random_model(wide, seed=0), seed=3).step(0, SEQ_LEN), full,
                          atol=1e-5, rtol=0)
    narrow = Seq(random_model(SPECS["swa"], seed=0), seed=3).step(0, SEQ_LEN)
    window = SPECS["swa"].sliding_window
    assert torch.allclose(narrow[:window], full[:window], atol=1e-5, rtol=0)
    assert not torch.allclose(narrow[window:], full[window:], atol=1e-3, rtol=0)


@pytest.mark.parametrize("swa_reads", ["window", "everything"])
def test_decode_steps_equal_prefill_rows(model: HybridLM, swa_reads: str) -> None:
    """One-token decode steps give the same logits as the matching rows of a full prefill."""
    reference = Seq(model, seed=4).step(0, SEQ_LEN)
    seq = Seq(model, seed=4)
    seq.step(0, SEQ_LEN - 5)
    window = model.spec.sliding_window if swa_reads == "window" else SEQ_LEN
    steps = [seq.step(p, p + 1, swa_from=max(0, p - window + 1)) for p in
             range(SEQ_LEN - 5, SEQ_LEN)]
    assert torch.allclose(torch.cat(steps), reference[-5:], atol=1e-5, rtol=0)


@settings(max_examples=12, deadline=None)
@given(st.lists(st.integers(1, SEQ_LEN - 1), min_size=1, max_size=4, unique=True))
def test_any_split_of_the_hybrid_prefill_agrees(cuts: list[int]) -> None:
    """Prefill of the hybrid model cut anywhere, any number of times, equals one prefill."""
    model = _HYBRID
    bounds = (0, *sorted(cuts), SEQ_LEN)
    seq = Seq(model, seed=8)
    pieces = [seq.step(a, b) for a, b in zip(bounds, bounds[1:], strict=False)]
    assert torch.allclose(torch.cat(pieces), _HYBRID_REFERENCE, atol=1e-5, rtol=0)


class _KV:
    """Plain tensors behind the memory K/V pool's accessors (``k(layer)``, ``v(layer)``)."""

    def __init__(self, num_layers: int, num_slots: int, spec: ModelSpec):
        self.storage = torch.randn(2, num_layers, num_slots, spec.num_kv_heads, spec.head_dim)

    def k(self, layer: int) -> torch.Tensor:
        return self.storage[0, layer]

    def v(self, layer: int) -> torch.Tensor:
        return self.storage[1, layer]


class _States:
    """Plain tensors behind the memory state pool's accessor (``tensors(i)``)."""

    def __init__(self, num_states: int, spec: ModelSpec):
        self.storages = [torch.randn(num_states + 1, *shape) for shape in spec.state_shapes]

    def tensors(self, i: int) -> torch.Tensor:
        return self.storages[i]


def test_from_pools_runs_on_pool_storage() -> None:
    """A cache built from pool-shaped storage gives the same logits and writes into it."""
    spec = TINY_HYBRID
    kv, swa, states = _KV(2, NUM_SLOTS, spec), _KV(2, NUM_SLOTS, spec), _States(3, spec)
    seq = Seq(_HYBRID, seed=8)
    seq.cache = PagedCache.from_pools(spec, kv=kv, swa=swa, states=states)
    assert [t.shape[1:] for t in seq.cache.conv_states] == [spec.conv_state_shape] * 2
    logits = torch.cat([seq.step(0, 120), seq.step(120, SEQ_LEN)])
    assert torch.allclose(logits, _HYBRID_REFERENCE, atol=1e-5, rtol=0)
    assert torch.equal(kv.storage[0, 1, seq.slots[5]], seq.cache.full_k[1][seq.slots[5]])
    assert torch.equal(states.storages[1][1, 1], seq.cache.ssm_states[1][1])


def test_last_only_and_fresh_state_slot(model: HybridLM) -> None:
    """last_only returns the last row; a fresh state slot's old contents are ignored."""
    reference = Seq(model, seed=5).step(0, SEQ_LEN)
    seq = Seq(model, seed=5)
    for t in seq.cache.conv_states + seq.cache.ssm_states:
        t[2] = 1e3
    last = seq.step(0, SEQ_LEN, state_slot=2, last_only=True)
    assert last.shape == (1, model.spec.vocab_size)
    assert torch.allclose(last, reference[-1:], atol=1e-5, rtol=0)


@pytest.mark.parametrize("n, chunk_len", [(1, 4), (7, 4), (64, 16), (100, 32)])
def test_ssd_scan_matches_the_recurrence(n: int, chunk_len: int) -> None:
    """Chunked SSD equals the token-by-token recurrence h = exp(a) h + dt x b^T, y = h c."""
    gen = torch.Generator().manual_seed(n)
    heads, head_dim, state_dim = 3, 4, 5
    x = torch.randn(n, heads, head_dim, generator=gen, dtype=torch.float64)
    dt = torch.rand(n, heads, generator=gen, dtype=torch.float64)
    log_decay = -dt * torch.rand(heads, generator=gen, dtype=torch.float64) * 4
    b, c = (torch.randn(n, state_dim, generator=gen, dtype=torch.float64) for _ in range(2))
    h = torch.randn(heads, head_dim, state_dim, generator=gen, dtype=torch.float64)
    y, h_out = ssd_scan(x, dt, log_decay, b, c, h, chunk_len)
    for t in range(n):  # reference loop (test only)
        h = torch.exp(log_decay[t])[:, None, None] * h + (dt[t, :, None] * x[t])[..., None] * b[t]
        assert torch.allclose(y[t], h @ c[t], atol=1e-10)
    assert torch.allclose(h_out, h, atol=1e-10)


def _bad_inputs(seq: Seq) -> dict[str, ForwardInput]:
    base = ForwardInput(token_ids=seq.tokens[10:20], prefix_len=10, out_slots=seq.slots[10:20],
                        seq_slots=seq.slots[:20], swa_out_slots=seq.swa_slots[10:20],
                        swa_seq_slots=seq.swa_slots[:20], state_slot=1)
    r = dataclasses.replace
    far = seq.slots[10:20] + NUM_SLOTS
    return {
        "short out_slots": r(base, out_slots=seq.slots[10:19]),
        "int32 out_slots": r(base, out_slots=seq.slots[10:20].int()),
        "2-D seq_slots": r(base, seq_slots=seq.slots[:20].view(4, 5)),
        "seq_slots of wrong length": r(base, seq_slots=seq.slots[:19]),
        "seq tail != out_slots": r(base, seq_slots=seq.slots[1:21]),
        "slot out of range": r(base, out_slots=far, seq_slots=torch.cat([seq.slots[:10], far])),
        "negative slot": r(base, out_slots=-far, seq_slots=torch.cat([seq.slots[:10], -far])),
        "float tokens": r(base, token_ids=seq.tokens[10:20].float()),
        "token beyond vocab": r(base, token_ids=seq.tokens[10:20] + 10_000),
        "negative prefix_len": r(base, prefix_len=-1),
        "missing swa slots": r(base, swa_out_slots=None),
        "swa_seq_slots too short": r(base, swa_seq_slots=seq.swa_slots[5:20]),
        "missing state_slot": r(base, state_slot=None),
        "state_slot out of range": r(base, state_slot=99),
    }


@pytest.mark.parametrize("case", list(_bad_inputs(Seq(random_model(TINY_HYBRID), seed=6))))
def test_bad_inputs_raise_value_error(case: str) -> None:
    """Misshapen, mistyped or out-of-range inputs raise ValueError before touching pools."""
    seq = Seq(random_model(TINY_HYBRID), seed=6)
    with pytest.raises(ValueError):
        seq.model(_bad_inputs(seq)[case], seq.cache)


def test_cache_of_wrong_shape_raises_value_error() -> None:
    """A cache built for another layout (kv heads, layer count, dtype) is rejected."""
    model = random_model(TINY_HYBRID)
    seq = Seq(model, seed=7)
    inp = ForwardInput(token_ids=seq.tokens[:4], prefix_len=0, out_slots=seq.slots[:4],
                       seq_slots=seq.slots[:4], swa_out_slots=seq.swa_slots[:4],
                       swa_seq_slots=seq.swa_slots[:4], state_slot=1)
    other = dataclasses.replace(TINY_HYBRID, num_kv_heads=4)
    for cache in (PagedCache.allocate(other, num_slots=NUM_SLOTS, num_swa_slots=NUM_SLOTS,
                                      num_states=2),
                  dataclasses.replace(seq.cache, full_k=seq.cache.full_k[:1]),
                  dataclasses.replace(seq.cache, ssm_states=[t.double() for t in
                                                             seq.cache.ssm_states])):
        with pytest.raises(ValueError):
            model(inp, cache)


def test_load_model_and_spec() -> None:
    """load_model is deterministic; the spec sizes pools; fingerprints tell configs apart."""
    (a, tok), (b, _) = load_model("tiny-hybrid"), load_model("tiny-hybrid")
    assert all(torch.equal(x, y) for x, y in zip(a.state_dict().values(),
                                                  b.state_dict().values(), strict=True))
    spec: ModelSpec = a.spec
    assert spec.layer_ids(S_) == [1, 4] and spec.layer_ids(M_) == [2, 5]
    assert spec.conv_state_shape == (4 * 32 + 2 * 16, 3)
    assert spec.ssm_state_shape == (4, 32, 16)
    assert spec.state_shapes == ((2, 160, 3), (2, 4, 32, 16))
    assert spec.fingerprint() == TINY_HYBRID.fingerprint()
    assert spec.fingerprint() != dataclasses.replace(spec, sliding_window=32).fingerprint()
    assert isinstance(tok, ByteTokenizer) and tok.decode(tok.encode("héllo")) == "héllo"
    with pytest.raises(ValueError):
        load_model("gpt-5")


def test_chat_template_is_chatml() -> None:
    """The chat prompt is ChatML ending with the assistant header."""
    text = ByteTokenizer().chat_prompt([{"role": "system", "content": "Be brief."},
                                        {"role": "user", "content": "Hi"}])
    assert text == ("<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
                    "<|im_start|>assistant\n")
