"""The loader: LOOKUP, LOAD (reserve: lock + PREPARE, transfer, verify, publish or ABORT),
landing, cancellation, waiting and completion processing (DESIGN.md section 5b, "Load"), and a
load's ``Reservation``.

Owns the load lifecycle: what a lookup found (``RememberedLookups``), loads in flight
(``LoadTable``), what PREPARE took (``Reservation``: one ``ComponentLoad`` per component), what
a finished transfer becomes (published, or ABORTed) and the ``LoadOutcome`` / ``Landing``
records (``outcomes.py``) each member gets. Built from the linker's ``LinkerParts`` and the
``Offloader`` (which owns offload completions and the stored index's marks); never reaches the
``ExternalCacheLinker`` facade. Reaches the tree only through the cache's public facade
(``match_prefix(touch=False)``, ``insert_loaded``, ``lock`` / ``unlock``) and the components'
typed load steps (``prepare_load`` / ``abort_load``), never naming a component type.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any

import torch

from radixlink.checks import check_req_id, check_seconds
from radixlink.components.base import ComponentLoad
from radixlink.contract import InsertParams, MatchResult, PoolTransfer
from radixlink.cost import Source
from radixlink.linker.jobs import load_job
from radixlink.linker.loads import LoadTable, Member, Transfer
from radixlink.linker.lookup import Lookup, RememberedLookups, find_restorable
from radixlink.linker.offload import Offloader
from radixlink.linker.outcomes import Landing, LoadOutcome
from radixlink.linker.parts import LinkerParts
from radixlink.linker.progress import LayerProgress
from radixlink.pages.engine import Completion, TransferStatus

logger = logging.getLogger(__name__)


class ShortRestore(ValueError):
    """The publish restored less than the load brought (a component published a short window
    or no state): the load fails, loudly. The insert already took every reserved slot, so
    there is nothing left to ABORT."""


@dataclass(slots=True, kw_only=True)
class Reservation:
    """What LOAD + PREPARE took for one transfer (the one lock on its device prefix, for every
    member), and what publish will insert.

    ::

        tokens     |------ device prefix (locked) ------|------- loaded tail -------|
        slots      |  device_slots: the tree's own      |  loads[0] (FULL)         |
                   0                               prefix_len                  len(tokens)

    Attributes:
        lookup: the lookup this load serves (tokens, keys, namespace).
        device_slots: the tree's full slots of ``[0, prefix_len)`` at PREPARE, protected by
            ``handle`` until publish or abort: publish inserts exactly these, never a new match.
        handle: the lock on the device prefix, for every member of the transfer, until
            publish or ABORT (a member gets a lock of its own with its outcome).
        loads: per component, its ``ComponentLoad`` (None where it takes no part); emptied by
            ABORT, or by a short publish (the insert took every reserved slot then).
    """

    lookup: Lookup
    device_slots: torch.Tensor
    handle: Any
    loads: list[ComponentLoad | None] = field(default_factory=list)

    @property
    def prefix_len(self) -> int:
        return self.lookup.prefix_len

    @property
    def transfers(self) -> list[PoolTransfer]:
        """The transfers the loads land in: what the engine fills and the stored marks cover."""
        return [load.transfer for load in self.loads if load is not None]

    @property
    def full(self) -> PoolTransfer | None:
        """The backbone's transfer (the first component taking part prepares first)."""
        return next((load.transfer for load in self.loads if load is not None), None)



