#!/usr/bin/env bash
# GPU check of RadixlinkConnector under `vllm serve` (needs one CUDA GPU and a CUDA build of
# vllm==0.33.0 with radixlink installed in the same environment; NOT runnable on CPU machines).
#
#   1. a baseline `vllm serve` without the connector: greedy outputs and the TTFT of a long
#      prompt computed from scratch (recompute);
#   2. instance A with the connector on a shared file:// store computes and stores the prompt;
#   3. instance B (a second server, same store) serves the same prompt: its greedy output must
#      equal the baseline's token for token, and its TTFT is compared with the recompute TTFT.
#
# Small Llama-shaped model, dummy weights (--load-format dummy: seeded, so every instance has
# the same weights), a local config.json only: no hub access. Prompts are token ids
# (--skip-tokenizer-init), outputs are compared as token ids.
#
# Usage: bash scripts/gpu/vllm_check.sh [PYTHON=python] [PROMPT_TOKENS=8000]
# Exit status 0 only when the outputs are identical; prints one JSON line with the numbers.
set -euo pipefail
PY=${1:-python}
PROMPT_TOKENS=${2:-8000}
WORK=$(mktemp -d /tmp/radixlink-vllm-check.XXXXXX)
MODEL="$WORK/model"
STORE="file://$WORK/store"
PIDS=()
cleanup() {
  for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
  for pid in "${PIDS[@]}"; do wait "$pid" 2>/dev/null || true; done
}
trap cleanup EXIT

mkdir -p "$MODEL"
cat > "$MODEL/config.json" <<'JSON'
{"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 1024,
 "intermediate_size": 2816, "num_attention_heads": 16, "num_key_value_heads": 4,
 "num_hidden_layers": 8, "vocab_size": 32000, "max_position_embeddings": 16384,
 "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "torch_dtype": "bfloat16",
 "bos_token_id": 1, "eos_token_id": 2, "tie_word_embeddings": false}
JSON

serve() {  # $1 = port, $2 = kv-transfer-config JSON or "" ; logs to $WORK/serve-$1.log
  local args=("$MODEL" --port "$1" --load-format dummy --skip-tokenizer-init --seed 0
              --max-model-len 16384 --gpu-memory-utilization 0.25 --enforce-eager
              --prefix-caching-hash-algo sha256)
  [ -n "$2" ] && args+=(--kv-transfer-config "$2")
  "$PY" -m vllm.entrypoints.cli.main serve "${args[@]}" > "$WORK/serve-$1.log" 2>&1 &
  PIDS+=($!)
  for _ in $(seq 600); do
    curl -sf "http://127.0.0.1:$1/health" >/dev/null && return 0
    kill -0 "${PIDS[-1]}" 2>/dev/null || { tail -50 "$WORK/serve-$1.log"; return 1; }
    sleep 1
  done
  echo "server on port $1 did not start" >&2; return 1
}
stop_last() { kill "${PIDS[-1]}"; wait "${PIDS[-1]}" 2>/dev/null || true; unset 'PIDS[-1]'; }

CONNECTOR=$(printf '{"kv_connector":"RadixlinkConnector","kv_connector_module_path":"radixlink.integrations.vllm","kv_role":"kv_both","kv_load_failure_policy":"recompute","kv_connector_extra_config":{"store":"%s"}}' "$STORE")

# One client: greedy completions of token-id prompts; TTFT = latency of a 1-token completion.
cat > "$WORK/client.py" <<'PYEOF'
import json, random, sys, time, urllib.request
port, n, out = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
rng = random.Random(0)
shared = [rng.randrange(3, 32000) for _ in range(n)]
prompts = [shared + [rng.randrange(3, 32000) for _ in range(16)] for _ in range(3)]
def complete(prompt, max_tokens):
    body = {"model": sys.argv[4], "prompt": prompt, "max_tokens": max_tokens,
            "temperature": 0.0, "return_token_ids": True}
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions",
                                 json.dumps(body).encode(), {"Content-Type": "application/json"})
    start = time.perf_counter()
    with urllib.request.urlopen(req, timeout=600) as resp:
        data = json.load(resp)
    choice = data["choices"][0]
    return time.perf_counter() - start, choice.get("token_ids") or choice.get("text")
ttft, _ = complete(shared + [5, 6, 7], 1)   # the first request on this instance
outputs = [complete(p, 32)[1] for p in prompts]
json.dump({"ttft_s": ttft, "outputs": outputs}, open(out, "w"))
PYEOF

serve 8100 ""
"$PY" "$WORK/client.py" 8100 "$PROMPT_TOKENS" "$WORK/baseline.json" "$MODEL"
stop_last
serve 8101 "$CONNECTOR"
"$PY" "$WORK/client.py" 8101 "$PROMPT_TOKENS" "$WORK/a.json" "$MODEL"
serve 8102 "$CONNECTOR"
"$PY" "$WORK/client.py" 8102 "$PROMPT_TOKENS" "$WORK/b.json" "$MODEL"

"$PY" - "$WORK" <<'PYEOF'
import json, sys
w = sys.argv[1]
base, a, b = (json.load(open(f"{w}/{n}.json")) for n in ("baseline", "a", "b"))
same = base["outputs"] == a["outputs"] == b["outputs"]
print(json.dumps({"outputs_identical": same, "ttft_recompute_s": round(base["ttft_s"], 4),
                  "ttft_storing_instance_s": round(a["ttft_s"], 4),
                  "ttft_loading_instance_s": round(b["ttft_s"], 4),
                  "loading_vs_recompute": round(b["ttft_s"] / base["ttft_s"], 3)}))
sys.exit(0 if same else 1)
PYEOF
