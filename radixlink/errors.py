"""The library's exception classes (at most three). Owns nothing else."""

from __future__ import annotations


class StoreError(Exception):
    """A store backend failed (connection lost, I/O error); raised ``from`` the cause."""


class TransferError(Exception):
    """A linker transfer could not complete (reported as a failed outcome, never raised
    across threads into the engine loop)."""