class Loader:
    """Loads for one linker (see the module docstring).

    Args:
        parts: the linker's shared parts.
        offloader: applies offload completions.
    """

    def __init__(self, parts: LinkerParts, offloader: Offloader):
        self.parts, self.offloader = parts, offloader
        self.cache, self.ranks, self.stats = parts.cache, parts.ranks, parts.stats
        self.world_size = parts.world_size
        config = parts.config
        # NOTE: with several ranks an age bound would drop a lookup on one rank only.
        ttl = config.lookup_ttl_s if self.world_size == 1 else None
        self.lookups = RememberedLookups(config.max_lookups, config.max_lookup_bytes, ttl)
        self.loads = LoadTable()
        self._progress: dict[int, LayerProgress] = {}  # load job -> its landing progress
        self.closed = False

    # ---------------------------------------------------------------- LOOKUP

    def lookup(self, result: MatchResult, key: bytes, req_id: Any, namespace: Any) -> None:
        """Fill ``result.external_hit_len`` and remember what ``load(req_id)`` fetches."""
        found = find_restorable(self.parts, result, key, namespace)
        self.stats["lookups"] += 1
        result.external_hit_len = 0 if found is None else len(found.keys) * self.parts.page_size
        if found is not None:
            self.stats["lookup_hit_pages"] += len(found.keys)
        self.lookups.put(req_id, found)

    # ---------------------------------------------------------------- LOAD

    def load(self, req_id: Any, timeout_s: float | None) -> bool:
        """Check the device prefix is still as the lookup saw it, then join an identical load
        in flight, or lock the prefix, PREPARE and queue the transfer; False (nothing held)
        when there is nothing to load."""
        check_req_id(req_id)
        limit = self.parts.config.load_timeout_s if timeout_s is None else check_seconds(
            "load(timeout_s=)", timeout_s)
        self.loads.check_new(req_id)
        lookup = self.lookups.pop(req_id)
        if lookup is None or self.closed:
            return False
        prefix = self._device_prefix(lookup)
        ok = prefix is not None
        if self.world_size > 1:
            ok = self.ranks.all_ok(ok)
        if not ok:
            self.stats["stale_lookups"] += 1
            return False
        assert prefix is not None
        member = Member(req_id=req_id, lookup=lookup, deadline=time.monotonic() + limit)
        transfer = self.loads.shared(lookup)
        if transfer is not None:  # NOTE: its reservation holds the same device prefix
            self.stats["shared_loads"] += 1
        else:
            transfer = self._start_transfer(lookup, *prefix)
            if transfer is None:
                self.stats["failures_prepare"] += 1
                return False
            self.stats["loads_started"] += 1
        self.loads.join(member, transfer)
        return True

    def _device_prefix(self, lookup: Lookup) -> tuple[Any, torch.Tensor] | None:
        """Where the lookup's device prefix ends and the tree's slots there, when the tree
        still serves it exactly (its window and state too); None when it is stale.

        The lookup's own match answers while the tree's epoch is the one it saw: a prefix the
        tree served shrinks or moves to other slots only when tree-owned data is freed, which
        moves the epoch. Otherwise (an eviction or a heal since) the prefix is peeked again.
        """
        if lookup.epoch == self.cache.tree.epoch:
            return lookup.last_node, lookup.device_slots
        now = self.cache.match_prefix(lookup.tokens[: lookup.prefix_len],
                                      namespace=lookup.namespace, touch=False)
        if now.prefix_len != lookup.prefix_len:
            return None
        return now.last_node, now.device_indices

    def _start_transfer(self, lookup: Lookup, node: Any, device_slots: Any) -> Transfer | None:
        """Lock the device prefix (at ``node``: the one lock, for every member), LOAD + PREPARE
        on every component taking part, backbone first (agreed across ranks: a refusal on any
        ABORTs the prepared ones, holding nothing), and queue the engine job."""
        cache = self.cache
        reservation = Reservation(lookup=lookup, device_slots=device_slots, handle=cache.lock(node))
        full = None
        for component in cache.components:
            load = None
            if component.takes_part_in_loads:
                load = component.prepare_load(lookup.keys, lookup.prefix_len, full)
                if load is None:
                    break
                full = full or load.transfer
            reservation.loads.append(load)
        ok = full is not None and len(reservation.loads) == len(cache.components)
        if self.world_size > 1:  # NOTE: one rank short of room fails it on all
            ok = self.ranks.all_ok(ok)
        if not ok:
            release(cache, reservation)
            return None
        parts = self.parts
        job, landing = load_job(reservation.transfers, self.cache, parts.codec, parts.keyspace,
                                lookup.namespace, parts.arena)
        transfer = Transfer(job_id=parts.jobs.submit(job), reservation=reservation)
        self._progress[transfer.job_id] = landing.progress
        self.loads.start(transfer)
        return transfer

    def landing(self, req_id: Any) -> Landing | None:
        """Where the in-flight load of ``req_id`` is landing, or None."""
        member = self.loads.member(check_req_id(req_id))
        if member is None or member.transfer is None:
            return None
        return landing(member, self._progress.get(member.transfer.job_id))

    def cancel(self, req_id: Any) -> bool:
        """Forget the lookup of ``req_id``, leave its load, release an outcome it never took;
        whether anything was held."""
        found = self.lookups.drop(check_req_id(req_id))
        member = self.loads.member(req_id)
        if member is not None:
            self._leave(member)
            self.stats["cancelled_loads"] += 1
            found = True
        outcome = self.loads.take(req_id)
        if outcome is not None:
            self.cache.unlock(outcome.lock)
            found = True
        return found

    # ---------------------------------------------------------------- completions

    def poll(self) -> list[LoadOutcome]:
        """Apply what finished, fail members past their deadline; the outcomes not taken."""
        self.process()
        self._expire()
        return self.loads.take_all()

    def wait(self, req_id: Any, timeout: float | None) -> LoadOutcome:
        """Block until the load of ``req_id`` finishes or its deadline passes."""
        check_req_id(req_id)
        if timeout is not None:
            check_seconds("wait_load(timeout=)", timeout, allow_zero=True)
        outcome = self.loads.take(req_id)
        if outcome is not None:
            return outcome
        member = self.loads.member(req_id)
        if member is None:
            raise ValueError(f"no load in flight for request {req_id!r}; call load() first "
                             "(or its outcome was already taken)")
        if timeout is not None:
            member.deadline = min(member.deadline, time.monotonic() + timeout)
        while True:
            left = member.deadline - time.monotonic()
            self.process(block_for=min(max(left, 0.0), 0.05))
            self._expire()
            outcome = self.loads.take(req_id)
            if outcome is not None:
                return outcome

    def process(self, block_for: float | None = None) -> None:
        """Apply the finished transfers that are ready (``Completions``): loads here,
        offloads by the offloader."""
        for done in self.parts.jobs.ready(block_for):
            self.parts.metrics.observe(done)
            transfer = self.loads.finish(done.job_id)
            if transfer is not None:
                self._finish(transfer, done)
            else:
                self.offloader.finish(done)

    def _expire(self) -> None:
        """Members past their own deadline fail now (agreed across ranks); the transfer goes
        on for the others."""
        agree = list if self.world_size == 1 else self.ranks.any_of
        for member in self.loads.expired(time.monotonic(), agree):
            self._leave(member)
            self.stats["failures_timeout"] += 1
            self._put(self._failed(member, "timeout"))

    def _leave(self, member: Member) -> None:
        transfer = self.loads.leave(member)
        if transfer is not None:  # its last member left: stop the job; ABORT on completion
            self.parts.engine.cancel(transfer.job_id)
            self.stats["cancelled_transfers"] += 1

    def _put(self, outcome: LoadOutcome) -> None:
        if self.closed:  # NOTE: nobody will take it: release its lock now
            self.cache.unlock(outcome.lock)
        else:
            self.loads.put(outcome)

    def _finish(self, transfer: Transfer, done: Completion) -> None:
        """Publish ``transfer`` (every rank's part landed and verified) or ABORT it, and hand
        each member its outcome (steps 4-5; a collective with several ranks)."""
        self._progress.pop(transfer.job_id, None)
        reservation, stats = transfer.reservation, self.stats
        ok = done.ok and not transfer.cancelled and not self.closed
        # NOTE: intact = this rank's pages are all still in the store (page I/O deletes the
        # bad ones it read; a missing one is gone)
        intact = done.status not in (TransferStatus.CORRUPT, TransferStatus.MISSING)
        if self.world_size > 1:  # NOTE: one all-reduce agrees on both
            ok, intact = self.ranks.all_of([ok, intact])
        if done.status is TransferStatus.CORRUPT:
            stats["checksum_misses"] += 1
        if not intact:
            # NOTE: a rank lost some of these pages: every rank forgets them (the stored index
            # must agree: its marks decide revalidation's collective and the write policy's
            # offloads), so every rank writes them again
            for t in reservation.transfers:
                self.parts.stored.discard(t.name, t.keys)
        if not ok:
            self._abort(transfer, failure_reason(done, transfer, self.closed))
            return
        try:
            match, adopted = publish(self.cache, reservation)
        except ValueError as exc:  # the insert refused before changing anything
            stats["failures_publish"] += 1
            self._abort(transfer, f"publish refused: {exc}")
            return
        # NOTE: verified pages are in the store: the nodes they cover whole are stored now (a
        # node starting below the loaded tail also holds device pages nobody checked)
        now, stored = time.monotonic(), self.parts.stored
        for part in reservation.transfers:
            stored.add(part.name, part.keys, at=now)
        model = self.parts.cost_model
        if model is not None:
            model.observe_load(Source.STORE, done.num_bytes, done.seconds)
        stats["loaded_bytes"] += done.num_bytes
        stats["loaded_pages"] += len(reservation.lookup.keys)
        # NOTE: loaded tokens the tree already held (another request inserted them meanwhile):
        # their reserved slots went back to the free list, not into the tree
        stats["loaded_tokens_not_adopted"] += (len(reservation.lookup.tokens)
                                               - reservation.prefix_len - adopted)
        outcomes = success_outcomes(self.cache, transfer, match)
        self.cache.unlock(reservation.handle)
        for outcome in outcomes:
            stats["loaded_tokens"] += outcome.loaded_len  # the store tier's hits
            self._put(outcome)

    def _abort(self, transfer: Transfer, reason: str) -> None:
        """ABORT a finished transfer that is not published; each member fails with ``reason``
        and its own device prefix."""
        if reason != "cancelled":
            self.stats["failures_load"] += 1
        failed = [self._failed(member, reason) for member in transfer.members]
        release(self.cache, transfer.reservation)
        for outcome in failed:
            self._put(outcome)

    def _failed(self, member: Member, reason: str) -> LoadOutcome:
        """The member's device prefix as it had it, under a lock of its own (which the outcome
        hands over), taken while the transfer's reservation still holds that prefix."""
        assert member.transfer is not None, f"member {member.req_id!r} waits on no transfer"
        reservation = member.transfer.reservation
        node = reservation.handle.node
        return LoadOutcome(
            req_id=member.req_id, ok=False, prefix_len=member.lookup.prefix_len,
            device_indices=reservation.device_slots, last_node=node, lock=self.cache.lock(node),
            reason=reason,
        )

    # ---------------------------------------------------------------- close

    def close(self) -> None:
        """No new loads; transfers not yet finished are cancelled (aborted on completion)."""
        self.closed = True
        for transfer in self.loads.transfers():  # NOTE: aborted anyway; skip their writes
            self.parts.engine.cancel(transfer.job_id)

    def release_outcomes(self) -> None:
        """Release the locks of outcomes nobody took (after ``close``)."""
        for outcome in self.loads.take_all():
            self.cache.unlock(outcome.lock)

    def gauges(self) -> dict[str, int]:
        out = {**self.loads.stats(), **self.lookups.stats()}
        out["hash_reuses"] = self.parts.hash_memo.hits
        return out


