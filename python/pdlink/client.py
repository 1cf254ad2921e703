"""PrefillClient and DecodeClient: a scheduler's calls to prefilld and decoded.

Each client holds one gRPC channel (a unix socket "unix:///path" or TCP
"host:port") and, unless watch=False, a background thread that keeps a
status cache fed by the daemon's Watch stream, so status(room) is a dict
lookup and a scheduler's per-request poll costs no RPC.

Every call has a deadline (timeout, default the client's). A call the
.proto says is safe to repeat (RegisterRegion, UnregisterRegion, Send,
SendMetadata, Poll, Abort, Clear) is retried a bounded number of times with
backoff when the daemon is Unavailable; OpenSender and OpenReceiver are
not (a repeat would answer AlreadyExists, or draw another nonce). A failed
call raises a PdlinkError subclass of its gRPC code.

A daemon that restarts forgets every region. A region registered with
keep_region() is registered again each time the Watch stream subscribes,
before the stream reports connected, and before an open while the stream is
down; an OpenReceiver refused for want of it registers it and opens once
more. register_region() registers once and leaves restarts to the caller.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import grpc
import grpc.experimental

from pdlink.errors import FailedPrecondition, PdlinkError, from_rpc_error
from pdlink.region import Region, RegionLayout
from pdlink.states import RoomState, RoomStatus, moves_forward
from pdlink.v1 import common_pb2, decode_pb2, decode_pb2_grpc, prefill_pb2, prefill_pb2_grpc

# The most room ids one Poll or Clear takes (the .proto's bound).
MAX_BATCH = 65536

# How many untracked rooms' latest transitions the cache keeps (see
# StatusCache._untracked).
_UNTRACKED_KEPT = 4096

# Response header a Watch stream sends once it is subscribed (the daemon's
# service.WatchHeader): transitions after it are not missed, so a resync Poll
# taken after it leaves no gap.
_WATCH_HEADER = "pdlink-watch"

# The daemon's refusal of a call that needs a registered region.
_NO_REGION = "no region registered"

logger = logging.getLogger("pdlink.client")

# Reconnect quickly after a daemon restart: gRPC's default backoff starts at
# 1 s and grows to 120 s, longer than a scheduler waits.
_CHANNEL_OPTIONS = (
    ("grpc.initial_reconnect_backoff_ms", 50),
    ("grpc.min_reconnect_backoff_ms", 50),
    ("grpc.max_reconnect_backoff_ms", 1000),
    # Watch is the channel's only unary-stream call. Single-threaded, its
    # events are read on the watch thread itself, not handed to it by grpc's
    # channel-spin thread: one thread wake-up and GIL hand-off per
    # transition instead of two, each competing with the scheduler's thread
    # (per-thread CPU over 256 backend rooms: about 130 ms -> 80 ms).
    (grpc.experimental.ChannelOptions.SingleThreadedUnaryStream, 1),
)


class Rank(NamedTuple):
    """A tensor-parallel rank: rank=(tp_rank, tp_size) wherever a call has one."""

    tp_rank: int
    tp_size: int


@dataclass(frozen=True, slots=True)
class RegisterResult:
    """RegisterRegion's answer: the mapped file's identity and generation."""

    region_id: str
    generation: int
    device: int
    inode: int
    rooms_failed: int


@dataclass(frozen=True, slots=True)
class UnregisterResult:
    """UnregisterRegion's answer (unregistered False: the rank had no region)."""

    unregistered: bool
    generation: int
    rooms_failed: int


@dataclass(frozen=True, slots=True)
class ClearResult:
    """One room's Clear outcome; error is "", "NOT_FOUND" or "NOT_TERMINAL"."""

    room_id: int
    cleared: bool
    error: str


def _rank_proto(rank: Sequence[int]) -> common_pb2.Rank:
    tp_rank, tp_size = rank
    return common_pb2.Rank(tp_rank=tp_rank, tp_size=tp_size)


