"""pdlink: drive the pdlink KV transfer daemons from an engine's scheduler."""

from pdlink.client import DecodeClient, PrefillClient, Rank, StatusCache
from pdlink.errors import (
    AlreadyExists,
    DeadlineExceeded,
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    PdlinkError,
    PermissionDenied,
    ResourceExhausted,
    Unavailable,
)
from pdlink.region import AuxLayout, BufferLayout, Region, RegionLayout
from pdlink.states import RoomState, RoomStatus

__all__ = [
    "AlreadyExists",
    "AuxLayout",
    "BufferLayout",
    "DeadlineExceeded",
    "DecodeClient",
    "FailedPrecondition",
    "InvalidArgument",
    "NotFound",
    "PdlinkError",
    "PermissionDenied",
    "PrefillClient",
    "Rank",
    "Region",
    "RegionLayout",
    "ResourceExhausted",
    "RoomState",
    "RoomStatus",
    "StatusCache",
    "Unavailable",
]
