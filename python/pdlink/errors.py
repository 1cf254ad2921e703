"""Typed errors: one class per gRPC code a scheduler handles."""

from __future__ import annotations

from typing import Any

import grpc
from google.rpc import error_details_pb2, status_pb2

from pdlink.states import RoomState

_DETAILS_KEY = "grpc-status-details-bin"


class PdlinkError(Exception):
    """A daemon call failed.

    code is the grpc.StatusCode and details the daemon's message. When the
    call was about a Failed room the daemon names the room's state (a
    RoomState; UNSPECIFIED when not named), reason and peer_reason
    (ErrorInfo ROOM_FAILED); field is the request field a
    refused request named (BadRequest). method is the RPC, e.g. "Send".
    """

    code: grpc.StatusCode = grpc.StatusCode.UNKNOWN

    def __init__(
        self,
        details: str,
        *,
        code: grpc.StatusCode | None = None,
        method: str = "",
        state: RoomState = RoomState.UNSPECIFIED,
        reason: str = "",
        peer_reason: str = "",
        field: str = "",
    ) -> None:
        super().__init__(f"{method}: {code.name if code else self.code.name}: {details}")
        if code is not None:
            self.code = code
        self.details = details
        self.method = method
        self.state = state
        self.reason = reason
        self.peer_reason = peer_reason
        self.field = field


class InvalidArgument(PdlinkError):
    """A malformed request: bad pages, a bad layout, a rank with no region."""

    code = grpc.StatusCode.INVALID_ARGUMENT


class NotFound(PdlinkError):
    """The daemon holds no room with this id."""

    code = grpc.StatusCode.NOT_FOUND


class AlreadyExists(PdlinkError):
    """A live room has this id, or the room already has other metadata."""

    code = grpc.StatusCode.ALREADY_EXISTS


class FailedPrecondition(PdlinkError):
    """The room is not in a state that takes the call (still Bootstrapping, or Failed)."""

    code = grpc.StatusCode.FAILED_PRECONDITION


class ResourceExhausted(PdlinkError):
    """Over a daemon limit (--max-rooms)."""

    code = grpc.StatusCode.RESOURCE_EXHAUSTED


class PermissionDenied(PdlinkError):
    """A region file outside the daemon's --region-dir, or not the daemon's to map."""

    code = grpc.StatusCode.PERMISSION_DENIED


class Unavailable(PdlinkError):
    """The daemon is not reachable, or draining."""

    code = grpc.StatusCode.UNAVAILABLE


class DeadlineExceeded(PdlinkError):
    """The call's deadline passed (a last Send still goes once admitted)."""

    code = grpc.StatusCode.DEADLINE_EXCEEDED


_BY_CODE: dict[grpc.StatusCode, type[PdlinkError]] = {
    c.code: c
    for c in (
        InvalidArgument,
        NotFound,
        AlreadyExists,
        FailedPrecondition,
        ResourceExhausted,
        PermissionDenied,
        Unavailable,
        DeadlineExceeded,
    )
}


def from_rpc_error(err: grpc.RpcError, method: str) -> PdlinkError:
    """The typed error for a failed call, with the details the daemon attached."""
    code = err.code() if isinstance(err, grpc.Call) else grpc.StatusCode.UNKNOWN
    details = (err.details() if isinstance(err, grpc.Call) else None) or str(err)
    extra: dict[str, Any] = {}
    if isinstance(err, grpc.Call):
        for key, value in err.trailing_metadata() or ():
            if key == _DETAILS_KEY:
                extra = _parse_details(value)
    cls = _BY_CODE.get(code, PdlinkError)
    return cls(details, code=code, method=method, **extra)


def _parse_details(blob: bytes) -> dict[str, Any]:
    out: dict[str, Any] = {}
    try:
        st = status_pb2.Status.FromString(blob)
    except Exception:  # a detail we cannot read leaves the message, not a new error
        return out
    for any_msg in st.details:
        info = error_details_pb2.ErrorInfo()
        if any_msg.Unpack(info) and info.reason == "ROOM_FAILED":
            name = info.metadata.get("state", "").removeprefix("ROOM_STATE_")
            out["state"] = (
                RoomState(name) if name in RoomState.__members__ else RoomState.UNSPECIFIED
            )
            out["reason"] = info.metadata.get("reason", "")
            out["peer_reason"] = info.metadata.get("peer_reason", "")
            continue
        bad = error_details_pb2.BadRequest()
        if any_msg.Unpack(bad) and bad.field_violations:
            out["field"] = bad.field_violations[0].field
    return out
