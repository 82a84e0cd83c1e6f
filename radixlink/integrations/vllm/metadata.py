"""What the scheduler-side connector tells the workers each step: pages to load and to save.

Owns the records only (picklable: vLLM ships them to worker processes). Must not hold tensors,
stores or requests.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorMetadata


@dataclass(frozen=True, slots=True, kw_only=True)
class GroupPages:
    """Pages of one KV cache group: ``block_ids[i]`` holds the page named ``hashes[i]``."""

    group_id: int
    block_ids: tuple[int, ...]
    hashes: tuple[str, ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class PageJob:
    """One request's pages to move, per group.

    Attributes:
        req_id: the vLLM request id.
        groups: one entry per group taking part (a group may have no pages: SWA blocks that
            fell out of the window are vLLM's null block and are skipped).
        cache_salt: the request's salt (token-chain keys only; vLLM hashes already hold it).
        finishing: saves only: the request has finished and vLLM holds its blocks until this
            save's pages are copied out (reported through ``get_finished``).
        overwrite: saves only: write every page even where the store says it holds it (the
            request's load failed, so stored pages past the failure may be bad too).
    """

    req_id: str
    groups: tuple[GroupPages, ...]
    cache_salt: str = ""
    finishing: bool = False
    overwrite: bool = False

    @property
    def num_pages(self) -> int:
        return sum(len(g.block_ids) for g in self.groups)


@dataclass(slots=True)
class RadixlinkMetadata(KVConnectorMetadata):
    """One step's jobs: loads start in ``start_load_kv``; saves copy out in ``wait_for_save``."""

    loads: list[PageJob] = field(default_factory=list)
    saves: list[PageJob] = field(default_factory=list)
