import datetime

from google.protobuf import duration_pb2 as _duration_pb2
from google.protobuf import timestamp_pb2 as _timestamp_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class RoomState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    ROOM_STATE_UNSPECIFIED: _ClassVar[RoomState]
    ROOM_STATE_BOOTSTRAPPING: _ClassVar[RoomState]
    ROOM_STATE_WAITING_FOR_INPUT: _ClassVar[RoomState]
    ROOM_STATE_TRANSFERRING: _ClassVar[RoomState]
    ROOM_STATE_SUCCESS: _ClassVar[RoomState]
    ROOM_STATE_FAILED: _ClassVar[RoomState]

class Side(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    SIDE_UNSPECIFIED: _ClassVar[Side]
    SIDE_PREFILL: _ClassVar[Side]
    SIDE_DECODE: _ClassVar[Side]

class Attention(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    ATTENTION_UNSPECIFIED: _ClassVar[Attention]
    ATTENTION_MHA: _ClassVar[Attention]
    ATTENTION_MLA: _ClassVar[Attention]
ROOM_STATE_UNSPECIFIED: RoomState
ROOM_STATE_BOOTSTRAPPING: RoomState
ROOM_STATE_WAITING_FOR_INPUT: RoomState
ROOM_STATE_TRANSFERRING: RoomState
ROOM_STATE_SUCCESS: RoomState
ROOM_STATE_FAILED: RoomState
SIDE_UNSPECIFIED: Side
SIDE_PREFILL: Side
SIDE_DECODE: Side
ATTENTION_UNSPECIFIED: Attention
ATTENTION_MHA: Attention
ATTENTION_MLA: Attention

class PageRun(_message.Message):
    __slots__ = ("start", "count")
    START_FIELD_NUMBER: _ClassVar[int]
    COUNT_FIELD_NUMBER: _ClassVar[int]
    start: int
    count: int
    def __init__(self, start: _Optional[int] = ..., count: _Optional[int] = ...) -> None: ...

class PageList(_message.Message):
    __slots__ = ("indices", "runs")
    INDICES_FIELD_NUMBER: _ClassVar[int]
    RUNS_FIELD_NUMBER: _ClassVar[int]
    indices: _containers.RepeatedScalarFieldContainer[int]
    runs: _containers.RepeatedCompositeFieldContainer[PageRun]
    def __init__(self, indices: _Optional[_Iterable[int]] = ..., runs: _Optional[_Iterable[_Union[PageRun, _Mapping]]] = ...) -> None: ...

class Rank(_message.Message):
    __slots__ = ("tp_rank", "tp_size")
    TP_RANK_FIELD_NUMBER: _ClassVar[int]
    TP_SIZE_FIELD_NUMBER: _ClassVar[int]
    tp_rank: int
    tp_size: int
    def __init__(self, tp_rank: _Optional[int] = ..., tp_size: _Optional[int] = ...) -> None: ...

class BufferSpec(_message.Message):
    __slots__ = ("offset", "length", "item_len", "page_tokens", "total_heads", "rank_heads", "head_bytes")
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    LENGTH_FIELD_NUMBER: _ClassVar[int]
    ITEM_LEN_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKENS_FIELD_NUMBER: _ClassVar[int]
    TOTAL_HEADS_FIELD_NUMBER: _ClassVar[int]
    RANK_HEADS_FIELD_NUMBER: _ClassVar[int]
    HEAD_BYTES_FIELD_NUMBER: _ClassVar[int]
    offset: int
    length: int
    item_len: int
    page_tokens: int
    total_heads: int
    rank_heads: int
    head_bytes: int
    def __init__(self, offset: _Optional[int] = ..., length: _Optional[int] = ..., item_len: _Optional[int] = ..., page_tokens: _Optional[int] = ..., total_heads: _Optional[int] = ..., rank_heads: _Optional[int] = ..., head_bytes: _Optional[int] = ...) -> None: ...

class AuxSpec(_message.Message):
    __slots__ = ("offset", "row_len", "rows")
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    ROW_LEN_FIELD_NUMBER: _ClassVar[int]
    ROWS_FIELD_NUMBER: _ClassVar[int]
    offset: int
    row_len: int
    rows: int
    def __init__(self, offset: _Optional[int] = ..., row_len: _Optional[int] = ..., rows: _Optional[int] = ...) -> None: ...

class RegionLayout(_message.Message):
    __slots__ = ("rank", "buffers", "aux", "attention")
    RANK_FIELD_NUMBER: _ClassVar[int]
    BUFFERS_FIELD_NUMBER: _ClassVar[int]
    AUX_FIELD_NUMBER: _ClassVar[int]
    ATTENTION_FIELD_NUMBER: _ClassVar[int]
    rank: Rank
    buffers: _containers.RepeatedCompositeFieldContainer[BufferSpec]
    aux: AuxSpec
    attention: Attention
    def __init__(self, rank: _Optional[_Union[Rank, _Mapping]] = ..., buffers: _Optional[_Iterable[_Union[BufferSpec, _Mapping]]] = ..., aux: _Optional[_Union[AuxSpec, _Mapping]] = ..., attention: _Optional[_Union[Attention, str]] = ...) -> None: ...

class RoomStatus(_message.Message):
    __slots__ = ("room_id", "nonce", "found", "state", "reason", "peer_reason", "prefix_len")
    ROOM_ID_FIELD_NUMBER: _ClassVar[int]
    NONCE_FIELD_NUMBER: _ClassVar[int]
    FOUND_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    PEER_REASON_FIELD_NUMBER: _ClassVar[int]
    PREFIX_LEN_FIELD_NUMBER: _ClassVar[int]
    room_id: int
    nonce: int
    found: bool
    state: RoomState
    reason: str
    peer_reason: str
    prefix_len: int
    def __init__(self, room_id: _Optional[int] = ..., nonce: _Optional[int] = ..., found: _Optional[bool] = ..., state: _Optional[_Union[RoomState, str]] = ..., reason: _Optional[str] = ..., peer_reason: _Optional[str] = ..., prefix_len: _Optional[int] = ...) -> None: ...

class Transition(_message.Message):
    __slots__ = ("room_id", "nonce", "to", "reason", "at", "peer_reason", "prefix_len")
    ROOM_ID_FIELD_NUMBER: _ClassVar[int]
    NONCE_FIELD_NUMBER: _ClassVar[int]
    FROM_FIELD_NUMBER: _ClassVar[int]
    TO_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    AT_FIELD_NUMBER: _ClassVar[int]
    PEER_REASON_FIELD_NUMBER: _ClassVar[int]
    PREFIX_LEN_FIELD_NUMBER: _ClassVar[int]
    room_id: int
    nonce: int
    to: RoomState
    reason: str
    at: _timestamp_pb2.Timestamp
    peer_reason: str
    prefix_len: int
    def __init__(self, room_id: _Optional[int] = ..., nonce: _Optional[int] = ..., to: _Optional[_Union[RoomState, str]] = ..., reason: _Optional[str] = ..., at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., peer_reason: _Optional[str] = ..., prefix_len: _Optional[int] = ..., **kwargs) -> None: ...

class RoomInfo(_message.Message):
    __slots__ = ("room_id", "nonce", "side", "state", "visible_state", "reason", "peer", "created_at", "age", "state_age", "deadline", "history", "history_dropped", "peer_reason")
    ROOM_ID_FIELD_NUMBER: _ClassVar[int]
    NONCE_FIELD_NUMBER: _ClassVar[int]
    SIDE_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    VISIBLE_STATE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    PEER_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_FIELD_NUMBER: _ClassVar[int]
    AGE_FIELD_NUMBER: _ClassVar[int]
    STATE_AGE_FIELD_NUMBER: _ClassVar[int]
    DEADLINE_FIELD_NUMBER: _ClassVar[int]
    HISTORY_FIELD_NUMBER: _ClassVar[int]
    HISTORY_DROPPED_FIELD_NUMBER: _ClassVar[int]
    PEER_REASON_FIELD_NUMBER: _ClassVar[int]
    room_id: int
    nonce: int
    side: Side
    state: RoomState
    visible_state: RoomState
    reason: str
    peer: str
    created_at: _timestamp_pb2.Timestamp
    age: _duration_pb2.Duration
    state_age: _duration_pb2.Duration
    deadline: _timestamp_pb2.Timestamp
    history: _containers.RepeatedCompositeFieldContainer[Transition]
    history_dropped: int
    peer_reason: str
    def __init__(self, room_id: _Optional[int] = ..., nonce: _Optional[int] = ..., side: _Optional[_Union[Side, str]] = ..., state: _Optional[_Union[RoomState, str]] = ..., visible_state: _Optional[_Union[RoomState, str]] = ..., reason: _Optional[str] = ..., peer: _Optional[str] = ..., created_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., age: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., state_age: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., deadline: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., history: _Optional[_Iterable[_Union[Transition, _Mapping]]] = ..., history_dropped: _Optional[int] = ..., peer_reason: _Optional[str] = ...) -> None: ...

class WatchFilter(_message.Message):
    __slots__ = ("to_states", "room_ids")
    TO_STATES_FIELD_NUMBER: _ClassVar[int]
    ROOM_IDS_FIELD_NUMBER: _ClassVar[int]
    to_states: _containers.RepeatedScalarFieldContainer[RoomState]
    room_ids: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, to_states: _Optional[_Iterable[_Union[RoomState, str]]] = ..., room_ids: _Optional[_Iterable[int]] = ...) -> None: ...

class WatchEvent(_message.Message):
    __slots__ = ("transition", "missed")
    TRANSITION_FIELD_NUMBER: _ClassVar[int]
    MISSED_FIELD_NUMBER: _ClassVar[int]
    transition: Transition
    missed: int
    def __init__(self, transition: _Optional[_Union[Transition, _Mapping]] = ..., missed: _Optional[int] = ...) -> None: ...

class ClearResult(_message.Message):
    __slots__ = ("room_id", "cleared", "error")
    ROOM_ID_FIELD_NUMBER: _ClassVar[int]
    CLEARED_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    room_id: int
    cleared: bool
    error: str
    def __init__(self, room_id: _Optional[int] = ..., cleared: _Optional[bool] = ..., error: _Optional[str] = ...) -> None: ...
