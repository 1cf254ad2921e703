from pdlink.v1 import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class AckResult(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    ACK_RESULT_UNSPECIFIED: _ClassVar[AckResult]
    ACK_RESULT_APPLIED: _ClassVar[AckResult]
    ACK_RESULT_NOT_OPEN: _ClassVar[AckResult]
    ACK_RESULT_ENDED: _ClassVar[AckResult]
    ACK_RESULT_REJECTED: _ClassVar[AckResult]
ACK_RESULT_UNSPECIFIED: AckResult
ACK_RESULT_APPLIED: AckResult
ACK_RESULT_NOT_OPEN: AckResult
ACK_RESULT_ENDED: AckResult
ACK_RESULT_REJECTED: AckResult

class Envelope(_message.Message):
    __slots__ = ("protocol_version", "sender_instance", "epoch", "seq", "mac", "register", "metadata", "abort", "abort_ack", "status", "heartbeat", "ack", "goodbye")
    PROTOCOL_VERSION_FIELD_NUMBER: _ClassVar[int]
    SENDER_INSTANCE_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    SEQ_FIELD_NUMBER: _ClassVar[int]
    MAC_FIELD_NUMBER: _ClassVar[int]
    REGISTER_FIELD_NUMBER: _ClassVar[int]
    METADATA_FIELD_NUMBER: _ClassVar[int]
    ABORT_FIELD_NUMBER: _ClassVar[int]
    ABORT_ACK_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    HEARTBEAT_FIELD_NUMBER: _ClassVar[int]
    ACK_FIELD_NUMBER: _ClassVar[int]
    GOODBYE_FIELD_NUMBER: _ClassVar[int]
    protocol_version: int
    sender_instance: str
    epoch: int
    seq: int
    mac: bytes
    register: Register
    metadata: Metadata
    abort: Abort
    abort_ack: AbortAck
    status: Status
    heartbeat: Heartbeat
    ack: Ack
    goodbye: Goodbye
    def __init__(self, protocol_version: _Optional[int] = ..., sender_instance: _Optional[str] = ..., epoch: _Optional[int] = ..., seq: _Optional[int] = ..., mac: _Optional[bytes] = ..., register: _Optional[_Union[Register, _Mapping]] = ..., metadata: _Optional[_Union[Metadata, _Mapping]] = ..., abort: _Optional[_Union[Abort, _Mapping]] = ..., abort_ack: _Optional[_Union[AbortAck, _Mapping]] = ..., status: _Optional[_Union[Status, _Mapping]] = ..., heartbeat: _Optional[_Union[Heartbeat, _Mapping]] = ..., ack: _Optional[_Union[Ack, _Mapping]] = ..., goodbye: _Optional[_Union[Goodbye, _Mapping]] = ...) -> None: ...

class Register(_message.Message):
    __slots__ = ("instance_id", "data_endpoint", "layouts")
    INSTANCE_ID_FIELD_NUMBER: _ClassVar[int]
    DATA_ENDPOINT_FIELD_NUMBER: _ClassVar[int]
    LAYOUTS_FIELD_NUMBER: _ClassVar[int]
    instance_id: str
    data_endpoint: str
    layouts: _containers.RepeatedCompositeFieldContainer[_common_pb2.RegionLayout]
    def __init__(self, instance_id: _Optional[str] = ..., data_endpoint: _Optional[str] = ..., layouts: _Optional[_Iterable[_Union[_common_pb2.RegionLayout, _Mapping]]] = ...) -> None: ...

class Metadata(_message.Message):
    __slots__ = ("room_id", "nonce", "rank", "dst_pages", "aux_index", "expected_senders", "prefix_len")
    ROOM_ID_FIELD_NUMBER: _ClassVar[int]
    NONCE_FIELD_NUMBER: _ClassVar[int]
    RANK_FIELD_NUMBER: _ClassVar[int]
    DST_PAGES_FIELD_NUMBER: _ClassVar[int]
    AUX_INDEX_FIELD_NUMBER: _ClassVar[int]
    EXPECTED_SENDERS_FIELD_NUMBER: _ClassVar[int]
    PREFIX_LEN_FIELD_NUMBER: _ClassVar[int]
    room_id: int
    nonce: int
    rank: _common_pb2.Rank
    dst_pages: _common_pb2.PageList
    aux_index: int
    expected_senders: int
    prefix_len: int
    def __init__(self, room_id: _Optional[int] = ..., nonce: _Optional[int] = ..., rank: _Optional[_Union[_common_pb2.Rank, _Mapping]] = ..., dst_pages: _Optional[_Union[_common_pb2.PageList, _Mapping]] = ..., aux_index: _Optional[int] = ..., expected_senders: _Optional[int] = ..., prefix_len: _Optional[int] = ...) -> None: ...

class Abort(_message.Message):
    __slots__ = ("room_id", "nonce", "reason")
    ROOM_ID_FIELD_NUMBER: _ClassVar[int]
    NONCE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    room_id: int
    nonce: int
    reason: str
    def __init__(self, room_id: _Optional[int] = ..., nonce: _Optional[int] = ..., reason: _Optional[str] = ...) -> None: ...

class AbortAck(_message.Message):
    __slots__ = ("room_id", "nonce")
    ROOM_ID_FIELD_NUMBER: _ClassVar[int]
    NONCE_FIELD_NUMBER: _ClassVar[int]
    room_id: int
    nonce: int
    def __init__(self, room_id: _Optional[int] = ..., nonce: _Optional[int] = ...) -> None: ...

class Status(_message.Message):
    __slots__ = ("room_id", "nonce", "rank", "state", "reason")
    ROOM_ID_FIELD_NUMBER: _ClassVar[int]
    NONCE_FIELD_NUMBER: _ClassVar[int]
    RANK_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    room_id: int
    nonce: int
    rank: _common_pb2.Rank
    state: _common_pb2.RoomState
    reason: str
    def __init__(self, room_id: _Optional[int] = ..., nonce: _Optional[int] = ..., rank: _Optional[_Union[_common_pb2.Rank, _Mapping]] = ..., state: _Optional[_Union[_common_pb2.RoomState, str]] = ..., reason: _Optional[str] = ...) -> None: ...

class Heartbeat(_message.Message):
    __slots__ = ("live_rooms",)
    LIVE_ROOMS_FIELD_NUMBER: _ClassVar[int]
    live_rooms: int
    def __init__(self, live_rooms: _Optional[int] = ...) -> None: ...

class Goodbye(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class Ack(_message.Message):
    __slots__ = ("acked_seq", "result", "reason")
    ACKED_SEQ_FIELD_NUMBER: _ClassVar[int]
    RESULT_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    acked_seq: int
    result: AckResult
    reason: str
    def __init__(self, acked_seq: _Optional[int] = ..., result: _Optional[_Union[AckResult, str]] = ..., reason: _Optional[str] = ...) -> None: ...
