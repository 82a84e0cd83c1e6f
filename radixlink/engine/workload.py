"""A deterministic multi-turn chat workload of real text (CPython's ``pydoc_data`` topics, shipped
with the interpreter) with shared system prompts, and its routing over engine nodes.

Owns the conversation scripts, prompt construction from token ids and the turn -> node routing.
Must not run a model or touch a cache.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass
from pydoc_data.topics import topics as _TOPICS

from radixlink.engine.weights import ChatTokenizer, chatml

_INSTRUCTION = (
    "You are a concise Python documentation assistant. Answer the user's questions using "
    "only the reference text below; quote names exactly and keep answers short.\n\n"
)


@dataclass(frozen=True, slots=True, kw_only=True)
class WorkloadSpec:
    """Shape of the chat workload.

    Attributes:
        num_conversations: conversations; conversation c uses system prompt
            ``c % num_system_prompts``.
        num_turns: user turns per conversation.
        num_system_prompts: distinct system prompts (each with its own reference text).
        context_tokens: tokens of reference text in each system prompt (for the tokenizer
            the workload is built with).
        excerpt_chars: characters of quoted documentation in each follow-up question.
        seed: picks the topics; the same spec gives the same text everywhere.
    """

    num_conversations: int = 4
    num_turns: int = 3
    num_system_prompts: int = 2
    context_tokens: int = 1100
    excerpt_chars: int = 200
    seed: int = 0

    def __post_init__(self) -> None:
        for name in ("num_conversations", "num_turns", "num_system_prompts", "context_tokens",
                     "excerpt_chars"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"WorkloadSpec.{name} must be a positive int, got {value!r}")


@dataclass(frozen=True, slots=True, kw_only=True)
class Conversation:
    """One scripted conversation: a shared system prompt and the user's turns."""

    conv_id: int
    system_id: int
    system: str
    user_turns: tuple[str, ...]


def _title(name: str) -> str:
    """The first line of a topic's text (e.g. 'The "assert" statement')."""
    return _TOPICS[name].strip().splitlines()[0].strip()


def _cut(text: str, num_chars: int) -> str:
    """``text`` cut to at most ``num_chars``, at a line end when one is close."""
    if len(text) <= num_chars:
        return text
    head = text[:num_chars]
    end = head.rfind("\n")
    return head[:end] if end > num_chars // 2 else head


def _system_prompt(tokenizer: ChatTokenizer, names: Sequence[str], num_tokens: int) -> str:
    """The instruction and about ``num_tokens`` tokens of the named topics' text, cut at a
    line end."""
    text = ""
    for name in names:  # NOTE: BPE makes ~4 characters a token; stop once surely long enough
        text += _TOPICS[name].strip() + "\n\n"
        if len(text) > 8 * num_tokens:
            break
    body = tokenizer.decode(tokenizer.encode(text)[:num_tokens])
    return _INSTRUCTION + _cut(body, len(body) - 1).rstrip()


def build_workload(spec: WorkloadSpec, tokenizer: ChatTokenizer) -> list[Conversation]:
    """The conversations of ``spec``: same spec and tokenizer, same text (for one CPython
    version)."""
    rng = random.Random(spec.seed)
    names = sorted(_TOPICS)
    systems = []
    for _ in range(spec.num_system_prompts):
        picked = rng.sample(names, len(names))
        systems.append((picked, _system_prompt(tokenizer, picked, spec.context_tokens)))
    out = []
    for c in range(spec.num_conversations):
        system_id = c % spec.num_system_prompts
        picked, system = systems[system_id]
        turns = [f"In two sentences: what does the reference say about {_title(picked[0])}?"]
        for _ in range(1, spec.num_turns):
            other = rng.choice(names)
            excerpt = _cut(_TOPICS[other].strip(), spec.excerpt_chars)
            turns.append(f"Here is another excerpt, from {_title(other)}:\n\n{excerpt}\n\n"
                         "How does it relate to the reference? Answer in one sentence.")
        out.append(Conversation(conv_id=c, system_id=system_id, system=system,
                                user_turns=tuple(turns)))
    return out


def turn_prompt(tokenizer: ChatTokenizer, conv: Conversation, turn: int,
                history: Sequence[int] = ()) -> list[int]:
    """Token ids of ``conv``'s prompt at ``turn``.

    Turn 0 is the chat template of [system, user]. Turn k > 0 extends ``history`` (turn k-1's
    prompt + its reply ids, end-of-sequence excluded) by closing the reply and appending the
    new user turn, so every prompt is an exact token prefix of the next one.

    Raises:
        ValueError: a turn out of range, or a follow-up turn without history.
    """
    if not 0 <= turn < len(conv.user_turns):
        raise ValueError(f"turn {turn} out of range: conversation {conv.conv_id} has "
                         f"{len(conv.user_turns)} turns")
    user = {"role": "user", "content": conv.user_turns[turn]}
    if turn == 0:
        return tokenizer.encode(chatml([{"role": "system", "content": conv.system}, user]))
    if not history:
        raise ValueError("a follow-up turn needs the previous prompt and reply as history")
    return [*history, *tokenizer.encode("<|im_end|>\n" + chatml([user]))]


def route(conv_id: int, turn: int, num_nodes: int) -> int:
    """The node serving ``turn`` of ``conv_id``: consecutive turns land on different nodes."""
    if num_nodes <= 0:
        raise ValueError(f"num_nodes must be positive, got {num_nodes}")
    return (conv_id + turn) % num_nodes


def schedule(num_conversations: int, num_turns: int,
             num_nodes: int) -> list[list[tuple[int, int, int]]]:
    """Rounds of ``(node, conv_id, turn)``: round k holds turn k of every conversation. Turns
    of a round are independent (nodes run them in parallel); a round starts after the previous
    one finished, since a turn's prompt contains the previous reply."""
    return [[(route(c, k, num_nodes), c, k) for c in range(num_conversations)]
            for k in range(num_turns)]