# ---------------------------------------------------------------- outcomes


def success_outcomes(cache: Any, transfer: Transfer, match: MatchResult) -> list[LoadOutcome]:
    """Per member of a published transfer: the restored prefix (``match``, what the publish
    found served) and a lock on it taken for the member."""
    loaded_len = max(0, match.prefix_len - transfer.reservation.lookup.prefix_len)
    return [LoadOutcome(req_id=member.req_id, ok=True, prefix_len=match.prefix_len,
                        device_indices=match.device_indices, last_node=match.last_node,
                        lock=cache.lock(match.last_node), loaded_len=loaded_len, match=match)
            for member in transfer.members]


def failure_reason(done: Completion, transfer: Transfer, closed: bool) -> str:
    """Why a finished transfer is not published (it failed here or on another rank)."""
    if not done.ok:
        return done.detail or done.status.value
    return "cancelled" if transfer.cancelled else "closed" if closed else "another rank failed"


def landing(member: Member, progress: LayerProgress | None) -> Landing | None:
    """Where ``member``'s load is landing (device prefix + reserved slots) and its per-layer
    wait; None when the transfer has no landing progress or no FULL slots."""
    transfer = member.transfer
    if transfer is None or progress is None:
        return None
    reservation = transfer.reservation
    full = reservation.full
    if full is None or full.device_indices is None:
        return None
    lookup = reservation.lookup
    progress.watch()
    return Landing(req_id=member.req_id, prefix_len=len(lookup.tokens),
                   loaded_len=len(lookup.tokens) - lookup.prefix_len,
                   device_indices=torch.cat([reservation.device_slots, full.device_indices]),
                   progress=progress)