def _page_list(pages: Any) -> common_pb2.PageList:
    """A PageList from page indices (a sequence or numpy array) or a range (one run)."""
    if isinstance(pages, common_pb2.PageList):
        return pages
    if isinstance(pages, range) and pages.step == 1:
        if len(pages) == 0:
            return common_pb2.PageList()
        return common_pb2.PageList(runs=[common_pb2.PageRun(start=pages.start, count=len(pages))])
    tolist = getattr(pages, "tolist", None)
    return common_pb2.PageList(indices=tolist() if tolist else list(pages))


def _has_field(msg_type: Any, name: str) -> bool:
    return name in msg_type.DESCRIPTOR.fields_by_name


class StatusCache:
    """Room statuses kept current by a Watch stream; see _Client.status.

    Only rooms the client opened are kept; clearing one drops it. The watch
    thread re-syncs them with one batched Poll whenever the stream says it
    missed transitions and whenever it reconnects (after a daemon restart
    the rooms the daemon lost come back found=False).
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._rooms: dict[int, RoomStatus] = {}
        # seq orders writes: a resync Poll answer does not overwrite a room
        # that a call answered after the Poll was sent.
        self._seq = 0
        self._written: dict[int, int] = {}
        # The latest transition of each room not (yet) tracked: a room's first
        # transitions can reach the watch thread before its open call's
        # answer does, and put() must not lose them.
        self._untracked: OrderedDict[int, common_pb2.Transition] = OrderedDict()
        # Rooms whose terminal status came from a call's answer, not from the
        # stream: their terminal transition is still to come on the stream.
        self._terminal_unseen: set[int] = set()
        # Rooms cleared before the stream delivered their terminal transition,
        # with the cleared room's nonce: transitions of that nonce belong to
        # it, not to a later room opened with the same id, and are dropped
        # until its terminal one arrives. (A room cleared unbound, nonce 0,
        # holds back a later unbound room's transitions until then; calls'
        # answers and resyncs still reach it.)
        self._stale: OrderedDict[int, int] = OrderedDict()
        self.missed = 0  # transitions the daemon reported missed, in total
        self.resyncs = 0  # batched Polls the watch thread made
        self.reconnects = 0  # Watch streams opened after the first
        self.connected = threading.Event()  # set while a subscribed stream runs
        # time.monotonic() when the stream was lost (None while connected): the
        # cached statuses are not updated meanwhile, so a scheduler that must
        # not wait on a dead daemon fails its rooms past a bound of its own.
        self.disconnected_since: float | None = time.monotonic()
        # get(room_id) is the dict's own get, not a method around it: a
        # scheduler tick reads every queued room, and one C call per room
        # instead of a Python frame is most of that tick's cost. The read
        # takes no lock: a dict lookup is atomic under the GIL and _rooms is
        # never rebound, and statuses are immutable, replaced whole.
        self.get: Callable[[int], RoomStatus | None] = self._rooms.get

    def rooms(self) -> list[int]:
        with self._lock:
            return list(self._rooms)

    def mark(self) -> int:
        with self._lock:
            return self._seq

    def put(self, st: RoomStatus) -> None:
        """A call's answer: newer than anything cached, so it is taken as is unless
        it moves a room of the same nonce backward (a transition that raced it)."""
        with self._lock:
            cur = self._rooms.get(st.room_id)
            if cur is not None and cur.found and st.found and cur.nonce == st.nonce:
                if cur.state == st.state and cur.reason == st.reason:
                    return
                if not moves_forward(cur.state, st.state):
                    return
            fresh = cur is None or not cur.found
            early = self._untracked.pop(st.room_id, None) if fresh else None
            self._seq += 1
            self._rooms[st.room_id] = st
            self._written[st.room_id] = self._seq
            self._note_terminal(st)
            if early is not None:
                self._apply(early)

    def observe(self, st: RoomStatus) -> None:
        """A call's status of a room it names: kept only if the room is tracked."""
        if st.room_id in self._rooms:
            self.put(st)

    def resynced(self, statuses: Iterable[RoomStatus], since: int) -> None:
        """A Poll sent at mark since: taken for every room not written after it."""
        with self._lock:
            for st in statuses:
                if st.room_id not in self._rooms or self._written.get(st.room_id, 0) > since:
                    continue
                self._seq += 1
                self._rooms[st.room_id] = st
                self._written[st.room_id] = self._seq
                self._note_terminal(st)

    def _note_terminal(self, st: RoomStatus) -> None:
        if st.found and st.state.terminal:
            self._terminal_unseen.add(st.room_id)
        else:
            self._terminal_unseen.discard(st.room_id)

    def transition(self, tr: common_pb2.Transition) -> None:
        with self._lock:
            old = self._stale.get(tr.room_id)
            if old is not None and tr.nonce == old:
                if RoomState.from_proto(tr.to).terminal:
                    del self._stale[tr.room_id]
                return
            if tr.room_id not in self._rooms:
                self._stash(tr)
                return
            self._apply(tr)

    def _stash(self, tr: common_pb2.Transition) -> None:
        self._untracked[tr.room_id] = tr
        self._untracked.move_to_end(tr.room_id)
        if len(self._untracked) > _UNTRACKED_KEPT:
            self._untracked.popitem(last=False)

    def _apply(self, tr: common_pb2.Transition) -> None:
        to = RoomState.from_proto(tr.to)
        cur = self._rooms[tr.room_id]
        if not cur.found:
            # Lost (reaped, a daemon restart): a transition now is a new room's
            # with this id, which an open may yet claim.
            self._stash(tr)
            return
        if cur.nonce and tr.nonce and cur.nonce != tr.nonce:
            return  # another request's room with the same id
        if not moves_forward(cur.state, to):
            return
        self._seq += 1
        self._rooms[tr.room_id] = RoomStatus(
            room_id=tr.room_id,
            nonce=tr.nonce or cur.nonce,
            found=True,
            state=to,
            reason=tr.reason,
            peer_reason=tr.peer_reason,
            prefix_len=tr.prefix_len,
        )
        self._written[tr.room_id] = self._seq
        self._terminal_unseen.discard(tr.room_id)

    def drop(self, room_id: int) -> None:
        with self._lock:
            cur = self._rooms.pop(room_id, None)
            self._written.pop(room_id, None)
            self._untracked.pop(room_id, None)
            if cur is not None and room_id in self._terminal_unseen:
                self._terminal_unseen.discard(room_id)
                self._stale[room_id] = cur.nonce
                if len(self._stale) > _UNTRACKED_KEPT:
                    self._stale.popitem(last=False)


