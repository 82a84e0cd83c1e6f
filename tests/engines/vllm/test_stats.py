"""The connector's counters through vLLM's own connector-stats path (worker and scheduler stats,
summed by vLLM, logged as "KV Transfer metrics" and exported as Prometheus counters), and
vLLM's external-token count corrected after a failed load."""

from __future__ import annotations

import pytest

from .conftest import VLLM_MISSING  # noqa: E402, I001

pytest.importorskip("vllm", reason=VLLM_MISSING)

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram  # noqa: E402
from vllm.distributed.kv_transfer.kv_connector.v1.metrics import (  # noqa: E402
    KVConnectorLogging,
    KVConnectorProm,
)

from radixlink.integrations.vllm import RadixlinkConnector  # noqa: E402

from .harness import BLOCK  # noqa: E402
from .test_failures import _flip_payload_byte  # noqa: E402
from .test_round_trip import _first_run, _prompt  # noqa: E402


def _registry_bound(registry: CollectorRegistry) -> type[KVConnectorProm]:
    """vLLM's ``KVConnectorProm`` with its metrics in ``registry`` (not the global one)."""

    def bound(cls: type) -> type:
        return type(cls.__name__, (cls,), {"__init__": lambda self, *a, **k: cls.__init__(
            self, *a, registry=registry, **k)})  # fmt: skip

    return type("Prom", (KVConnectorProm,), {"_counter_cls": bound(Counter),
                                             "_gauge_cls": bound(Gauge),
                                             "_histogram_cls": bound(Histogram)})  # fmt: skip


def test_stats_reach_vllms_stat_logger_and_prometheus(nodes, model_dir, file_url):
    """A 6-page hit: vLLM's scheduler stats carry the workers' load counters and the
    scheduler's lookup counters; vLLM's ``KVConnectorLogging`` logs them and its
    ``KVConnectorProm`` (built through ``build_prom_metrics``) exports them as counters."""
    prompt = _prompt(70, 100)
    node1 = nodes(model_dir, file_url)
    node1.add("a", prompt)
    node1.run()
    assert node1.connector_stats["saved_pages"] == 6
    node2 = nodes(model_dir, file_url)
    node2.add("b", prompt)
    node2.run()
    stats = node2.connector_stats
    assert (stats["loaded_pages"], stats["fetched_pages"], stats["hit_pages"]) == (6, 6, 6)
    assert stats["lookups"] >= 1 and "failed_loads" not in stats

    config = node2.config
    logging = KVConnectorLogging(config.kv_transfer_config)
    assert logging.connector_cls is RadixlinkConnector
    logging.observe(stats)
    lines: list[str] = []
    logging.log(log_fn=lambda fmt, *args: lines.append(fmt % args))
    assert lines and "loaded_pages=6" in lines[0] and "fetched_pages=6" in lines[0], lines

    registry = CollectorRegistry()
    prom = _registry_bound(registry)(config, ["model_name", "engine"], {0: ["m", "0"]})
    prom.observe(stats, 0)
    prom.observe({"loaded_pages": 2}, 0)
    labels = {"model_name": "m", "engine": "0"}
    assert registry.get_sample_value("vllm:radixlink_loaded_pages_total", labels) == 8
    assert registry.get_sample_value("vllm:radixlink_hit_pages_total", labels) == 6
    assert registry.get_sample_value("vllm:radixlink_failed_loads_total", labels) == 0


def test_a_failed_load_takes_its_recomputed_tokens_off_vllms_external_count(nodes, model_dir,
                                                                            file_url):
    """vLLM counts a planned load's 96 tokens as external at admission; page 3 is corrupt, so
    48 of them are recomputed: the request's prefill stats (``prompt_tokens_by_source``) say
    48 external tokens, and the connector counts 48 ``unloaded_tokens``. A clean load keeps
    its count."""
    prompt = _prompt(71, 100)
    node1 = nodes(model_dir, file_url)
    node1.add("a", prompt)
    node1.run()
    node2 = nodes(model_dir, file_url)
    req = node2.add("b", prompt)
    _flip_payload_byte(file_url, node2.connector.scheduler_side.page_keys(req, 6)[3])
    assert _first_run(node2, "b") == (3 * BLOCK, 100 - 3 * BLOCK)
    node2.run()
    assert node2.external_tokens["b"] == 3 * BLOCK
    assert node2.connector_stats["unloaded_tokens"] == 3 * BLOCK
    node3 = nodes(model_dir, file_url)  # the page was healed
    node3.add("c", prompt)
    node3.run()
    assert node3.external_tokens["c"] == 6 * BLOCK
    assert "unloaded_tokens" not in node3.connector_stats
