"""Benchmarks, one module per question; each exposes ``main(argv) -> int`` for the CLI."""
