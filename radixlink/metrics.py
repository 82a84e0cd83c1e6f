"""Observability: ``cache.stats()``, ``linker.stats()`` and ``store.stats()`` as Prometheus text,
and latency histograms (docs/benchmarks.md, Observability). KV events live in ``kvevents``.

Owns metric names and rendering only: it reads plain stat dicts and never reaches into the
cache, linker or stores. Uses ``prometheus_client`` when installed, else a built-in renderer.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

PREFIX = "radixlink"
DEFAULT_BOUNDS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
                  5.0, 10.0)
_CACHE_COUNTERS = frozenset({"match_calls", "match_tokens", "insert_calls"})
_LINKER_GAUGES = frozenset({"inflight_offload_bytes", "loads_in_flight", "pending_transfers",
                            "loads_waiting", "unclaimed_outcomes", "lookups_remembered",
                            "lookup_bytes_remembered", "store_breaker_open"})
# NOTE: failures by phase come from "failures_*" keys; these count store calls of every phase.
_STORE_GAUGES = frozenset({"pages", "bytes", "capacity_bytes"})
Labels = tuple[tuple[str, str], ...]


class LatencyHistogram:
    """Fixed-bucket latency histogram (seconds). Not thread-safe: observe from one thread.

    Args:
        bounds: ascending upper bounds of the finite buckets.
    """

    def __init__(self, bounds: Sequence[float] = DEFAULT_BOUNDS):
        if not bounds or any(b <= a for a, b in zip(bounds, bounds[1:])):
            raise ValueError(f"bounds must be non-empty and strictly ascending, got {bounds}")
        self.bounds = tuple(float(b) for b in bounds)
        self._counts = [0] * (len(self.bounds) + 1)
        self._sum = 0.0

    def observe(self, seconds: float) -> None:
        self._counts[bisect.bisect_left(self.bounds, seconds)] += 1
        self._sum += seconds

    def snapshot(self) -> dict[str, Any]:
        """``{"buckets": [[le, cumulative count], ..., [inf, count]], "sum", "count"}``: the
        shape ``render`` draws as a histogram when it is a stats value."""
        cumulative, running = [], 0
        for le, n in zip((*self.bounds, math.inf), self._counts):
            running += n
            cumulative.append([le, running])
        return {"buckets": cumulative, "sum": self._sum, "count": running}


@dataclass(slots=True)
class MetricFamily:
    """One metric: name (without ``_total``), type, help, and samples.

    ``samples`` holds ``(labels, value)`` for counters and gauges and ``(labels, snapshot)``
    for histograms (a ``LatencyHistogram.snapshot()``).
    """

    name: str
    kind: str  # "counter" | "gauge" | "histogram"
    help: str
    samples: list[tuple[Labels, Any]] = field(default_factory=list)


class _Families:
    def __init__(self, labels: Mapping[str, str]):
        self.labels: Labels = tuple((str(k), str(v)) for k, v in labels.items())
        self.by_name: dict[str, MetricFamily] = {}

    def add(self, name: str, kind: str, help_text: str, value: Any, **labels: str) -> None:
        fam = self.by_name.setdefault(name, MetricFamily(f"{PREFIX}_{name}", kind, help_text))
        assert fam.kind == kind, f"metric {name} is both {fam.kind} and {kind}"
        fam.samples.append((self.labels + tuple(labels.items()), value))


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _is_histogram(value: Any) -> bool:
    return isinstance(value, Mapping) and {"buckets", "sum", "count"} <= value.keys()


def collect(cache: Mapping[str, Any] | None = None, linker: Mapping[str, Any] | None = None,
            store: Mapping[str, Any] | None = None, labels: Mapping[str, str] | None = None
            ) -> list[MetricFamily]:
    """Metric families from stat dicts (any may be None).

    Per-tier hits are ``radixlink_hit_tokens_total{tier="device"|"store"}`` (store tokens =
    the linker's ``loaded_tokens``, else loaded pages x the cache's page size), bytes moved
    ``radixlink_bytes_moved_total{direction="load"|"offload"}``, failures
    ``radixlink_linker_failures_total{phase=...}``, and every ``*_seconds`` histogram
    snapshot in the linker's stats a histogram.
    """
    out = _Families(labels or {})
    page_size = int((cache or {}).get("page_size", 0))
    for key, value in (cache or {}).items():
        if key == "hit_tokens":
            out.add("hit_tokens", "counter", "Prompt tokens served from a tier.", value,
                    tier="device")
        elif _is_number(value):
            counter = key in _CACHE_COUNTERS or "evicted" in key
            out.add(f"cache_{key}", "counter" if counter else "gauge", f"cache.stats()['{key}']",
                    value)
    for key, value in (linker or {}).items():
        if key.startswith("failures_") and _is_number(value):
            out.add("linker_failures", "counter", "Linker failures by phase.", value,
                    phase=key.removeprefix("failures_"))
        elif key in ("loaded_bytes", "offloaded_bytes"):
            out.add("bytes_moved", "counter", "Page bytes moved between device and store.",
                    value, direction="load" if key == "loaded_bytes" else "offload")
        elif key == "codec_misses" and isinstance(value, Mapping):
            for reason, n in sorted(value.items()):
                out.add("codec_misses", "counter", "Store pages read as misses, by reason.", n,
                        reason=str(reason))
        elif key.endswith("_seconds") and _is_histogram(value):
            out.add(f"linker_{key}", "histogram", f"linker.stats()['{key}']", value)
        elif _is_number(value):
            kind = "gauge" if key in _LINKER_GAUGES else "counter"
            out.add(f"linker_{key}", kind, f"linker.stats()['{key}']", value)
    if linker is not None and "loaded_tokens" in linker:
        out.add("hit_tokens", "counter", "Prompt tokens served from a tier.",
                int(linker["loaded_tokens"]), tier="store")
    elif linker is not None and page_size and "loaded_pages" in linker:
        out.add("hit_tokens", "counter", "Prompt tokens served from a tier.",
                int(linker["loaded_pages"]) * page_size, tier="store")
    for key, value in (store or {}).items():
        if _is_number(value):
            kind = "gauge" if key in _STORE_GAUGES else "counter"
            out.add(f"store_{key}", kind, f"store.stats()['{key}']", value)
    return list(out.by_name.values())


def _num(value: float) -> str:
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return "NaN" if math.isnan(value) else repr(float(value))


def _escape(value: str) -> str:
    return value.replace("\\", r"\\").replace('"', r"\"").replace("\n", r"\n")


def _labels(labels: Iterable[tuple[str, str]]) -> str:
    parts = [f'{k}="{_escape(v)}"' for k, v in labels]
    return "{" + ",".join(parts) + "}" if parts else ""


def render_text(families: Iterable[MetricFamily]) -> str:
    """The Prometheus text exposition format (0.0.4) of ``families``, without any library."""
    lines: list[str] = []
    for fam in families:
        name = fam.name + "_total" if fam.kind == "counter" else fam.name
        doc = fam.help.replace("\\", r"\\").replace("\n", r"\n")
        lines += [f"# HELP {name} {doc}", f"# TYPE {name} {fam.kind}"]
        for labels, value in fam.samples:
            if fam.kind != "histogram":
                lines.append(f"{name}{_labels(labels)} {_num(value)}")
                continue
            for le, count in value["buckets"]:
                lines.append(f"{name}_bucket{_labels((*labels, ('le', _num(le))))} "
                             f"{_num(count)}")
            lines.append(f"{name}_count{_labels(labels)} {_num(value['count'])}")
            lines.append(f"{name}_sum{_labels(labels)} {_num(value['sum'])}")
    return "\n".join(lines) + "\n" if lines else ""


def _render_with_client(families: list[MetricFamily]) -> str:
    from prometheus_client import CollectorRegistry, generate_latest
    from prometheus_client.core import (
        CounterMetricFamily,
        GaugeMetricFamily,
        HistogramMetricFamily,
    )

    kinds = {"counter": CounterMetricFamily, "gauge": GaugeMetricFamily,
             "histogram": HistogramMetricFamily}

    class _Collector:
        def collect(self) -> Iterable[Any]:
            for fam in families:
                names = [k for k, _ in fam.samples[0][0]] if fam.samples else []
                metric = kinds[fam.kind](fam.name, fam.help, labels=names)
                for labels, value in fam.samples:
                    values = [v for _, v in labels]
                    if fam.kind == "histogram":
                        buckets = [(_num(le), n) for le, n in value["buckets"]]
                        metric.add_metric(values, buckets=buckets, sum_value=value["sum"])
                    else:
                        metric.add_metric(values, value)
                yield metric

    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Collector())
    return str(generate_latest(registry).decode("utf-8"))


def prometheus_text(cache: Any = None, linker: Any = None, store: Any = None,
                    labels: Mapping[str, str] | None = None, *,
                    use_client: bool | None = None) -> str:
    """Prometheus text of ``cache.stats()``, ``linker.stats()`` and ``store.stats()``.

    Args:
        cache, linker, store: objects with ``stats()`` (or their stat dicts), or None.
        labels: constant labels on every sample (e.g. ``{"node": "0"}``).
        use_client: force (True) or avoid (False) ``prometheus_client``; None = when installed.
    """
    def stats(obj: Any) -> Mapping[str, Any] | None:
        return obj if obj is None or isinstance(obj, Mapping) else obj.stats()

    families = collect(stats(cache), stats(linker), stats(store), labels)
    if use_client is None:
        try:
            import prometheus_client  # noqa: F401
        except ImportError:
            use_client = False
        else:
            use_client = True
    return _render_with_client(families) if use_client else render_text(families)
