"""Reference engine: model, weights, engine and the demo (re-exports only)."""
