import datetime

from google.protobuf import duration_pb2 as _duration_pb2
from pdlink.v1 import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ListRoomsRequest(_message.Message):
    __slots__ = ("state", "min_age", "peer", "page_size", "page_token")
    STATE_FIELD_NUMBER: _ClassVar[int]
    MIN_AGE_FIELD_NUMBER: _ClassVar[int]
    PEER_FIELD_NUMBER: _ClassVar[int]
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    state: _common_pb2.RoomState
    min_age: _duration_pb2.Duration
    peer: str
    page_size: int
    page_token: str
    def __init__(self, state: _Optional[_Union[_common_pb2.RoomState, str]] = ..., min_age: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., peer: _Optional[str] = ..., page_size: _Optional[int] = ..., page_token: _Optional[str] = ...) -> None: ...

class ListRoomsResponse(_message.Message):
    __slots__ = ("rooms", "next_page_token")
    ROOMS_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    rooms: _containers.RepeatedCompositeFieldContainer[_common_pb2.RoomInfo]
    next_page_token: str
    def __init__(self, rooms: _Optional[_Iterable[_Union[_common_pb2.RoomInfo, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class GetRoomRequest(_message.Message):
    __slots__ = ("room_id",)
    ROOM_ID_FIELD_NUMBER: _ClassVar[int]
    room_id: int
    def __init__(self, room_id: _Optional[int] = ...) -> None: ...

class GetRoomResponse(_message.Message):
    __slots__ = ("room",)
    ROOM_FIELD_NUMBER: _ClassVar[int]
    room: _common_pb2.RoomInfo
    def __init__(self, room: _Optional[_Union[_common_pb2.RoomInfo, _Mapping]] = ...) -> None: ...
