#!/usr/bin/env bash
# Build the CPU venv in which radixlink's vLLM connector tests and bench run: .venv-vllm/.
#
# torch==2.13.0 is the local CPU wheel; every later install is constrained to it so pip can never
# swap in a CUDA build. vLLM 0.33.0 goes in with --no-deps (its declared deps pull CUDA wheels);
# only the light packages that its scheduler, KV cache manager, config and connector modules
# import are added. radixlink itself is installed editable, also --no-deps.
#
# Usage: bash scripts/setup_vllm_venv.sh [VENV=.venv-vllm]
# Idempotent: a stamp file records the recipe; a second run with the same recipe exits at once.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${1:-.venv-vllm}
PY="$VENV/bin/python"
STAMP="$VENV/.radixlink-vllm-stamp"
VLLM_VERSION=0.33.0
TORCH_PIN="torch==2.13.0+cpu"
# The light deps of vllm.v1.core.*, vllm.config and vllm.distributed.kv_transfer (import chain).
LIGHT_DEPS=(
  packaging pydantic regex cbor2 psutil pyzmq msgspec cloudpickle cachetools py-cpuinfo
  prometheus_client pybase64 pillow requests aiohttp einops blake3 tqdm pyyaml
  'transformers>=5.16.1,<5.21.0' 'openai>=2.25.0' openai_harmony partial_json_parser fastapi
  llguidance 'xgrammar==0.2.8' uvloop
)
# radixlink's runtime and test deps (pyproject: torch numpy xxhash blake3; redis extra; pytest).
RADIXLINK_DEPS=(numpy xxhash blake3 'redis>=5' hiredis pytest hypothesis)
RECIPE="vllm==$VLLM_VERSION $TORCH_PIN ${LIGHT_DEPS[*]} ${RADIXLINK_DEPS[*]}"

# NOTE: find_spec, not import: importing vllm takes ~10 s, finding it ~0.1 s.
FOUND="import importlib.util as u; assert u.find_spec('vllm') and u.find_spec('radixlink')"
if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$RECIPE" ] && "$PY" -c "$FOUND" 2>/dev/null; then
  echo "$VENV is up to date (rm $STAMP to rebuild)"
  exit 0
fi

[ -x "$PY" ] || python3 -m venv "$VENV"
PIN="$VENV/torch-pin.txt"
echo "$TORCH_PIN" > "$PIN"
PIP=("$PY" -m pip install -q -c "$PIN")
"$PY" -c "import torch" 2>/dev/null || "${PIP[@]}" torch==2.13.0
"$PY" -c "import torch; assert torch.__version__.endswith('+cpu'), torch.__version__"
"${PIP[@]}" "${RADIXLINK_DEPS[@]}" "${LIGHT_DEPS[@]}"
"${PIP[@]}" --no-deps "vllm==$VLLM_VERSION"
"${PIP[@]}" --no-deps -e .
"$PY" -c "import torch; assert torch.__version__.endswith('+cpu'), 'a CUDA torch slipped in'"
"$PY" -c "import vllm.v1.core.sched.scheduler, radixlink.integrations.vllm" >/dev/null
echo "$RECIPE" > "$STAMP"
echo "built $VENV: vllm $VLLM_VERSION on $("$PY" -c 'import torch; print(torch.__version__)')"
