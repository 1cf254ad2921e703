"""Room states and statuses, mirrored from pdlink.v1 by name."""

from __future__ import annotations

import enum
from dataclasses import dataclass

from pdlink.v1 import common_pb2


class RoomState(enum.Enum):
    """A room's state, by the proto's names.

    The values are the names, not the wire numbers: the numbers carry no
    order, and an engine's own states (SGLang's KVPoll has Failed = 0) must be
    mapped name by name, never by number.
    """

    UNSPECIFIED = "UNSPECIFIED"
    BOOTSTRAPPING = "BOOTSTRAPPING"
    WAITING_FOR_INPUT = "WAITING_FOR_INPUT"
    TRANSFERRING = "TRANSFERRING"
    SUCCESS = "SUCCESS"
    FAILED = "FAILED"

    @property
    def terminal(self) -> bool:
        return self in (RoomState.SUCCESS, RoomState.FAILED)

    @classmethod
    def from_proto(cls, value: int) -> RoomState:
        name = common_pb2.RoomState.Name(value)
        return cls(name.removeprefix("ROOM_STATE_"))

    def to_proto(self) -> int:
        return common_pb2.RoomState.Value("ROOM_STATE_" + self.value)


# How far along the lifecycle a state is: the status cache takes a Watch
# transition only when it moves a room forward, so a transition that was
# already queued when a resync Poll answered cannot take the room back.
_PROGRESS = {
    RoomState.UNSPECIFIED: 0,
    RoomState.BOOTSTRAPPING: 1,
    RoomState.WAITING_FOR_INPUT: 2,
    RoomState.TRANSFERRING: 3,
    RoomState.SUCCESS: 4,
    RoomState.FAILED: 4,
}


def moves_forward(old: RoomState, new: RoomState) -> bool:
    """Whether new is later in a room's lifecycle than old (terminal is last and sticky)."""
    if old.terminal:
        return False
    return _PROGRESS[new] > _PROGRESS[old]


@dataclass(frozen=True, slots=True)
class RoomStatus:
    """One room as the daemon last reported it.

    found is False when the daemon holds no room with this id (never opened,
    cleared, reaped, or lost in a daemon restart). reason and peer_reason are
    set when state is FAILED (the proto's closed set: timeout:<state>,
    aborted:local, aborted:remote, peer_lost, ...). prefix_len (prefill) is
    how many leading page positions decode already holds, set from
    WAITING_FOR_INPUT on: Sends may start there.
    """

    room_id: int
    nonce: int = 0
    found: bool = False
    state: RoomState = RoomState.UNSPECIFIED
    reason: str = ""
    peer_reason: str = ""
    prefix_len: int = 0

    @classmethod
    def from_proto(cls, s: common_pb2.RoomStatus) -> RoomStatus:
        return cls(
            room_id=s.room_id,
            nonce=s.nonce,
            found=s.found,
            state=RoomState.from_proto(s.state),
            reason=s.reason,
            peer_reason=s.peer_reason,
            prefix_len=s.prefix_len,
        )

    @property
    def terminal(self) -> bool:
        """Success or Failed, or gone from the daemon (found is False)."""
        return not self.found or self.state.terminal
