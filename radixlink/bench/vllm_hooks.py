"""Timed twins of the two connectors that ``bench vllm`` compares (``vllm_versus``): each
marks, with the wall clock, the start of every forward of its worker (the step's first
``wait_for_layer_load``) in the file named by ``vllm_versus.HOOK_LOG_ENV``. The time from a
request's arrival to the first forward that computes it is the connector's share of its TTFT
(lookup, load, and for an asynchronous load the steps until vLLM schedules it again); the rest
is vLLM's forward and sampling, the same work for both connectors.

Loaded by vLLM in its engine processes through ``kv_connector_module_path``; nothing else
imports it (it imports vLLM's ``ExampleConnector``).
"""

from __future__ import annotations

import os
import time
from typing import Any

from vllm.distributed.kv_transfer.kv_connector.v1.example_connector import ExampleConnector

from radixlink.bench.vllm_versus import HOOK_LOG_ENV
from radixlink.integrations.vllm.connector import RadixlinkConnector


class _ForwardMarks:
    """Mixin: one line (``time.time()``) a forward, written when its first layer asks for
    its KV. ``bind_connector_metadata`` runs once a step, forward or not."""

    _in_forward = False

    def bind_connector_metadata(self, connector_metadata: Any) -> None:
        self._in_forward = False
        super().bind_connector_metadata(connector_metadata)  # type: ignore[misc]

    def wait_for_layer_load(self, layer_name: str) -> None:
        if not self._in_forward:
            self._in_forward = True
            path = os.environ.get(HOOK_LOG_ENV)
            if path:
                with open(path, "a") as f:
                    f.write(f"{time.time():.6f}\n")
        super().wait_for_layer_load(layer_name)  # type: ignore[misc]


class TimedRadixlinkConnector(_ForwardMarks, RadixlinkConnector):
    pass


class TimedExampleConnector(_ForwardMarks, ExampleConnector):
    pass
