"""The cost model: expected time to first token of a request on a node, for each way of getting
its prefix (keep what the device holds, load from the store, copy from another node's device),
and the choice that minimises it. docs/routing.md derives every term.

Pure functions of their arguments (deterministic: tensor-parallel ranks given the same inputs
agree). Must not read clocks, stores or the tree.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Sequence
from dataclasses import dataclass

from radixlink.cost.estimates import Estimates, PrefillEstimate, TransferEstimate


class Source(str, enum.Enum):
    """Where the tokens after the device prefix come from before prefill starts."""

    DEVICE = "device"  # nothing is loaded: the device prefix, then recompute
    PEER = "peer"  # copied from another node's device
    STORE = "store"  # loaded from the shared store


HIDE = 0.5
"""The share of the expected queue wait a load may count on hiding behind (a node prefetches
while a request queues). Below 1 because the wait is an estimate: a load that outlasts the
real wait delays the request."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Offer:
    """A source that can restore the request's prefix up to any of ``lengths`` tokens.

    Attributes:
        source: PEER or STORE.
        lengths: absolute prefix lengths in tokens (not counting from the device prefix),
            ascending; lengths at or below the device prefix are ignored.
        transfer: the source's path into this node's device.
        step: when > 0, every length ``device_len + k * step`` up to ``max(lengths)`` is
            restorable too (a source holding whole pages: ``step`` = page size).
    """

    source: Source
    lengths: tuple[int, ...]
    transfer: TransferEstimate
    step: int = 0


@dataclass(frozen=True, slots=True, kw_only=True)
class Plan:
    """The cheapest way to serve one request on one node.

    A load starts when the node's link is free (``link_s``) and may overlap the wait for the
    device (``queue_s``), but only ``hide * queue_s`` of that wait is counted on::

        ttft_s = queue_s + max(0, link_s + load_s - hide * queue_s) + prefill_s

    so with an idle device (or ``hide = 0``) a load is chosen only when it beats recomputing
    on its own, and a tier slower than recompute is used only as far as the wait hides it.

    Attributes:
        source: where the tokens between ``device_len`` and ``prefix_len`` come from.
        device_len: tokens already on this node's device.
        prefix_len: tokens in place before prefill (device + loaded).
        load_s: the transfer's time (0 for DEVICE).
        prefill_s: the prefill of the rest.
        ttft_s: the expected time to first token.
    """

    source: Source
    device_len: int
    prefix_len: int
    load_s: float
    prefill_s: float
    ttft_s: float

    @property
    def load_len(self) -> int:
        """Tokens transferred."""
        return self.prefix_len - self.device_len


def prefill_rest_s(prefill: PrefillEstimate, prompt_len: int, prefix_len: int) -> float:
    """Prefill time of ``prompt_len`` tokens after a ``prefix_len`` prefix. The last prompt
    token is always computed (its logits give the first output token)."""
    cached = min(prefix_len, prompt_len - 1)
    return prefill.seconds(prompt_len - cached, cached)


def plan_ttft(*, prompt_len: int, device_len: int, offers: Sequence[Offer],
              estimates: Estimates, queue_s: float = 0.0, link_s: float = 0.0,
              hide: float = HIDE, behind: float = 0.0) -> Plan:
    """The plan with the lowest cost among: no load (device prefix, recompute the rest)
    and, per offer, each listed length plus (``step`` offers) the longest length whose load
    the counted wait hides. The cost is the expected TTFT plus ``behind * prefill_s``: the
    delay the request's compute adds to the ``behind`` requests expected to start on the node
    after it (0: its own TTFT alone). Ties keep the earlier candidate: no load first, then
    offers in the order given, shorter lengths first.

    Why these candidates suffice: past the hidden window each loaded token costs a constant
    transfer time while the compute it saves grows with its position, so the TTFT is concave
    in the length there and its minimum is at an end (docs/routing.md, "The choice").

    Args:
        prompt_len: prompt tokens (> 0).
        device_len: tokens of the prompt already on this node's device.
        offers: sources that can restore longer prefixes.
        estimates: prefill and bytes-per-token estimates (transfer paths come with offers).
        queue_s: expected wait until this node's device can start the request.
        link_s: expected wait until this node's transfer link is free.
        hide: share of ``queue_s`` a load may hide behind, in ``[0, 1]``.
        behind: requests expected to queue behind this one on the node (finite, >= 0;
            ``NodeLoad.behind`` estimates it). With a long queue, a load that saves compute
            is worth more than the request's own TTFT says, since every request behind it
            waits for that compute too.

    Raises:
        ValueError: ``prompt_len <= 0``, a device prefix outside ``[0, prompt_len]``,
            ``hide`` outside ``[0, 1]`` or ``behind`` negative or not finite.
    """
    if (prompt_len <= 0 or not 0 <= device_len <= prompt_len or not 0 <= hide <= 1
            or not 0 <= behind < math.inf):
        raise ValueError(f"need prompt_len > 0, 0 <= device_len <= prompt_len, 0 <= hide <= "
                         f"1 and a finite behind >= 0, got prompt_len={prompt_len}, "
                         f"device_len={device_len}, hide={hide}, behind={behind}")
    wait, link = max(queue_s, 0.0), max(link_s, 0.0)
    window = hide * wait - link  # transfer seconds that finish within the counted wait
    rest = prefill_rest_s(estimates.prefill, prompt_len, device_len)
    best = Plan(source=Source.DEVICE, device_len=device_len, prefix_len=device_len,
                load_s=0.0, prefill_s=rest, ttft_s=wait + rest)
    best_cost = best.ttft_s + behind * rest
    for offer in offers:
        for length in _candidates(offer, device_len, prompt_len, window, estimates):
            load = estimates.load_s(offer.transfer, length - device_len)
            rest = prefill_rest_s(estimates.prefill, prompt_len, length)
            ttft = wait + max(0.0, load - window) + rest
            cost = ttft + behind * rest
            if cost < best_cost:
                best_cost = cost
                best = Plan(source=offer.source, device_len=device_len, prefix_len=length,
                            load_s=load, prefill_s=rest, ttft_s=ttft)
    return best