class _Client:
    """What PrefillClient and DecodeClient share; not used directly."""

    _stub_type: Callable[[grpc.Channel], Any]
    _pb: Any
    _poll_req: Any
    _watch_req: Any
    _abort_req: Any
    _clear_req: Any
    _register_req: Any
    _unregister_req: Any

    def __init__(
        self,
        address: str,
        *,
        timeout: float = 10.0,
        retries: int = 4,
        backoff: float = 0.05,
        watch: bool = True,
        channel_options: Sequence[tuple[str, Any]] = (),
    ) -> None:
        """address is "unix:///path/to.sock" or "host:port".

        timeout is every call's default deadline in seconds; retries and
        backoff bound the retries of a safe call on Unavailable (backoff,
        doubling each time). watch=False keeps no status cache: status()
        then raises and poll() is the only way to see rooms.
        """
        self.address = address
        self.timeout = timeout
        self.retries = retries
        self.backoff = backoff
        opts = dict(_CHANNEL_OPTIONS)
        opts.update(dict(channel_options))
        self._channel = grpc.insecure_channel(address, options=list(opts.items()))
        self._stub = self._stub_type(self._channel)
        self.cache = StatusCache()
        self._closed = threading.Event()
        # keep_region's regions by rank, registered again after a restart.
        # The lock keeps one registration of them in flight (the watch thread
        # and an open can both find them missing).
        self._kept: dict[tuple[int, int], Region] = {}
        self._region_lock = threading.Lock()
        # How often the kept regions were registered again (a daemon restart,
        # or a Watch stream lost and subscribed again).
        self.region_restores = 0
        # Test hook: when set, the watch thread calls it before it takes each
        # event, to play a slow consumer.
        self._watch_hook: Callable[[], object] | None = None
        self._watch_thread: threading.Thread | None = None
        if watch:
            self._watch_thread = threading.Thread(
                target=self._watch_loop, name=f"pdlink-watch {address}", daemon=True
            )
            self._watch_thread.start()

    # -- plumbing -------------------------------------------------------

    def _call(self, method: str, request: Any, *, retry: bool, timeout: float | None = None) -> Any:
        fn = getattr(self._stub, method)
        deadline = self.timeout if timeout is None else timeout
        attempt = 0
        while True:
            try:
                return fn(request, timeout=deadline)
            except grpc.RpcError as err:
                code = err.code() if isinstance(err, grpc.Call) else None
                if retry and code == grpc.StatusCode.UNAVAILABLE and attempt < self.retries:
                    if self._closed.wait(self.backoff * (2**attempt)):
                        raise from_rpc_error(err, method) from None
                    attempt += 1
                    continue
                raise from_rpc_error(err, method) from None

    def close(self) -> None:
        """Stop the watch thread and close the channel."""
        self._closed.set()
        # Closing the channel cancels the Watch call inside grpc's core. The
        # stream's own cancel() would wait for the watch thread: a
        # single-threaded stream holds its lock while it waits for the
        # daemon's headers, which a stopped daemon never sends.
        self._channel.close()
        if self._watch_thread is not None:
            self._watch_thread.join(timeout=10)

    def __enter__(self) -> _Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- regions --------------------------------------------------------

    def register_region(
        self,
        region: Region | str,
        layout: RegionLayout | None = None,
        *,
        rank: Sequence[int] = (0, 1),
        timeout: float | None = None,
        retry: bool = True,
    ) -> RegisterResult:
        """Map a region file for rank=(tp_rank, tp_size) (a Region, or a path and its layout).

        Idempotent for the same file and layout; a replaced file is a new
        generation and fails the rooms on the old one (region_replaced).
        retry=False fails at once on an unreachable daemon, for callers that
        have their own back-off.
        """
        if isinstance(region, Region):
            path, layout = region.path, layout or region.layout
        else:
            path = region
        if layout is None:
            raise ValueError("register_region of a path needs its layout")
        req = self._register_req(region_path=path, layout=layout.to_proto(tuple(rank)))
        r = self._call("RegisterRegion", req, retry=retry, timeout=timeout)
        return RegisterResult(r.region_id, r.generation, r.device, r.inode, r.rooms_failed)

    def keep_region(
        self, region: Region, *, rank: Sequence[int] = (0, 1), timeout: float | None = None
    ) -> RegisterResult:
        """register_region, and again whenever the daemon may have lost it.

        An engine calls this once per rank at start: after a daemon restart no
        room works until the region is back, and an idle engine makes no call
        that would notice. unregister_region(rank) stops keeping it.
        """
        key = (int(rank[0]), int(rank[1]))
        with self._region_lock:
            r = self.register_region(region, rank=key, timeout=timeout)
            self._kept[key] = region
        return r

    def _restore_regions(self, why: str, *, retry: bool) -> None:
        """Register every kept region again (idempotent for the same file)."""
        with self._region_lock:
            for rank, region in list(self._kept.items()):
                r = self.register_region(region, rank=rank, retry=retry)
                self.region_restores += 1
                logger.warning(
                    "pdlink region registered again (%s): daemon=%s rank=%s generation=%d",
                    why,
                    self.address,
                    rank,
                    r.generation,
                )

    def _ensure_regions(self) -> None:
        # An open while the Watch stream is down may reach a daemon that
        # restarted before the stream noticed: register first. (A daemon that
        # is gone refuses this as it would refuse the open.)
        if self._kept and self._watch_thread is not None and not self.cache.connected.is_set():
            self._restore_regions("an open while the Watch stream is down", retry=False)

    def unregister_region(
        self, *, rank: Sequence[int] = (0, 1), timeout: float | None = None
    ) -> UnregisterResult:
        """Drop rank's region (its rooms fail with region_replaced). Idempotent."""
        with self._region_lock:
            self._kept.pop((int(rank[0]), int(rank[1])), None)
        req = self._unregister_req(rank=_rank_proto(rank))
        r = self._call("UnregisterRegion", req, retry=True, timeout=timeout)
        return UnregisterResult(r.unregistered, r.generation, r.rooms_failed)

    # -- rooms ----------------------------------------------------------

    def _set_open_rank(self, req: Any, rank: Sequence[int] | None) -> None:
        if rank is None:
            return
        if _has_field(type(req), "rank"):
            req.rank.CopyFrom(_rank_proto(rank))
        elif tuple(rank) != (0, 1):
            raise ValueError(
                f"{type(req).__name__} of this pdlink.v1 has no rank: only rank=(0, 1) opens a room"
            )

    def _opened(self, resp: Any) -> RoomStatus:
        st = RoomStatus.from_proto(resp.status)
        self.cache.put(st)
        return st

    def _answer(self, resp: Any) -> RoomStatus:
        st = RoomStatus.from_proto(resp.status)
        self.cache.observe(st)
        return st

    def poll(self, room_ids: Iterable[int], *, timeout: float | None = None) -> list[RoomStatus]:
        """The daemon's status of each room, in order: batched Polls, no cache."""
        ids = list(room_ids)
        out: list[RoomStatus] = []
        for i in range(0, len(ids), MAX_BATCH):
            resp = self._call(
                "Poll", self._poll_req(room_ids=ids[i : i + MAX_BATCH]), retry=True, timeout=timeout
            )
            out.extend(RoomStatus.from_proto(s) for s in resp.statuses)
        for st in out:
            self.cache.observe(st)
        return out

    def status(self, room_id: int) -> RoomStatus | None:
        """The room's cached status (a dict lookup), None if the client does not track it.

        Rooms are tracked from open until clear. Requires watch=True.
        """
        if self._watch_thread is None:
            raise RuntimeError("status() needs the watch cache: this client has watch=False")
        return self.cache.get(room_id)

    def statuses(self, room_ids: Iterable[int]) -> list[RoomStatus | None]:
        """status() of each room, in order."""
        get = self.cache.get
        return [get(r) for r in room_ids]

    def wait_connected(self, timeout: float) -> bool:
        """Whether the watch stream is subscribed (and resynced) within timeout seconds."""
        return self.cache.connected.wait(timeout)

    def abort(self, room_id: int, reason: str = "", *, timeout: float | None = None) -> RoomStatus:
        """Fail the room (aborted:local) and tell the peer; a terminal room stays as it is."""
        resp = self._call(
            "Abort", self._abort_req(room_id=room_id, reason=reason), retry=True, timeout=timeout
        )
        return self._answer(resp)

    def clear(self, room_ids: Iterable[int], *, timeout: float | None = None) -> list[ClearResult]:
        """Remove terminal rooms; a live room is refused per room (NOT_TERMINAL).

        A repeat after an Unavailable whose first try went through answers
        NOT_FOUND for the rooms it cleared: either way they are gone, and the
        client stops tracking them.
        """
        ids = list(room_ids)
        out: list[ClearResult] = []
        for i in range(0, len(ids), MAX_BATCH):
            resp = self._call(
                "Clear",
                self._clear_req(room_ids=ids[i : i + MAX_BATCH]),
                retry=True,
                timeout=timeout,
            )
            out.extend(ClearResult(r.room_id, r.cleared, r.error) for r in resp.results)
        for r in out:
            if r.cleared or r.error == "NOT_FOUND":
                self.cache.drop(r.room_id)
        return out

    # -- the watch thread -----------------------------------------------

    def _resync(self) -> None:
        rooms = self.cache.rooms()
        since = self.cache.mark()
        for i in range(0, len(rooms), MAX_BATCH):
            resp = self._call(
                "Poll", self._poll_req(room_ids=rooms[i : i + MAX_BATCH]), retry=False
            )
            self.cache.resynced((RoomStatus.from_proto(s) for s in resp.statuses), since)
        self.cache.resyncs += 1

    def _watch_loop(self) -> None:
        delay = self.backoff
        first = True
        while not self._closed.is_set():
            try:
                stream = self._stub.Watch(self._watch_req())
                md = dict(stream.initial_metadata() or ())
                if _WATCH_HEADER not in md:
                    # The stream ended before it subscribed: iterate to get its error.
                    for _ in stream:
                        pass
                    raise PdlinkError("watch stream ended before it subscribed", method="Watch")
                if not first:
                    self.cache.reconnects += 1
                # keep_region registered them on this daemon; only a stream
                # that subscribes again may face one that restarted.
                if not first and self._kept:
                    try:
                        self._restore_regions(
                            "the daemon's Watch stream subscribed again", retry=False
                        )
                    except PdlinkError as err:
                        # Connected without its region the daemon serves no
                        # room: the stream goes, and the next try registers.
                        logger.warning("pdlink region register failed: %s", err)
                        stream.cancel()
                        raise
                first = False
                self._resync()
                self.cache.disconnected_since = None
                self.cache.connected.set()
                delay = self.backoff
                for resp in stream:
                    hook = self._watch_hook
                    if hook is not None:
                        hook()
                    ev = resp.event
                    kind = ev.WhichOneof("event")
                    if kind == "transition":
                        self.cache.transition(ev.transition)
                    elif kind == "missed":
                        self.cache.missed += ev.missed
                        self._resync()
            except (grpc.RpcError, PdlinkError):
                pass
            except ValueError:
                if self._closed.is_set():
                    return  # a call on the channel close() closed
                raise
            if self.cache.connected.is_set():
                self.cache.disconnected_since = time.monotonic()
            self.cache.connected.clear()
            if self._closed.wait(delay):
                return
            delay = min(delay * 2, 1.0)


