#!/usr/bin/env bash
# GPU check of the linker's data path (docs/benchmarks.md, "GPU check"). Not run by CI.
#
# Needs one CUDA GPU and a venv with a CUDA torch and radixlink (pip install -e .).
#   1. GB/s, medians of rounds, each next to cudaMemcpy (torch copy_) of the same bytes:
#      pool gather into pinned staging frames (device gather + one D2H copy) vs a D2H copy;
#      pool scatter from pinned frames (one H2D copy + device scatter), whole and layer by
#      layer, vs an H2D copy; device gather / scatter alone vs a device-to-device copy.
#   2. the pool and linker tests on CUDA: pytest -m gpu (gather/scatter, staging, an offload
#      and a layer-wise load with per-layer events).
# Pass: the tests pass; the printed ratios are the data-path figures for the issue note.
#
# Usage: PY=/path/to/python bash scripts/gpu/pools_check.sh [MiB]
set -euo pipefail

PY=${PY:-python}
MIB=${1:-256}
cd "$(dirname "$0")/../.."

"$PY" - "$MIB" <<'PYEOF'
import statistics, sys, time
import torch
from radixlink.pages.staging import StagingArena, frames_bytes, layout_frames
from radixlink.memory import KVLayout, KVPool
from radixlink.stores.codec import HEADER_BYTES

assert torch.cuda.is_available(), "no CUDA device"
mib = int(sys.argv[1])
dev = torch.device("cuda")
print(f"device: {torch.cuda.get_device_name(dev)}, torch {torch.__version__}, {mib} MiB")
rows = []
for name, layout in (
    ("SmolLM2 fp32 page 16", KVLayout(num_layers=30, num_kv_heads=3, head_dim=64,
                                      dtype=torch.float32, page_size=16)),
    ("Llama-3-8B bf16 page 16", KVLayout(num_layers=32, num_kv_heads=8, head_dim=128,
                                         dtype=torch.bfloat16, page_size=16)),
):
    n = max(1, (mib << 20) // layout.page_bytes)
    pool = KVPool(layout, (2 * n + 1) * layout.page_size, device=dev)
    raw = pool.storage.view(torch.uint8)
    raw.copy_(torch.randint(0, 256, raw.shape, dtype=torch.uint8, device=dev))
    pages = (torch.randperm(2 * n, device=dev)[:n] + 1)
    size = (n, layout.page_bytes, HEADER_BYTES + layout.page_bytes)
    buffer, view = StagingArena(pinned=True).acquire(frames_bytes([size]))
    frames = layout_frames(buffer, view, [size])[0]
    payloads = frames.payloads()
    nbytes = n * layout.page_bytes
    host = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
    dsrc = torch.empty(nbytes, dtype=torch.uint8, device=dev)
    ddst = torch.empty_like(dsrc)
    staged = pool.stage(payloads)
    cases = {
        "gather to pinned frames": lambda: pool.gather(pages, payloads),
        "D2H cudaMemcpy": lambda: host.copy_(dsrc, non_blocking=True),
        "scatter from pinned frames": lambda: pool.scatter(pages, payloads),
        "scatter layer by layer": lambda: [pool.scatter(pages, staged, l)
                                           for l in range(layout.num_layers)],
        "H2D cudaMemcpy": lambda: dsrc.copy_(host, non_blocking=True),
        "device scatter (staged)": lambda: pool.scatter(pages, staged),
        "D2D cudaMemcpy": lambda: ddst.copy_(dsrc),
    }
    times = {k: [] for k in cases}
    for _ in range(2):
        for fn in cases.values():
            fn()
    torch.cuda.synchronize()
    for _ in range(9):
        for k, fn in cases.items():
            torch.cuda.synchronize(); t = time.perf_counter(); fn(); torch.cuda.synchronize()
            times[k].append(time.perf_counter() - t)
    gbs = {k: nbytes / 1e9 / statistics.median(v) for k, v in times.items()}
    for case, base in (("gather to pinned frames", "D2H cudaMemcpy"),
                       ("scatter from pinned frames", "H2D cudaMemcpy"),
                       ("scatter layer by layer", "H2D cudaMemcpy"),
                       ("device scatter (staged)", "D2D cudaMemcpy")):
        rows.append((name, case, gbs[case], base, gbs[base], gbs[case] / gbs[base]))
print(f"{'layout':24} {'op':28} {'GB/s':>8} {'baseline':18} {'GB/s':>8} {'ratio':>6}")
for r in rows:
    print(f"{r[0]:24} {r[1]:28} {r[2]:8.2f} {r[3]:18} {r[4]:8.2f} {r[5]:6.2f}")
PYEOF

"$PY" -m pytest -q -m gpu -p no:cacheprovider tests/unit/test_allocator.py \
  tests/unit/test_insert_validation.py tests/unit/test_pool_staging.py \
  tests/integration/test_linker_cuda.py
