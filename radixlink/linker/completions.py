"""``Completions``: the worker jobs a linker submitted and which of them to apply now — each as
it arrives with one rank; with several, exactly those finished on every rank (an agreed mask
over the pending jobs, the same list on every rank), in job order.

Owns the pending set and the completions not yet applied. Must not apply anything itself.
"""

from __future__ import annotations

from radixlink.linker.ranks import RankGroup
from radixlink.linker.worker import Completion, Job, TransferWorker


class Completions:
    """Submitted jobs and their finished transfers, ready in an order every rank agrees on.

    Args:
        worker: the transfer worker the jobs run on.
        ranks: the rank group (a collective per ``ready`` call with several ranks).
    """

    def __init__(self, worker: TransferWorker, ranks: RankGroup):
        self.worker = worker
        self.ranks = ranks
        self._pending: set[int] = set()  # submitted, not yet handed out by ready()
        self._done: dict[int, Completion] = {}  # finished here, not yet handed out

    def submit(self, job: Job) -> int:
        job_id = self.worker.submit(job)
        self._pending.add(job_id)
        return job_id

    def ready(self, block_for: float | None = None) -> list[Completion]:
        """The completions to apply now (each handed out once). With several ranks, call it on
        every rank the same number of times: it is a collective while jobs are pending."""
        for done in self.worker.drain(block_for=block_for):
            self._done[done.job_id] = done
        if self.ranks.world_size == 1:
            jobs = list(self._done)
        else:
            if not self._pending:  # NOTE: the same on every rank, so no collective is skipped
                return []
            pending = sorted(self._pending)
            agreed = self.ranks.all_reduce_min([int(j in self._done) for j in pending])
            jobs = [job for job, bit in zip(pending, agreed) if bit]
        for job_id in jobs:
            self._pending.discard(job_id)
        return [self._done.pop(job_id) for job_id in jobs]