class PrefillClient(_Client):
    """The prefill scheduler's client of prefilld."""

    _stub_type = prefill_pb2_grpc.PrefillServiceStub
    _poll_req = prefill_pb2.PrefillServicePollRequest
    _watch_req = prefill_pb2.PrefillServiceWatchRequest
    _abort_req = prefill_pb2.PrefillServiceAbortRequest
    _clear_req = prefill_pb2.PrefillServiceClearRequest
    _register_req = prefill_pb2.PrefillServiceRegisterRegionRequest
    _unregister_req = prefill_pb2.PrefillServiceUnregisterRegionRequest

    def open(
        self,
        room_id: int,
        *,
        nonce: int = 0,
        expected_receivers: int = 0,
        rank: Sequence[int] | None = None,
        timeout: float | None = None,
    ) -> RoomStatus:
        """OpenSender: create the room (nonce 0: decode's metadata binds it).

        Not retried: AlreadyExists means a live room has this id.
        """
        req = prefill_pb2.OpenSenderRequest(
            room_id=room_id, nonce=nonce, expected_receivers=expected_receivers
        )
        self._set_open_rank(req, rank)
        self._ensure_regions()
        return self._opened(self._call("OpenSender", req, retry=False, timeout=timeout))

    def send(
        self,
        room_id: int,
        pages: Any,
        *,
        rank: Sequence[int] = (0, 1),
        start_position: int = 0,
        last: bool = False,
        aux_index: int = 0,
        buffers: Sequence[int] = (),
        timeout: float | None = None,
    ) -> RoomStatus:
        """Send: hand a chunk of source pages (indices, a numpy array, or a range).

        start_position is the chunk's first position in the room's page
        sequence; last closes the room and carries aux row aux_index;
        buffers (empty: all) names the buffers for layer-wise sending.
        """
        req = prefill_pb2.SendRequest(
            room_id=room_id,
            rank=_rank_proto(rank),
            start_position=start_position,
            pages=_page_list(pages),
            last=last,
            aux_index=aux_index,
            buffers=list(buffers),
        )
        return self._answer(self._call("Send", req, retry=True, timeout=timeout))


