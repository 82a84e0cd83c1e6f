#!/usr/bin/env bash
# Build .venv-sglang: a CPU-only venv with SGLang 0.5.23 for tests/engines/sglang.
#
# SGLang is installed with --no-deps (its declared deps pull CUDA wheels); only the light
# packages its cache modules import are added, each install constrained to the local CPU
# torch wheel, so pip can never swap in a CUDA torch. radixlink goes in editable, --no-deps,
# with its own runtime and test deps. Idempotent: a stamp holding the hash of this script and
# pyproject.toml makes a rerun a no-op; any change to either rebuilds.
#
# Usage: bash scripts/setup_sglang_venv.sh [VENV_DIR]   (default: <repo>/.venv-sglang)
set -euo pipefail

source "$(dirname "${BASH_SOURCE[0]}")/venv_common.sh"
if venv_begin "${1:-$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)/.venv-sglang}" sglang \
    "${BASH_SOURCE[0]}"; then
  echo "$VENV is up to date ($RECIPE)"
  exit 0
fi
venv_create

# radixlink's runtime and test deps.
pip_install numpy xxhash blake3 redis hiredis pytest hypothesis
# SGLang itself, none of its declared deps.
pip_install --no-deps "sglang==0.5.23"
# What SGLang's mem_cache import chain needs on CPU. Versions follow sglang 0.5.23's own pins
# where it has them. NOTE: triton and apache-tvm-ffi are imported at module level
# (memory_pool, sglang.kernels) even though no kernel runs on CPU; torchvision stays out
# (PyPI's build does not load beside torch 2.13.0+cpu; the test conftest stands in for it).
pip_install "transformers==5.19.0" "tokenizers==0.23.2" "sentencepiece==0.2.1" \
  "openai==2.8.0" "compressed-tensors==0.18.0" "apache-tvm-ffi==0.1.11" "triton==3.8.0" \
  msgspec orjson pyzmq pydantic psutil pybase64 requests packaging pillow starlette \
  IPython dill partial_json_parser gguf aiohttp
pip_install --no-deps -e "$ROOT"

# Warm SGLang's native page-hash extension (a torch C++ JIT build, ~10 s) into the venv, so
# the first test does not pay for it. The conftest points TORCH_EXTENSIONS_DIR at the same place.
TORCH_EXTENSIONS_DIR=$VENV/torch-extensions "$PY" - <<'PYEOF'
import importlib.util, sys, types
spec = importlib.util.find_spec("sglang")
pkg = types.ModuleType("sglang")  # skip sglang/__init__ (frontend API), as the conftest does
pkg.__path__ = list(spec.submodule_search_locations)
sys.modules["sglang"] = pkg
from sglang.srt.mem_cache.cpp_utils.native_hash import get_native_hash
assert len(get_native_hash([1, 2, 3, 4], None, 4)) == 1
PYEOF

venv_done
echo "built $VENV in $((SECONDS - START)) s"
