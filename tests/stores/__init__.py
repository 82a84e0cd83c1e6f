"""Store tests: one conformance suite (conformance.py) mixed into each backend's file."""
