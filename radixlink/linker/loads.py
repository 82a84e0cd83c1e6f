"""``LoadTable``: the bookkeeping of loads between ``load()`` and the caller taking its outcome:
which requests (members) share which store transfer, each member's own deadline, finished
outcomes not yet taken, and who is left when a member times out or is cancelled.

Owns records only; it decides, the linker carries out (locks, ABORT, worker cancellation).
Must not touch the cache, the store or threads.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from radixlink.linker.lookup import Lookup
from radixlink.linker.outcomes import LoadOutcome

if TYPE_CHECKING:  # NOTE: the loader builds reservations and imports this table
    from radixlink.linker.loader import Reservation


@dataclass(slots=True, kw_only=True, eq=False)
class Member:
    """One request waiting for a load.

    Attributes:
        req_id: the request.
        lookup: what it asked for.
        deadline: ``time.monotonic()`` past which this member (only) fails with "timeout".
        transfer: the store transfer it waits on (its reservation's lock holds the device
            prefix for every member: a member holds no lock of its own until its outcome).
    """

    req_id: Any
    lookup: Lookup
    deadline: float
    transfer: Transfer | None = None


@dataclass(slots=True, kw_only=True, eq=False)
class Transfer:
    """One store transfer (a worker job) and the members waiting on it.

    ``cancelled``: every member left before it finished; its completion only ABORTs.
    """

    job_id: int
    reservation: Reservation
    members: list[Member] = field(default_factory=list)
    cancelled: bool = False


class LoadTable:
    """Members, transfers and unclaimed outcomes, keyed for the linker's lookups.

    Identical loads (same pages from the same device prefix: ``Lookup.signature``) share one
    transfer while it is neither finished nor cancelled. A member leaves on its own deadline or
    cancellation; the transfer is cancelled when its last member leaves.
    """

    def __init__(self) -> None:
        self._members: dict[Any, Member] = {}  # waiting members, in load() order
        self._transfers: dict[int, Transfer] = {}
        self._by_signature: dict[tuple[str, int, int], Transfer] = {}
        self._outcomes: dict[Any, LoadOutcome] = {}

    # ---------------------------------------------------------------- joining

    def check_new(self, req_id: Any) -> None:
        """Raise ValueError when ``req_id`` is already loading or holds an unclaimed outcome."""
        if req_id in self._members:
            raise ValueError(f"request {req_id!r} already has a load in flight; wait_load() or "
                             "poll() for it, or cancel() it, before loading again")
        if req_id in self._outcomes:
            raise ValueError(f"request {req_id!r} has a finished load not yet taken; take it "
                             "with wait_load()/poll() (its outcome holds a lock) or cancel() it")

    def shared(self, lookup: Lookup) -> Transfer | None:
        """The in-flight transfer an identical load can join, if any."""
        return self._by_signature.get(lookup.signature)

    def start(self, transfer: Transfer) -> None:
        """Register a new transfer (its members join with ``join``)."""
        self._transfers[transfer.job_id] = transfer
        self._by_signature[transfer.reservation.lookup.signature] = transfer

    def join(self, member: Member, transfer: Transfer) -> None:
        member.transfer = transfer
        transfer.members.append(member)
        self._members[member.req_id] = member

    # ---------------------------------------------------------------- leaving

    def finish(self, job_id: int) -> Transfer | None:
        """The transfer of a completed job (None for a job that is not a load); its members
        are removed from the waiting set and are the caller's to deliver."""
        transfer = self._transfers.pop(job_id, None)
        if transfer is None:
            return None
        self._forget(transfer)
        for member in transfer.members:
            del self._members[member.req_id]
        return transfer

    def leave(self, member: Member) -> Transfer | None:
        """Take ``member`` out of its transfer (timeout or cancel). Returns the transfer when
        that was its last member: it is now cancelled and the caller stops its job."""
        del self._members[member.req_id]
        transfer = member.transfer
        assert transfer is not None, f"member {member.req_id!r} waits on no transfer"
        transfer.members.remove(member)
        if transfer.members:
            return None
        transfer.cancelled = True
        self._forget(transfer)
        return transfer

    def _forget(self, transfer: Transfer) -> None:
        signature = transfer.reservation.lookup.signature
        if self._by_signature.get(signature) is transfer:
            del self._by_signature[signature]

    # ---------------------------------------------------------------- queries

    def member(self, req_id: Any) -> Member | None:
        return self._members.get(req_id)

    def waiting(self) -> list[Member]:
        """Waiting members in load() order (the same order on every rank)."""
        return list(self._members.values())

    def expired(self, now: float, agree: Callable[[list[bool]], list[bool]]) -> list[Member]:
        """Waiting members past their own deadline at ``now``, as ``agree`` (the ranks' OR, a
        collective while anyone waits) decides."""
        waiting = list(self._members.values())
        if not waiting:
            return []
        late = agree([now >= member.deadline for member in waiting])
        return [member for member, expired in zip(waiting, late) if expired]

    def transfers(self) -> list[Transfer]:
        return list(self._transfers.values())

    # ---------------------------------------------------------------- outcomes

    def put(self, outcome: LoadOutcome) -> None:
        self._outcomes[outcome.req_id] = outcome

    def take(self, req_id: Any) -> LoadOutcome | None:
        return self._outcomes.pop(req_id, None)

    def take_all(self) -> list[LoadOutcome]:
        out = list(self._outcomes.values())
        self._outcomes.clear()
        return out

    def stats(self) -> dict[str, int]:
        return {"loads_in_flight": len(self._transfers), "loads_waiting": len(self._members),
                "unclaimed_outcomes": len(self._outcomes)}
