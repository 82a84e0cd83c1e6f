"""Helpers of the real-SGLang suite: prompts with a long shared prefix, the independent
reference (HF transformers' greedy outputs on the same weights), serving one request at a time,
and where SGLang says a request's prompt tokens came from. Store damage is the vLLM suite's
(``damage``: through the store's own primitives, on a real directory).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path
from pydoc_data.topics import topics
from typing import Any

from ..vllm_cpu.kit import damage  # noqa: F401 - re-exported: one home for store damage

PAGE = 16  # tokens per page, SGLang's and the store's (EngineSpec.page_size)
NEW_TOKENS = 16
PREFIX_LEN = 500  # the common prefix of a prompt set, in tokens
PROMPT_LEN = 620  # every prompt's length: 38 whole pages, 31 of them shared
SHARED_PAGES = PREFIX_LEN // PAGE

# The prompt sets of the suite, by name: builder kwargs. The baseline (conftest) computes each
# set's reference outputs once, one request at a time, as every test serves them. NOTE: sized
# for CI time: a 2-core machine prefills about 500 tokens a second (HF and SGLang alike).
PROMPT_SETS: dict[str, dict[str, int]] = {
    "shared": {},
    "servers": {"num": 2, "seed": 2},
}
# model fixture -> (prompt text, what the greedy answer starts with): the reference engine's
# known answers
KNOWN_ANSWERS: dict[str, tuple[str, str]] = {
    "smollm2": ("The capital of France is", " Paris"),
    "gemma3": ("Question: What is the capital of France?\nAnswer:", " Paris"),
}


def tokenizer_of(model_dir: str) -> Any:
    from tokenizers import Tokenizer

    return Tokenizer.from_file(str(Path(model_dir) / "tokenizer.json"))


def _text_ids(tokenizer: Any, names: list[str], num_tokens: int, *, first: bool) -> list[int]:
    text = ""
    for name in names:
        text += topics[name].strip() + "\n\n"
        # NOTE: only the prompt's first piece gets the tokenizer's BOS (Gemma's)
        ids = tokenizer.encode(text, add_special_tokens=first).ids
        if len(ids) >= num_tokens:
            return list(ids[:num_tokens])
    raise AssertionError(f"not enough text for {num_tokens} tokens")


def shared_prefix_prompts(tokenizer: Any, *, num: int = 4, prefix_len: int = PREFIX_LEN,
                          total_len: int = PROMPT_LEN, seed: int = 0) -> list[list[int]]:
    """``num`` prompts of real text sharing their first ``prefix_len`` tokens (a reference
    document), then a different excerpt each; the same arguments give the same ids."""
    names = sorted(topics)
    prefix = _text_ids(tokenizer, names[seed::7], prefix_len, first=True)
    return [prefix + _text_ids(tokenizer, names[seed + 3 * i + 1::11], total_len - prefix_len,
                               first=False) for i in range(num)]


def prompt_set(model_dir: str, name: str) -> list[list[int]]:
    return shared_prefix_prompts(tokenizer_of(model_dir), **PROMPT_SETS[name])


def known_answer_prompt(model_dir: str, fixture: str) -> list[int]:
    return list(tokenizer_of(model_dir).encode(KNOWN_ANSWERS[fixture][0]).ids)


def whole_pages(prompt: Sequence[int]) -> int:
    """Pages SGLang can take from a cache for ``prompt``: whole pages, keeping one token to
    compute."""
    return (len(prompt) - 1) // PAGE


def store_pages(url: str) -> int:
    """Pages the store holds (every pool, every key)."""
    from radixlink.stores import open_store

    with open_store(url) as store:
        return sum(1 for _ in store.scan())


def wait_for_pages(url: str, num: int, timeout_s: float = 60.0) -> None:
    """Until the store holds ``num`` pages: an engine's offloads finish after its reply."""
    deadline = time.monotonic() + timeout_s
    while (held := store_pages(url)) != num:
        assert time.monotonic() < deadline, f"the store holds {held} pages, not {num}"
        time.sleep(0.2)


def expected_store_tokens(prompts: Sequence[list[int]]) -> list[int]:
    """Per prompt of the "shared" set served one by one, the tokens a fresh process takes from
    the store: every whole page of the first prompt; for the others, the pages past the shared
    prefix its device tree already holds."""
    return [whole_pages(p) * PAGE if i == 0 else (whole_pages(p) - SHARED_PAGES) * PAGE
            for i, p in enumerate(prompts)]


