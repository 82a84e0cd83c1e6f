"""Fault matrix of the external cache linker (issue 10): every fault ends with exact accounting."""
