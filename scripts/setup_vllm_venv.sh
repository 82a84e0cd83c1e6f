#!/usr/bin/env bash
# Build a CPU venv in which radixlink's vLLM connector tests and bench run: .venv-vllm/ (vLLM
# 0.33.0, the default) or one per other release (0.34.0: .venv-vllm-034/).
#
# torch==2.13.0 is the local CPU wheel; every later install is constrained to it so pip can never
# swap in a CUDA build. vLLM goes in with --no-deps (its declared deps pull CUDA wheels);
# only the light packages that its scheduler, KV cache manager, config and connector modules
# import are added. radixlink itself is installed editable, also --no-deps.
#
# Usage: bash scripts/setup_vllm_venv.sh [VERSION=0.33.0] [VENV]
#   VENV defaults to <repo>/.venv-vllm for 0.33.0 and <repo>/.venv-vllm-0NN for 0.NN.x.
# Idempotent: a stamp file records the recipe and the version; a second run with the same recipe
# exits at once. A second version's build reuses pip's cache of the light deps.
set -euo pipefail
VLLM_VERSION=${1:-0.33.0}
[[ $VLLM_VERSION =~ ^0\.(3[2-4])\.[0-9]+$ ]] || {
  echo "setup_vllm_venv.sh: vLLM version '$VLLM_VERSION' is not supported; give 0.32.x, 0.33.x or 0.34.x" >&2
  exit 2
}
MINOR=${BASH_REMATCH[1]}
DEFAULT_VENV=.venv-vllm
[[ $MINOR == 33 ]] || DEFAULT_VENV=.venv-vllm-0$MINOR
# The light deps of vllm.v1.core.*, vllm.config and vllm.distributed.kv_transfer (import chain).
LIGHT_DEPS=(
  packaging pydantic regex cbor2 psutil pyzmq msgspec cloudpickle cachetools py-cpuinfo
  prometheus_client pybase64 pillow requests aiohttp einops blake3 tqdm pyyaml
  'transformers>=5.16.1,<5.21.0' 'openai>=2.25.0' openai_harmony partial_json_parser fastapi
  llguidance 'xgrammar==0.2.8' uvloop
)
# radixlink's runtime and test deps (pyproject: torch numpy xxhash blake3; redis extra; pytest).
RADIXLINK_DEPS=(numpy xxhash blake3 'redis>=5' hiredis pytest hypothesis)
source "$(dirname "${BASH_SOURCE[0]}")/venv_common.sh"
# NOTE: find_spec, not import: importing vllm takes ~10 s, finding it ~0.1 s.
FOUND="import importlib.util as u; assert u.find_spec('vllm') and u.find_spec('radixlink')"
if venv_begin "${2:-$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)/$DEFAULT_VENV}" "vllm-$VLLM_VERSION" \
    "${BASH_SOURCE[0]}" && "$PY" -c "$FOUND" 2>/dev/null; then
  echo "$VENV is up to date (rm $STAMP to rebuild)"
  exit 0
fi
venv_create
pip_install "${RADIXLINK_DEPS[@]}" "${LIGHT_DEPS[@]}"
pip_install --no-deps "vllm==$VLLM_VERSION"
pip_install --no-deps -e "$ROOT"
"$PY" -c "import torch; assert torch.__version__.endswith('+cpu'), 'a CUDA torch slipped in'"
"$PY" -c "import vllm.v1.core.sched.scheduler, radixlink.integrations.vllm" >/dev/null
venv_done
echo "built $VENV: vllm $VLLM_VERSION on $("$PY" -c 'import torch; print(torch.__version__)')"
