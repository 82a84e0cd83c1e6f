"""radixlink.metrics: Prometheus text of real cache / linker / store stats, and histograms (the
KV event queue: tests/unit/test_kv_events.py)."""

from __future__ import annotations

import re

import pytest
import serving
import torch

from radixlink.cache import UnifiedCache
from radixlink.config import CacheConfig
from radixlink.linker.core import ExternalCacheLinker
from radixlink.memory.layout import KVLayout
from radixlink.metrics import LatencyHistogram, collect, prometheus_text, render_text
from radixlink.stores.memory import MemoryStore

_SAMPLE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(.*)\})? (\S+)$')


def parse(text: str) -> tuple[dict[str, str], dict[tuple[str, frozenset[tuple[str, str]]], float]]:
    """A strict little parser of the text format: {family: type}, {(sample, labels): value}."""
    types: dict[str, str] = {}
    samples: dict[tuple[str, frozenset[tuple[str, str]]], float] = {}
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split(" ")
            types[name] = kind
        elif line.startswith("# HELP "):
            continue
        else:
            match = _SAMPLE.match(line)
            assert match, f"malformed sample line {line!r}"
            labels = frozenset(re.findall(r'(\w+)="((?:[^"\\]|\\.)*)"', match.group(3) or ""))
            key = (match.group(1), labels)
            assert key not in samples, f"duplicate sample {key}"
            samples[key] = float(match.group(4))
    return types, samples


def served_cache_and_linker() -> tuple[UnifiedCache, ExternalCacheLinker, MemoryStore]:
    """Node A offloads a prompt; node B loads it: both tiers have hits."""
    ps = 4
    layout = KVLayout(num_layers=1, num_kv_heads=1, head_dim=2, dtype=torch.float32,
                      page_size=ps)
    store = MemoryStore(1 << 20)
    caches = [UnifiedCache(CacheConfig(page_size=ps, num_tokens=64, kv_layout=layout,
                                       enable_external_cache_linker=True)) for _ in range(2)]
    linkers = [ExternalCacheLinker(c, store) for c in caches]
    tokens = list(range(10, 30))
    for cache, linker, req in zip(caches, linkers, ("a", "b")):
        serving.serve(cache, tokens, linker=linker, req_id=req)
        linker.flush()
    cache_b, linker_b = caches[1], linkers[1]
    linkers[0].close()
    return cache_b, linker_b, store


def test_real_stats_render_with_tier_hits_bytes_and_types() -> None:
    """Real cache, linker and store stats render as parseable text with per-tier hit tokens,
    bytes moved by direction and the right counter / gauge types."""
    cache, linker, store = served_cache_and_linker()
    text = prometheus_text(cache, linker, store, labels={"node": "b"}, use_client=False)
    device_hits = cache.stats()["hit_tokens"]
    assert device_hits == 0  # node b matched nothing on device; the linker's re-matches skip
    linker.close()
    types, samples = parse(text)
    node = ("node", "b")
    assert samples[("radixlink_hit_tokens_total", frozenset({node, ("tier", "store")}))] == 20
    device = ("radixlink_hit_tokens_total", frozenset({node, ("tier", "device")}))
    assert samples[device] == device_hits
    assert samples[("radixlink_bytes_moved_total",
                    frozenset({node, ("direction", "load")}))] == 20 * 2 * 2 * 4
    assert types["radixlink_hit_tokens_total"] == "counter"
    assert types["radixlink_cache_free_tokens"] == "gauge"
    assert types["radixlink_cache_evicted_tokens_total"] == "counter"
    assert types["radixlink_store_bytes"] == "gauge"
    assert all(dict(labels).get("node") == "b" for _, labels in samples)


def test_failures_by_phase_and_codec_misses_become_labels() -> None:
    """failures_<phase> keys become one family with a phase label; codec misses a reason."""
    linker = {"failures_load": 2, "failures_timeout": 1, "codec_misses": {"checksum": 3},
              "loads_in_flight": 4, "lookups": 9}
    types, samples = parse(render_text(collect(linker=linker)))
    assert samples[("radixlink_linker_failures_total", frozenset({("phase", "load")}))] == 2
    assert samples[("radixlink_linker_failures_total", frozenset({("phase", "timeout")}))] == 1
    assert samples[("radixlink_codec_misses_total", frozenset({("reason", "checksum")}))] == 3
    assert types["radixlink_linker_loads_in_flight"] == "gauge"
    assert types["radixlink_linker_lookups_total"] == "counter"


def test_latency_histogram_renders_cumulative_buckets() -> None:
    """Observed latencies land in cumulative le buckets ending at +Inf == count, with a sum."""
    hist = LatencyHistogram((0.001, 0.01, 0.1))
    for seconds in (0.0005, 0.001, 0.005, 0.05, 3.0):
        hist.observe(seconds)
    linker = {"load_seconds": hist.snapshot()}
    types, samples = parse(render_text(collect(linker=linker)))
    name = "radixlink_linker_load_seconds"
    assert types[name] == "histogram"
    buckets = {dict(labels)["le"]: value for (sample, labels), value in samples.items()
               if sample == name + "_bucket"}
    assert buckets == {"0.001": 2, "0.01": 3, "0.1": 4, "+Inf": 5}
    assert samples[(name + "_count", frozenset())] == 5
    assert samples[(name + "_sum", frozenset())] == pytest.approx(3.0565)


def test_label_values_are_escaped() -> None:
    """Quotes, backslashes and newlines in label values are escaped, so lines stay parseable."""
    text = render_text(collect(cache={"hit_tokens": 1}, labels={"node": 'a"b\\c\nd'}))
    assert 'node="a\\"b\\\\c\\nd"' in text
    assert len(text.splitlines()) == 3


def test_bad_histogram_bounds_raise() -> None:
    """Bounds must be strictly ascending."""
    with pytest.raises(ValueError, match="ascending"):
        LatencyHistogram((0.1, 0.1))


def test_prometheus_client_output_matches_when_installed() -> None:
    """With prometheus_client installed, its output parses to the same samples as ours."""
    pytest.importorskip("prometheus_client")
    stats = {"hit_tokens": 5, "free_tokens": 7, "page_size": 4}
    linker = {"failures_load": 1, "loaded_pages": 2, "load_seconds":
              LatencyHistogram((0.01,)).snapshot()}
    ours = parse(prometheus_text(stats, linker, use_client=False))[1]
    theirs = parse(prometheus_text(stats, linker, use_client=True))[1]
    assert {k: v for k, v in theirs.items() if not k[0].endswith("_created")} == ours