class DecodeClient(_Client):
    """The decode scheduler's client of decoded."""

    _stub_type = decode_pb2_grpc.DecodeServiceStub
    _poll_req = decode_pb2.DecodeServicePollRequest
    _watch_req = decode_pb2.DecodeServiceWatchRequest
    _abort_req = decode_pb2.DecodeServiceAbortRequest
    _clear_req = decode_pb2.DecodeServiceClearRequest
    _register_req = decode_pb2.DecodeServiceRegisterRegionRequest
    _unregister_req = decode_pb2.DecodeServiceUnregisterRegionRequest

    def open(
        self,
        room_id: int,
        prefill_bootstrap_addr: str,
        *,
        expected_senders: int = 0,
        rank: Sequence[int] | None = None,
        timeout: float | None = None,
    ) -> RoomStatus:
        """OpenReceiver: create the room; status.nonce is the nonce drawn for it.

        prefill_bootstrap_addr is prefilld's "tcp://host:port". Not retried,
        except once after registering a kept region that decoded refused the
        open for want of (it restarted before the Watch stream saw it).
        """
        req = decode_pb2.OpenReceiverRequest(
            room_id=room_id,
            prefill_bootstrap_addr=prefill_bootstrap_addr,
            expected_senders=expected_senders,
        )
        self._set_open_rank(req, rank)
        self._ensure_regions()
        try:
            return self._opened(self._call("OpenReceiver", req, retry=False, timeout=timeout))
        except FailedPrecondition as err:
            key = (0, 1) if rank is None else (int(rank[0]), int(rank[1]))
            if _NO_REGION not in (err.details or "") or key not in self._kept:
                raise
        self._restore_regions("the daemon refused an open for want of it", retry=False)
        return self._opened(self._call("OpenReceiver", req, retry=False, timeout=timeout))

    def send_metadata(
        self,
        room_id: int,
        dst_pages: Any,
        *,
        rank: Sequence[int] = (0, 1),
        aux_index: int = 0,
        prefix_len: int = 0,
        timeout: float | None = None,
    ) -> RoomStatus:
        """SendMetadata: where the pages go (indices, a numpy array, or a range).

        prefix_len leading positions are decode's already and move no bytes.
        """
        req = decode_pb2.SendMetadataRequest(
            room_id=room_id,
            rank=_rank_proto(rank),
            dst_pages=_page_list(dst_pages),
            aux_index=aux_index,
            prefix_len=prefix_len,
        )
        return self._answer(self._call("SendMetadata", req, retry=True, timeout=timeout))


def wait_for(
    pred: Callable[[], Any], timeout: float, interval: float = 0.002, what: str = "condition"
) -> Any:
    """Poll pred until it returns a truthy value (returned) or timeout seconds pass
    (TimeoutError naming what). For schedulers' examples and tests."""
    end = time.monotonic() + timeout
    while True:
        v = pred()
        if v:
            return v
        if time.monotonic() >= end:
            raise TimeoutError(f"{what} not reached within {timeout}s")
        time.sleep(interval)