def stored_pages(prompts: Sequence[list[int]], outs: Sequence[list[int]]) -> int:
    """Pages a saver offloads for a prompt set served one by one, given its outputs: SGLang's
    tree keeps a finished request's prompt and output (the last output token has no KV yet),
    so every whole page of those, with the shared prefix once."""
    kept = [(len(p) + len(o) - 1) // PAGE for p, o in zip(prompts, outs, strict=True)]
    return kept[0] + sum(k - SHARED_PAGES for k in kept[1:])


def serve(node: Any, prompts: Sequence[list[int]], new_tokens: int = NEW_TOKENS) -> list[Any]:
    """One request at a time (each request's counters are then its own): ``engines.Served``."""
    return [node.generate([p], new_tokens)[0] for p in prompts]


def outputs(served: Sequence[Any]) -> list[list[int]]:
    return [s.output_ids for s in served]


def hf_greedy(model_dir: str, prompts: Sequence[Sequence[int]],
              new_tokens: int) -> list[list[int]]:  # fmt: skip
    """Greedy continuations of ``prompts`` by HF transformers in fp32, one prompt at a time,
    cut after the first end-of-sequence token (SGLang stops there too and returns it)."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32,
                                                 attn_implementation="eager")
    model.eval()
    eos = model.generation_config.eos_token_id
    stop = set(eos if isinstance(eos, list) else [] if eos is None else [eos])
    out = []
    with torch.inference_mode():
        for prompt in prompts:
            ids = torch.tensor([list(prompt)], dtype=torch.long)
            gen = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                                 max_new_tokens=new_tokens,
                                 pad_token_id=model.config.pad_token_id or 0)
            tokens = gen[0, len(prompt):].tolist()
            cut = next((i + 1 for i, t in enumerate(tokens) if t in stop), len(tokens))
            out.append(tokens[:cut])
    del model
    return out


def degenerate(output: Sequence[int]) -> bool:
    """No output, or one token repeated (the token-0 export's ``[0, 0, ...]``)."""
    return len(set(output)) <= 1


class Server:
    """``python -m sglang.launch_server`` on a free loopback port with ``EngineSpec``'s flags
    (``engines.launch_args``), answering HTTP; stopped by PID (its whole process group).

    Args:
        spec: the engine (``engines.EngineSpec``).
        log_path: the server's own output.
        start_timeout_s: how long it may take to answer ``/health``.
    """

    def __init__(self, spec: Any, log_path: Path, start_timeout_s: float = 600.0) -> None:
        import socket
        import subprocess
        import sys

        from radixlink.integrations.sglang.engines import engine_env, launch_args

        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            self.port = sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = log_path
        self._log = open(log_path, "w")  # noqa: SIM115 - closed by close()
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "sglang.launch_server", *launch_args(spec),
             "--host", "127.0.0.1", "--port", str(self.port), "--skip-server-warmup"],
            stdout=self._log, stderr=subprocess.STDOUT, env=engine_env(spec),
            start_new_session=True)
        deadline = time.monotonic() + start_timeout_s
        while not self._healthy():
            if self._proc.poll() is not None or time.monotonic() > deadline:
                tail = self.log_tail()
                self.close()
                raise AssertionError(f"sglang.launch_server did not start:\n{tail}")
            time.sleep(1.0)

    def generate(self, prompt: list[int], new_tokens: int = NEW_TOKENS) -> dict[str, Any]:
        """POST /generate (SGLang's native API) with token ids, greedy; the JSON reply."""
        import json
        import urllib.request

        body = json.dumps({"input_ids": prompt, "sampling_params": {
            "temperature": 0.0, "max_new_tokens": new_tokens}}).encode()
        req = urllib.request.Request(f"{self.url}/generate", data=body,
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=600) as resp:
            return json.loads(resp.read())

    def log_tail(self, num_lines: int = 40) -> str:
        self._log.flush()
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-num_lines:])

    def close(self) -> None:
        """SIGTERM to the server's process group; SIGKILL past 30 s. Idempotent."""
        import os
        import signal
        import subprocess

        for sig, wait_s in ((signal.SIGTERM, 30.0), (signal.SIGKILL, 30.0)):
            try:
                os.killpg(self._proc.pid, sig)
            except ProcessLookupError:
                break
            try:
                self._proc.wait(wait_s)
                if sig == signal.SIGTERM:
                    os.killpg(self._proc.pid, signal.SIGKILL)  # stragglers in the group
            except (subprocess.TimeoutExpired, ProcessLookupError):
                continue
            break
        self._log.close()

    def _healthy(self) -> bool:
        import urllib.error
        import urllib.request

        try:
            with urllib.request.urlopen(f"{self.url}/health", timeout=5) as resp:
                return resp.status == 200
        except (urllib.error.URLError, OSError):
            return False
