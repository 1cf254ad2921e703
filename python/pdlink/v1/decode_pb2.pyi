from pdlink.v1 import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class DecodeServiceRegisterRegionRequest(_message.Message):
    __slots__ = ("region_path", "layout")
    REGION_PATH_FIELD_NUMBER: _ClassVar[int]
    LAYOUT_FIELD_NUMBER: _ClassVar[int]
    region_path: str
    layout: _common_pb2.RegionLayout
    def __init__(self, region_path: _Optional[str] = ..., layout: _Optional[_Union[_common_pb2.RegionLayout, _Mapping]] = ...) -> None: ...

class DecodeServiceRegisterRegionResponse(_message.Message):
    __slots__ = ("region_id", "generation", "device", "inode", "rooms_failed")
    REGION_ID_FIELD_NUMBER: _ClassVar[int]
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    DEVICE_FIELD_NUMBER: _ClassVar[int]
    INODE_FIELD_NUMBER: _ClassVar[int]
    ROOMS_FAILED_FIELD_NUMBER: _ClassVar[int]
    region_id: str
    generation: int
    device: int
    inode: int
    rooms_failed: int
    def __init__(self, region_id: _Optional[str] = ..., generation: _Optional[int] = ..., device: _Optional[int] = ..., inode: _Optional[int] = ..., rooms_failed: _Optional[int] = ...) -> None: ...

class DecodeServiceUnregisterRegionRequest(_message.Message):
    __slots__ = ("rank",)
    RANK_FIELD_NUMBER: _ClassVar[int]
    rank: _common_pb2.Rank
    def __init__(self, rank: _Optional[_Union[_common_pb2.Rank, _Mapping]] = ...) -> None: ...

class DecodeServiceUnregisterRegionResponse(_message.Message):
    __slots__ = ("unregistered", "generation", "rooms_failed")
    UNREGISTERED_FIELD_NUMBER: _ClassVar[int]
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    ROOMS_FAILED_FIELD_NUMBER: _ClassVar[int]
    unregistered: bool
    generation: int
    rooms_failed: int
    def __init__(self, unregistered: _Optional[bool] = ..., generation: _Optional[int] = ..., rooms_failed: _Optional[int] = ...) -> None: ...

class OpenReceiverRequest(_message.Message):
    __slots__ = ("room_id", "prefill_bootstrap_addr", "expected_senders", "rank")
    ROOM_ID_FIELD_NUMBER: _ClassVar[int]
    PREFILL_BOOTSTRAP_ADDR_FIELD_NUMBER: _ClassVar[int]
    EXPECTED_SENDERS_FIELD_NUMBER: _ClassVar[int]
    RANK_FIELD_NUMBER: _ClassVar[int]
    room_id: int
    prefill_bootstrap_addr: str
    expected_senders: int
    rank: _common_pb2.Rank
    def __init__(self, room_id: _Optional[int] = ..., prefill_bootstrap_addr: _Optional[str] = ..., expected_senders: _Optional[int] = ..., rank: _Optional[_Union[_common_pb2.Rank, _Mapping]] = ...) -> None: ...

class OpenReceiverResponse(_message.Message):
    __slots__ = ("status",)
    STATUS_FIELD_NUMBER: _ClassVar[int]
    status: _common_pb2.RoomStatus
    def __init__(self, status: _Optional[_Union[_common_pb2.RoomStatus, _Mapping]] = ...) -> None: ...

class SendMetadataRequest(_message.Message):
    __slots__ = ("room_id", "rank", "dst_pages", "aux_index", "prefix_len")
    ROOM_ID_FIELD_NUMBER: _ClassVar[int]
    RANK_FIELD_NUMBER: _ClassVar[int]
    DST_PAGES_FIELD_NUMBER: _ClassVar[int]
    AUX_INDEX_FIELD_NUMBER: _ClassVar[int]
    PREFIX_LEN_FIELD_NUMBER: _ClassVar[int]
    room_id: int
    rank: _common_pb2.Rank
    dst_pages: _common_pb2.PageList
    aux_index: int
    prefix_len: int
    def __init__(self, room_id: _Optional[int] = ..., rank: _Optional[_Union[_common_pb2.Rank, _Mapping]] = ..., dst_pages: _Optional[_Union[_common_pb2.PageList, _Mapping]] = ..., aux_index: _Optional[int] = ..., prefix_len: _Optional[int] = ...) -> None: ...

class SendMetadataResponse(_message.Message):
    __slots__ = ("status",)
    STATUS_FIELD_NUMBER: _ClassVar[int]
    status: _common_pb2.RoomStatus
    def __init__(self, status: _Optional[_Union[_common_pb2.RoomStatus, _Mapping]] = ...) -> None: ...

class DecodeServicePollRequest(_message.Message):
    __slots__ = ("room_ids",)
    ROOM_IDS_FIELD_NUMBER: _ClassVar[int]
    room_ids: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, room_ids: _Optional[_Iterable[int]] = ...) -> None: ...

class DecodeServicePollResponse(_message.Message):
    __slots__ = ("statuses",)
    STATUSES_FIELD_NUMBER: _ClassVar[int]
    statuses: _containers.RepeatedCompositeFieldContainer[_common_pb2.RoomStatus]
    def __init__(self, statuses: _Optional[_Iterable[_Union[_common_pb2.RoomStatus, _Mapping]]] = ...) -> None: ...

class DecodeServiceWatchRequest(_message.Message):
    __slots__ = ("filter",)
    FILTER_FIELD_NUMBER: _ClassVar[int]
    filter: _common_pb2.WatchFilter
    def __init__(self, filter: _Optional[_Union[_common_pb2.WatchFilter, _Mapping]] = ...) -> None: ...

class DecodeServiceWatchResponse(_message.Message):
    __slots__ = ("event",)
    EVENT_FIELD_NUMBER: _ClassVar[int]
    event: _common_pb2.WatchEvent
    def __init__(self, event: _Optional[_Union[_common_pb2.WatchEvent, _Mapping]] = ...) -> None: ...

class DecodeServiceAbortRequest(_message.Message):
    __slots__ = ("room_id", "reason")
    ROOM_ID_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    room_id: int
    reason: str
    def __init__(self, room_id: _Optional[int] = ..., reason: _Optional[str] = ...) -> None: ...

class DecodeServiceAbortResponse(_message.Message):
    __slots__ = ("status",)
    STATUS_FIELD_NUMBER: _ClassVar[int]
    status: _common_pb2.RoomStatus
    def __init__(self, status: _Optional[_Union[_common_pb2.RoomStatus, _Mapping]] = ...) -> None: ...

class DecodeServiceClearRequest(_message.Message):
    __slots__ = ("room_ids",)
    ROOM_IDS_FIELD_NUMBER: _ClassVar[int]
    room_ids: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, room_ids: _Optional[_Iterable[int]] = ...) -> None: ...

class DecodeServiceClearResponse(_message.Message):
    __slots__ = ("results",)
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    results: _containers.RepeatedCompositeFieldContainer[_common_pb2.ClearResult]
    def __init__(self, results: _Optional[_Iterable[_Union[_common_pb2.ClearResult, _Mapping]]] = ...) -> None: ...