def _candidates(offer: Offer, device_len: int, prompt_len: int, window: float,
                estimates: Estimates) -> list[int]:
    """The offer's lengths past the device prefix, plus the longest ``step`` length whose
    transfer fits in ``window`` seconds, ascending."""
    top = min(max(offer.lengths, default=0), prompt_len)
    out = {min(n, prompt_len) for n in offer.lengths if n > device_len}
    path, step = offer.transfer, offer.step
    if step > 0 and top > device_len and window > path.latency_s:
        fit = int((window - path.latency_s) * path.bytes_per_s
                  / (step * estimates.bytes_per_token))
        if fit > 0:
            out.add(min(device_len + fit * step, top))
    return sorted(out)


def choose_load_pages(restorable_pages: Sequence[int], *, device_len: int, page_size: int,
                      bytes_per_token: int, estimates: Estimates) -> int:
    """How many of the restorable store pages to load: the length that minimises the
    request's time to first token, possibly shorter than the largest, or 0 (recompute).

    Loading ``L`` pages costs ``store.seconds(L * page_size * bytes_per_token)`` and saves
    computing positions ``[device_len, device_len + L * page_size)``; the rest of the prompt
    costs the same either way, so the prompt length does not enter. Ties load fewer pages.
    With no store estimate (``estimates.store is None``) nothing is known against loading:
    the largest length is returned, as the linker did before the cost model.

    Args:
        restorable_pages: every tail length (pages, counted from the first device-uncached
            page) the store can restore, agreed across ranks (sparse; any order).
        device_len: tokens of the prefix already on the device (page aligned).
        page_size: tokens per page.
        bytes_per_token: KV bytes per token of this cache (all pools that are loaded).
        estimates: the current estimates (``prefill`` and ``store``).

    Returns:
        A member of ``restorable_pages``, or 0 = load nothing.

    Raises:
        ValueError: a non-positive page size or bytes per token, a negative device prefix.
    """
    if page_size <= 0 or bytes_per_token <= 0 or device_len < 0:
        raise ValueError(f"need page_size > 0, bytes_per_token > 0, device_len >= 0; got "
                         f"page_size={page_size}, bytes_per_token={bytes_per_token}, "
                         f"device_len={device_len}")
    lengths = sorted({int(p) for p in restorable_pages if p > 0})
    if not lengths:
        return 0
    store = estimates.store
    if store is None:
        return lengths[-1]
    best_pages, best_gain = 0, 0.0
    for pages in lengths:
        tokens = pages * page_size
        gain = (estimates.prefill.span_s(device_len, device_len + tokens)
                - store.seconds(tokens * bytes_per_token))
        if gain > best_gain:
            best_pages, best_gain = pages, gain
    return best_pages


def break_even_bytes_per_s(*, device_len: int, num_tokens: int, bytes_per_token: int,
                           prefill: PrefillEstimate, latency_s: float = 0.0) -> float:
    """The store bandwidth at which loading ``num_tokens`` after ``device_len`` takes exactly
    as long as recomputing them (faster loads win, slower lose); inf when even a free
    transfer cannot beat recomputing (the latency alone is longer)."""
    compute = prefill.span_s(device_len, device_len + num_tokens)
    if compute <= latency_s:
        return float("inf")
    return num_tokens * bytes_per_token / (compute - latency_s)