# ---------------------------------------------------------------- the steps of one load


def release(cache: Any, reservation: Reservation) -> None:
    """ABORT every prepared load, last component first (frees what PREPARE reserved), and
    drop the reservation's lock."""
    for component, load in reversed(list(zip(cache.components, reservation.loads))):
        if load is not None:
            component.abort_load(load)
    reservation.loads = []
    cache.unlock(reservation.handle)


def publish(cache: Any, reservation: Reservation) -> tuple[MatchResult, int]:
    """Insert the locked device prefix plus the verified loaded slots, with each load's
    insert fields (not a hit, no linker callback: the lookup's page keys go with it; COMMIT
    has nothing left to do: the insert adopts or frees every reserved slot), and check the
    tree now serves every loaded token (the restored length is the loaded length). Returns
    that read-only match of the restored prefix and the loaded tokens the tree adopted (the
    insert tracks adopted ranges, DESIGN.md section 5: fewer when another request inserted
    the same prefix meanwhile and the loaded slots were freed).

    Raises:
        ShortRestore: the tree serves less than ``len(lookup.tokens)`` after the publish (the
            reservation is then empty: ``release`` only unlocks); logged.
        ValueError: the insert refused (nothing changed); the caller ABORTs.
    """
    lookup, prefix, full = reservation.lookup, reservation.prefix_len, reservation.full
    assert full is not None and full.device_indices is not None, "publish of a load w/o FULL"
    value = torch.cat([reservation.device_slots, full.device_indices])
    assert value.shape[0] == len(lookup.tokens) and reservation.device_slots.shape[0] == prefix, (
        f"publish of {value.shape[0]} slots for {len(lookup.tokens)} tokens "
        f"(device prefix {reservation.device_slots.shape[0]} of {prefix})"
    )
    fields: dict[str, Any] = {}
    for load in reservation.loads:
        if load is not None:
            fields.update(load.insert)
    params = InsertParams(key=lookup.tokens, value=value, prev_prefix_len=prefix,
                          namespace=lookup.namespace, track_adopted_ranges=True, **fields)
    # NOTE: the lookup's page keys, chained from the device prefix: the insert never calls
    # the linker back for them.
    result = cache.insert_loaded(params, page_hashes=(prefix // cache.page_size, lookup.keys))
    # NOTE: what the tree serves along the path the insert just built, with no second walk
    match: MatchResult = cache.match_node(result.last_node)
    if match.prefix_len < len(lookup.tokens):
        reservation.loads = []  # NOTE: the insert took every slot
        raise _short_restore(match.prefix_len, len(lookup.tokens), prefix)
    # NOTE: the backbone (the first component) adopts a loaded page whenever any component does
    return match, result.adopted_tokens(cache.components[0].component_type)


def _short_restore(served: int, total: int, prefix: int) -> ShortRestore:
    """The logged failure of a publish that restored ``served`` of ``total`` tokens."""
    message = (f"restored {served} of {total} tokens after publishing a load of "
               f"{total - prefix} (a component published less than it loaded: a short window "
               "or a missing state)")
    logger.warning("load failure: %s", message)
    return ShortRestore(message)
