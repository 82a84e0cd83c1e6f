"""A deterministic multi-turn chat workload for prefix-cache benchmarks (no model involved).

Owns request generation and its ideal hit rate. Imports nothing from the cache: any engine or
cache can replay the requests.
"""

from __future__ import annotations

import hashlib
import random
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True, slots=True, kw_only=True)
class WorkloadSpec:
    """Shape of the workload (defaults: the tree benchmark of issue 3).

    Conversations start from one of ``num_system_prompts`` shared system prompts, drawn with
    weight ``1 / (rank + 1)`` (a few hot, many cold). Turn k of a conversation sends the
    system prompt, every earlier user turn and reply, and a new user turn; the reply becomes
    part of the next turn's prompt. A conversation ends after its drawn number of turns, or
    when the next prompt plus reply would pass ``max_context`` tokens. ``num_active``
    conversations are open at once and the next request comes from one of them at random.
    """

    num_requests: int = 2000
    seed: int = 0
    num_system_prompts: int = 50
    system_len: tuple[int, int] = (200, 1200)
    first_turn_len: tuple[int, int] = (50, 2500)
    turn_len: tuple[int, int] = (20, 400)
    reply_len: tuple[int, int] = (20, 400)
    max_turns: int = 8
    max_context: int = 4096
    num_active: int = 32
    vocab_size: int = 128_000


@dataclass(frozen=True, slots=True)
class ChatRequest:
    """One request: the prompt the engine receives and the reply it will generate."""

    prompt: list[int]
    output: list[int]
    conv_id: int
    turn: int


class _Conversation:
    __slots__ = ("conv_id", "context", "turn", "num_turns")

    def __init__(self, conv_id: int, context: list[int], num_turns: int):
        self.conv_id = conv_id
        self.context = context
        self.turn = 0
        self.num_turns = num_turns


def make_workload(spec: WorkloadSpec | None = None) -> list[ChatRequest]:
    """Generate ``spec.num_requests`` requests; equal specs give equal lists."""
    spec = spec or WorkloadSpec()
    pick = random.Random(spec.seed)
    tokens_rng = np.random.default_rng(spec.seed)

    def tokens(bounds: tuple[int, int]) -> list[int]:
        count = pick.randint(*bounds)
        drawn: list[int] = tokens_rng.integers(0, spec.vocab_size, count).tolist()
        return drawn

    systems = [tokens(spec.system_len) for _ in range(spec.num_system_prompts)]
    weights = [1.0 / (rank + 1) for rank in range(spec.num_system_prompts)]
    next_id = 0

    def open_conversation() -> _Conversation:
        nonlocal next_id
        system = pick.choices(range(spec.num_system_prompts), weights)[0]
        next_id += 1
        return _Conversation(next_id - 1, list(systems[system]), pick.randint(1, spec.max_turns))

    active = [open_conversation() for _ in range(spec.num_active)]
    requests: list[ChatRequest] = []
    while len(requests) < spec.num_requests:
        slot = pick.randrange(spec.num_active)
        conv = active[slot]
        user = tokens(spec.first_turn_len if conv.turn == 0 else spec.turn_len)
        reply = tokens(spec.reply_len)
        prompt = conv.context + user
        if len(prompt) + len(reply) > spec.max_context:
            active[slot] = open_conversation()
            continue
        requests.append(ChatRequest(prompt, reply, conv.conv_id, conv.turn))
        conv.context = prompt + reply
        conv.turn += 1
        if conv.turn >= conv.num_turns:
            active[slot] = open_conversation()
    return requests


def ideal_hit_tokens(requests: list[ChatRequest], page_size: int) -> int:
    """Prompt tokens an unbounded cache could serve: per request, the longest whole-page
    prefix of its prompt that some earlier prompt + reply also started with."""
    seen: set[bytes] = set()
    hits = 0
    for req in requests:
        chain = _page_chain(req.prompt, page_size)
        for num_pages, digest in enumerate(chain):
            if digest not in seen:
                hits += num_pages * page_size
                break
        else:
            hits += len(chain) * page_size
        seen.update(_page_chain(req.prompt + req.output, page_size))
    return hits


def _page_chain(tokens: list[int], page_size: int) -> list[bytes]:
    whole = np.asarray(tokens[: len(tokens) // page_size * page_size], dtype="<u4")
    digests, prev = [], b""
    for page in whole.reshape(-1, page_size):
        prev = hashlib.blake2b(prev + page.tobytes(), digest_size=16).digest()
        digests.append(prev)
    return digests
