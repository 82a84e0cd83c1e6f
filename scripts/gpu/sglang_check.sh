#!/usr/bin/env bash
# GPU check of the SGLang integration (docs/integrations.md, "GPU check"). Not run by CI.
#
# Needs one CUDA GPU and a venv with sglang==0.5.23 and its CUDA deps plus radixlink
# (pip install "sglang==0.5.23" && pip install -e /path/to/radixlink). No hub access: a tiny
# Llama config is written locally and served with --load-format dummy, token ids in and out
# (--skip-tokenizer-init).
#
#   1. baseline: one server without the linker: greedy outputs, cold TTFT of a long prompt;
#   2. two servers at once on the same GPU, both with RadixlinkLinker on one file:// store:
#      server 1 computes the prompts (its tree offloads them), server 2 gets the same prompts
#      and restores them from the store.
# Pass: outputs of server 1 and server 2 equal the baseline's token for token. Printed: the
# long shared prompt's TTFT on the baseline (cold) and on server 2 (store hit).
#
# Usage: PY=/path/to/python bash scripts/gpu/sglang_check.sh
set -euo pipefail

PY=${PY:-python}
WORK=$(mktemp -d)
PIDS=()
cleanup() { for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done; rm -rf "$WORK"; }
trap cleanup EXIT

mkdir -p "$WORK/model"
cat > "$WORK/model/config.json" <<'JSON'
{"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 512,
 "intermediate_size": 1408, "num_hidden_layers": 4, "num_attention_heads": 8,
 "num_key_value_heads": 4, "vocab_size": 32000, "max_position_embeddings": 8192,
 "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "torch_dtype": "bfloat16",
 "bos_token_id": 1, "eos_token_id": 2, "tie_word_embeddings": false}
JSON

LINKER_CONFIG=$(printf '{"linker": "RadixlinkLinker", "linker_module_path": "%s", "linker_extra_config": {"store": "file://%s/store"}}' \
  radixlink.integrations.sglang.linker "$WORK")

serve() {  # $1 = port, $2 = log name, rest = extra flags
  local port=$1 name=$2; shift 2
  "$PY" -m sglang.launch_server --model-path "$WORK/model" --load-format dummy \
    --skip-tokenizer-init --port "$port" --page-size 16 --mem-fraction-static 0.3 \
    --disable-cuda-graph --random-seed 0 "$@" > "$WORK/$name.log" 2>&1 &
  PIDS+=($!)
  for _ in $(seq 1 300); do
    curl -sf "http://127.0.0.1:$port/health" > /dev/null && return 0
    sleep 1
  done
  echo "server $name did not start; log:" >&2; tail -50 "$WORK/$name.log" >&2; exit 1
}

client() {  # $1 = port, $2 = output json
  "$PY" - "$1" "$2" <<'PYEOF'
import json, random, sys, time, urllib.request
port, out = sys.argv[1], sys.argv[2]
rng = random.Random(0)
shared = [rng.randrange(3, 32000) for _ in range(3000)]  # the long shared prompt
prompts = [shared] + [shared[:1500] + [rng.randrange(3, 32000) for _ in range(64)]
                      for _ in range(3)]
def generate(ids, stream):
    body = json.dumps({"input_ids": ids, "stream": stream,
                       "sampling_params": {"temperature": 0, "max_new_tokens": 16}}).encode()
    req = urllib.request.Request(f"http://127.0.0.1:{port}/generate", body,
                                 {"Content-Type": "application/json"})
    start = time.perf_counter()
    with urllib.request.urlopen(req) as resp:
        if not stream:
            return json.loads(resp.read())["output_ids"], None
        ttft, last = None, None
        for line in resp:
            if line.startswith(b"data:") and line.strip() != b"data: [DONE]":
                ttft = ttft if ttft is not None else time.perf_counter() - start
                last = json.loads(line[5:])
        return last["output_ids"], ttft
_, ttft = generate(prompts[0], stream=True)
outputs = [generate(p, stream=False)[0] for p in prompts]
json.dump({"ttft_s": ttft, "outputs": outputs}, open(out, "w"))
PYEOF
}

serve 30100 baseline
client 30100 "$WORK/baseline.json"
kill "${PIDS[0]}"; wait "${PIDS[0]}" 2>/dev/null || true; PIDS=()

LINKER_FLAGS=(--enable-unified-cache-external-linker
  --unified-cache-external-linker-backend dynamic
  --unified-cache-external-linker-config "$LINKER_CONFIG")
serve 30101 linked-1 "${LINKER_FLAGS[@]}"
serve 30102 linked-2 "${LINKER_FLAGS[@]}"
client 30101 "$WORK/linked-1.json"
sleep 3  # write-through offloads land in the background
client 30102 "$WORK/linked-2.json"

"$PY" - "$WORK" <<'PYEOF'
import json, sys
work = sys.argv[1]
base, one, two = (json.load(open(f"{work}/{n}.json")) for n in ("baseline", "linked-1", "linked-2"))
same = base["outputs"] == one["outputs"] == two["outputs"]
print(f"greedy outputs equal with and without the linker: {same}")
print(f"long shared prompt TTFT: baseline (cold) {base['ttft_s'] * 1e3:.1f} ms, "
      f"server 2 (store hit) {two['ttft_s'] * 1e3:.1f} ms, "
      f"ratio {base['ttft_s'] / two['ttft_s']:.2f}x")
sys.exit(0 if same else 1)
PYEOF
grep -h "radixlink linker" "$WORK"/linked-*.log | head -2 || true
