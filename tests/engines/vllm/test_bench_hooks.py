"""`bench vllm`'s timed twin of the connector (``radixlink.bench.vllm_hooks``): one mark a
forward (its first layer's ``wait_for_layer_load``), none for a step without one, and the
connector's own hooks still run under it."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from .conftest import VLLM_MISSING  # noqa: E402, I001

pytest.importorskip("vllm", reason=VLLM_MISSING)

from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole  # noqa: E402

from radixlink.bench.vllm_hooks import TimedRadixlinkConnector  # noqa: E402
from radixlink.bench.vllm_versus import HOOK_LOG_ENV, _forward_starts  # noqa: E402
from radixlink.integrations.vllm.metadata import RadixlinkMetadata  # noqa: E402

from .harness import FULL_LAYERS, kv_cache_config, vllm_config  # noqa: E402


def test_the_timed_twin_marks_each_forward_once(
    model_dir: str, file_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = tmp_path / "forwards.log"
    monkeypatch.setenv(HOOK_LOG_ENV, str(log))
    connector = TimedRadixlinkConnector(vllm_config(model_dir, {"store": file_url}),
                                        KVConnectorRole.WORKER, kv_cache_config(16, False))
    try:
        before = time.time()
        steps = [FULL_LAYERS, (), FULL_LAYERS]  # NOTE: the middle step has no forward
        for layers in steps:
            connector.bind_connector_metadata(RadixlinkMetadata())
            connector.start_load_kv(None)
            for name in layers:
                connector.wait_for_layer_load(name)
            connector.clear_connector_metadata()
        marks = _forward_starts(log)
        assert len(marks) == 2, marks
        assert before <= marks[0] <= marks[1] <= time.time()
        assert connector.worker.transfer_results() == (set(), set(), set())
    finally:
        connector.shutdown()
