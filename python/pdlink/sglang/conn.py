"""pdlink's KVManager, KVSender, KVReceiver and KVBootstrapServer for SGLang.

Subclasses of SGLang's Common* classes, because SGLang's schedulers read
their internals (prefill_info_table, try_ensure_parallel_info,
conclude_state, is_dummy_cp_rank). Discovery stays SGLang's: the prefill
manager registers with SGLang's bootstrap server (/route) as usual, except
that the rank endpoint it advertises is prefilld's bootstrap socket
(PDLINK_PREFILL_BOOTSTRAP), which the decode receiver hands to OpenReceiver.
Control and bytes go through the local daemon (pdlink.PrefillClient /
DecodeClient), each scheduler's per-request poll reading the client's
Watch-fed cache.

Configuration (environment of each SGLang server):
  PDLINK_PREFILLD_ADDR / PDLINK_DECODED_ADDR  the local daemon's gRPC address
  PDLINK_REGION_DIR                            the daemon's --region-dir
  PDLINK_PREFILL_BOOTSTRAP                     prefilld's --bootstrap-listen (prefill)
  PDLINK_STAGING_SLOTS                         staging pages per buffer (default 4096)
  PDLINK_DAEMON_LOST_TIMEOUT                   seconds without the daemon before its
                                               rooms fail (default 5)
  PDLINK_TOTAL_KV_HEADS                        the model's KV heads (decode, MHA between
                                               TP sizes; SGLang's decode manager gets no
                                               head counts)

SGLang's call order, per request (the methods below, in the order its
schedulers call them; poll() runs every scheduler step in between):
  prefill  PdlinkKVSender(...)       OpenSender
           poll() -> WaitingForInput  decode's SendMetadata reached prefilld
           pop_decode_prefix_len()    decode's cached prefix, in tokens
           init(num_pages, aux)       staging slots for the pages after it
           send(kv_indices) per chunk copy into staging, Send (the last with aux)
           poll() -> Success          decoded verified every page
           clear()                    ClearRooms, slots back
  decode   PdlinkKVReceiver(...)      (nothing yet: SGLang's bootstrap first)
           init(prefill_dp_rank)      OpenReceiver to prefilld's endpoint
           send_metadata(kv_indices, aux_index, decode_prefix_len)
                                      SendMetadata with staging slots
           poll() -> Success          copy out of staging into SGLang's pool, then Success
           clear()                    ClearRooms, slots back
  either   abort()                    Abort and ClearRooms (SGLang calls no clear after it)
           failure_exception()        on Failed: clear, raise with pdlink's reason

TP: one prefilld and one decoded serve every rank of their server; each
rank's scheduler opens the same room with its own rank (attn_tp_rank,
attn_tp_size), decode naming the prefill TP it learnt from SGLang's
bootstrap server, and registers its own region, whose layout carries the
head counts when SGLang gave them so the daemons can map different TP sizes.
"""

from __future__ import annotations

import functools
import logging
import os
import queue
import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np
from sglang.srt.disaggregation.base.conn import KVArgs, KVPoll, KVTransferDestination
from sglang.srt.disaggregation.common.conn import (
    CommonKVBootstrapServer,
    CommonKVManager,
    CommonKVReceiver,
    CommonKVSender,
    KVTransferError,
)
from sglang.srt.disaggregation.utils import DisaggregationMode, KVClassType

from pdlink import (
    DecodeClient,
    PdlinkError,
    PrefillClient,
    Region,
    RoomState,
    RoomStatus,
    StatusCache,
)
from pdlink.region import AuxLayout, BufferLayout, RegionLayout
from pdlink.sglang import checks
from pdlink.sglang.staging import SlotPool, StagingFull, copier, copy_pages

logger = logging.getLogger(__name__)

DEFAULT_STAGING_SLOTS = 4096
DEFAULT_DAEMON_LOST_TIMEOUT = 5.0

# pdlink's room states to SGLang's KVPoll, by name. Never by number: KVPoll's
# Failed is 0 and the schedulers' MIN all-reduce over ranks relies on it,
# while pdlink's FAILED is the last state.
PREFILL_STATE_TO_KVPOLL = {
    RoomState.UNSPECIFIED: KVPoll.Bootstrapping,
    RoomState.BOOTSTRAPPING: KVPoll.Bootstrapping,
    RoomState.WAITING_FOR_INPUT: KVPoll.WaitingForInput,
    RoomState.TRANSFERRING: KVPoll.Transferring,
    RoomState.SUCCESS: KVPoll.Success,
    RoomState.FAILED: KVPoll.Failed,
}
# Decode after send_metadata: everything short of the end is Transferring
# (SGLang's transfer queue waits on it); SUCCESS is reported only after the
# copy out of staging, by the receiver.
DECODE_STATE_TO_KVPOLL = {
    RoomState.UNSPECIFIED: KVPoll.Transferring,
    RoomState.BOOTSTRAPPING: KVPoll.Transferring,
    RoomState.WAITING_FOR_INPUT: KVPoll.Transferring,
    RoomState.TRANSFERRING: KVPoll.Transferring,
    RoomState.SUCCESS: KVPoll.Success,
    RoomState.FAILED: KVPoll.Failed,
}


_NOT_POLLED = object()


def _env(name: str) -> str:
    value = os.environ.get(name, "")
    if not value:
        raise ValueError(f"--disaggregation-transfer-backend pdlink needs {name} set")
    return value


def region_layout(
    args: KVArgs, slots: int, is_mla: bool, tp_size: int, total_heads: int = 0
) -> RegionLayout:
    """The staging region of slots pages per KV buffer, and the aux rows.

    Described (head fields set) when the heads are known: MLA's latent is
    one head whole on every rank; MHA's come from SGLang's kv_head_num and
    total_kv_head_num (prefill), or total_heads split over tp_size (decode,
    whose KVArgs lack them). The daemons map ranks of different TP sizes
    only between described layouts; an opaque one serves equal TP only.
    """
    item_lens = [int(x) for x in args.kv_item_lens]
    aux_lens = [int(x) for x in args.aux_item_lens]
    aux_rows = int(args.aux_data_lens[0]) // aux_lens[0] if aux_lens else 0
    aux = AuxLayout(aux_rows, sum(aux_lens)) if aux_rows else None
    page_tokens = int(getattr(args, "page_size", 0) or 0)
    if is_mla:
        total, heads, attention = 1, 1, "mla"
    else:
        total = int(getattr(args, "total_kv_head_num", 0) or 0) or total_heads
        heads = int(getattr(args, "kv_head_num", 0) or 0) or max(total // tp_size, 1)
        attention = "mha"
    row = page_tokens * heads
    if total < 1 or row < 1 or any(n % row for n in item_lens):
        return RegionLayout(tuple(BufferLayout(slots, n) for n in item_lens), aux)
    buffers = tuple(BufferLayout(slots, n, page_tokens, total, heads, n // row) for n in item_lens)
    return RegionLayout(buffers, aux, attention)


def _failure_text(st: RoomStatus) -> str:
    if not st.found:
        return f"pdlink room {st.room_id} is gone from the daemon (cleared, reaped or restarted)"
    reason = st.reason or "unknown"
    if st.peer_reason:
        reason += f" (peer: {st.peer_reason})"
    return f"pdlink room {st.room_id} failed: {reason}"


class PdlinkKVManager(CommonKVManager):
    """One per scheduler process: the daemon client and the staging region."""

    def __init__(
        self,
        args: KVArgs,
        disaggregation_mode: DisaggregationMode,
        server_args: Any,
        is_mla_backend: bool | None = False,
    ) -> None:
        checks.check_version(checks.installed_sglang_version())
        checks.check_server_args(server_args)
        checks.check_kv_args(args)
        self.is_prefill = disaggregation_mode == DisaggregationMode.PREFILL
        if self.is_prefill:
            self.daemon_addr = _env("PDLINK_PREFILLD_ADDR")
            self.prefill_bootstrap = _env("PDLINK_PREFILL_BOOTSTRAP")
        else:
            self.daemon_addr = _env("PDLINK_DECODED_ADDR")
        region_dir = _env("PDLINK_REGION_DIR")
        slots = int(os.environ.get("PDLINK_STAGING_SLOTS", DEFAULT_STAGING_SLOTS))
        self.lost_timeout = float(
            os.environ.get("PDLINK_DAEMON_LOST_TIMEOUT", DEFAULT_DAEMON_LOST_TIMEOUT)
        )
        # SGLang's own set-up: parallel context, its ZMQ socket, and on
        # prefill register_to_bootstrap (overridden below).
        super().__init__(args, disaggregation_mode, server_args, is_mla_backend)
        # SGLang's own rank in the attention TP group, the one its bootstrap
        # server and rank mapping use (prefill's engine_rank is tp_rank).
        self.rank = (int(self.attn_tp_rank), int(self.attn_tp_size))

        self.item_lens = [int(x) for x in args.kv_item_lens]
        self.aux_item_lens = [int(x) for x in args.aux_item_lens]
        total_heads = int(os.environ.get("PDLINK_TOTAL_KV_HEADS", "0") or 0)
        layout = region_layout(args, slots, bool(is_mla_backend), self.rank[1], total_heads)
        self.region = Region.create(region_dir, layout)
        self.region_bases = [
            int(self.region.pages(i).ctypes.data) for i in range(len(layout.buffers))
        ]
        aux = layout.aux
        self.region_aux_base = int(self.region.aux().ctypes.data) if aux else 0
        self.region_aux_row_len = aux.row_len if aux else 0
        self.slots = SlotPool(slots)
        self.copy = copier(on_device=self._pool_on_device(args))

        client_type = PrefillClient if self.is_prefill else DecodeClient
        self.client = client_type(self.daemon_addr)
        # A daemon that restarts forgets the region: the client registers it
        # again when its Watch stream comes back (an idle scheduler opens
        # nothing that would notice).
        self.client.keep_region(self.region, rank=self.rank)
        if not self.client.wait_connected(30):
            raise RuntimeError(f"pdlink daemon at {self.daemon_addr} did not answer Watch in 30s")
        logger.info(
            "pdlink kv manager ready: mode=%s daemon=%s rank=%s region=%s slots=%d",
            "prefill" if self.is_prefill else "decode",
            self.daemon_addr,
            self.rank,
            self.region.path,
            slots,
        )

    @staticmethod
    def _pool_on_device(args: KVArgs) -> bool:
        kinds = getattr(args, "kv_data_mem_kinds", None)
        if kinds:
            return any(k == "VRAM" for k in kinds)
        try:
            import torch

            return bool(torch.cuda.is_available())
        except ImportError:
            return False

    def register_to_bootstrap(self) -> None:
        """Advertise prefilld's bootstrap socket as this rank's endpoint on /route."""
        endpoint = self.prefill_bootstrap.removeprefix("tcp://")
        host, _, port = endpoint.rpartition(":")
        own = (self.local_ip, self.rank_port)
        self.local_ip, self.rank_port = host.strip("[]"), int(port)
        try:
            super().register_to_bootstrap()
        finally:
            self.local_ip, self.rank_port = own

    def daemon_lost(self) -> str | None:
        """A failure reason once the daemon's Watch stream has been down too long."""
        since = self.client.cache.disconnected_since
        if since is None:
            return None
        lost_for = time.monotonic() - since
        if lost_for < self.lost_timeout:
            return None
        return f"pdlink daemon at {self.daemon_addr} unreachable for {lost_for:.1f}s"

    # The senders' poll reads these on every scheduler tick; as plain
    # attributes (cached on first use) they cost a dict read, not a call.
    @functools.cached_property
    def status_cache(self) -> StatusCache:
        return self.client.cache

    @functools.cached_property
    def cached_status(self) -> Callable[[int], RoomStatus | None]:
        return self.client.cache.get

    def copy_aux_in(self, aux_index: int) -> None:
        """The request's row of every SGLang aux buffer, side by side, into the region row."""
        dst = self.region_aux_base + aux_index * self.region_aux_row_len
        for ptr, n in zip(self.kv_args.aux_data_ptrs, self.aux_item_lens, strict=True):
            self.copy(dst, int(ptr) + aux_index * n, n)
            dst += n

    def copy_aux_out(self, aux_index: int) -> None:
        src = self.region_aux_base + aux_index * self.region_aux_row_len
        for ptr, n in zip(self.kv_args.aux_data_ptrs, self.aux_item_lens, strict=True):
            self.copy(int(ptr) + aux_index * n, src, n)
            src += n

    # Sends leave the scheduler's thread: a Send answers after a round trip
    # to the daemon, the last one only after decode admitted its pages:
    # 1-2 ms, and a loaded machine's scheduling tail on top (bench),
    # while send() itself only needs its pages copied into staging. One
    # worker, first in first out, keeps every room's chunks in order (the
    # daemon takes a room's chunks only in position order); a failed Send
    # fails its room at the room's next poll, on the scheduler's thread.
    _sends: queue.SimpleQueue | None = None
    _send_worker: threading.Thread | None = None

    def submit_send(self, sender: PdlinkKVSender, **send: Any) -> None:
        """Queue sender's Send (client.send's arguments) for the send worker.

        Called on the scheduler's thread only, which starts the worker."""
        if self._sends is None:
            self._sends = queue.SimpleQueue()
            self._send_worker = threading.Thread(
                target=self._send_loop, args=(self._sends,), name="pdlink-send", daemon=True
            )
            self._send_worker.start()
        self._sends.put((sender, send))

    def _send_loop(self, sends: queue.SimpleQueue) -> None:
        while (item := sends.get()) is not None:
            sender, send = item
            if sender.conclude_state is not None:
                continue  # failed (aborted, daemon lost) since: nothing to send for
            try:
                self.client.send(**send)
            except PdlinkError as err:
                sender.send_failed = f"pdlink Send of room {sender.bootstrap_room} failed: {err}"
            except Exception as err:
                # Not the daemon's answer (a bug): the room fails with it, and
                # the worker stays for the other rooms' Sends.
                logger.exception("pdlink send worker: room=%d", sender.bootstrap_room)
                sender.send_failed = f"pdlink Send of room {sender.bootstrap_room} failed: {err!r}"

    def close(self) -> None:
        if self._sends is not None and self._send_worker is not None:
            self._sends.put(None)  # after the Sends already queued
            self._send_worker.join(timeout=30)
        self.client.close()
        self.region.close()
        # SGLang's manager binds a ZMQ socket for SGLang's own data plane,
        # which pdlink never uses. Left open, libzmq's context term at
        # interpreter exit waits for that socket: the process hangs after its
        # last request.
        ctx = getattr(self, "_zmq_ctx", None)
        if ctx is not None and not ctx.closed:
            ctx.destroy(linger=0)


class _Room:
    """What sender and receiver share: failure bookkeeping against the manager."""

    kv_mgr: PdlinkKVManager
    bootstrap_room: int
    conclude_state: Any

    def _fail(self, reason: str) -> int:
        self.kv_mgr.record_failure(self.bootstrap_room, reason)
        self.kv_mgr.update_status(self.bootstrap_room, KVPoll.Failed)
        self.conclude_state = KVPoll.Failed
        self.kv_mgr.slots.give_back(self.bootstrap_room)
        return KVPoll.Failed

    def _daemon_status(self) -> RoomStatus | None:
        return self.kv_mgr.client.status(self.bootstrap_room)

    def _raise_failure(self) -> None:
        with self.kv_mgr.failure_lock:
            reason = self.kv_mgr.failure_records.pop(self.bootstrap_room, None)
        if reason is None:
            st = self._daemon_status()
            reason = _failure_text(st) if st is not None else "pdlink room failed"
        raise KVTransferError(self.bootstrap_room, reason)

    def _release(self, abort_reason: str) -> None:
        """Clear the daemon's room (abort first if it is still live) and free its slots."""
        self.kv_mgr.slots.give_back(self.bootstrap_room)
        if not self._opened:
            return
        self._opened = False
        client = self.kv_mgr.client
        try:
            res = client.clear([self.bootstrap_room])
            if res and res[0].error == "NOT_TERMINAL":
                client.abort(self.bootstrap_room, abort_reason)
                client.clear([self.bootstrap_room])
        except PdlinkError as err:
            # The daemon is gone or restarted: its room went with it.
            logger.warning("pdlink clear failed: room=%d err=%s", self.bootstrap_room, err)

    def _abort_daemon_room(self, reason: str) -> None:
        if not self._opened:
            return
        try:
            self.kv_mgr.client.abort(self.bootstrap_room, reason)
        except PdlinkError as err:
            logger.warning("pdlink abort failed: room=%d err=%s", self.bootstrap_room, err)

    _opened = False

    # SGLang's sender and receiver end a room the same way; clear() is each one's own.
    def failure_exception(self) -> None:
        self.conclude_state = KVPoll.Failed
        self.clear()
        self._raise_failure()

    def abort(self) -> None:
        self._abort_daemon_room("aborted by SGLang")
        self._fail("Aborted by AbortReq.")
        # SGLang's prefill aborts a request in its waiting queue or mid
        # chunked prefill with abort() alone, no clear() after it: the room
        # stayed Failed on the daemon until --clear-linger reaped it as
        # uncleared. The daemon's Abort answers once the room is Failed and
        # fenced, so it is cleared here; a later clear() has nothing to do.
        self._release("aborted by SGLang")


class PdlinkKVSender(_Room, CommonKVSender):
    """Prefill, one per request: OpenSender at creation, Send per chunk (by the
    manager's send worker, after the staging copy), cached poll."""

    _early_send_wait_event: Any = None

    def __init__(
        self,
        mgr: PdlinkKVManager,
        bootstrap_addr: str,
        bootstrap_room: int,
        req_has_disagg_prefill_dp_rank: bool = False,
    ) -> None:
        super().__init__(mgr, bootstrap_addr, bootstrap_room, req_has_disagg_prefill_dp_rank)
        self.num_kv_indices = 0
        self.slots_held: np.ndarray | None = None
        if self.conclude_state is not None:
            return
        try:
            mgr.client.open(bootstrap_room, expected_receivers=1, rank=mgr.rank)
            self._opened = True
        except PdlinkError as err:
            self._fail(f"pdlink OpenSender of room {bootstrap_room} refused: {err}")

    # Decode's prefix in pages, as SGLang's prefill took it at bootstrap
    # (pop_decode_prefix_len): SGLang then sends only the pages after it,
    # so the k-th page this sender is handed is the room's position
    # prefix_pages + k, and nothing below it is staged.
    prefix_pages = 0

    def pop_decode_prefix_len(self) -> int:
        """decode_prefix_len in tokens, read by SGLang's finalize_bootstrap
        once the room is WaitingForInput: the daemon's prefix_len of the room.

        SGLang starts sending at it (req.start_send_idx) and inits this
        sender with the pages after it. While the daemon has not said it
        (a status still Bootstrapping, or a prefilld that does not report
        it) the answer is 0: SGLang then sends every page, which stays
        correct (decoded writes none of the prefix), only wasteful.
        """
        st = self.kv_mgr.cached_status(self.bootstrap_room)
        known = st is not None and st.found and st.state != RoomState.BOOTSTRAPPING
        self.prefix_pages = st.prefix_len if known else 0
        return self.prefix_pages * int(self.kv_mgr.kv_args.page_size)

    def init(self, num_kv_indices: int, aux_index: int | None = None) -> None:
        super().init(num_kv_indices, aux_index)
        if self.conclude_state is not None:
            return
        try:
            self.slots_held = self.kv_mgr.slots.take(self.bootstrap_room, num_kv_indices)
        except StagingFull as err:
            self._abort_daemon_room("staging_full")
            self._fail(str(err))

    def send(
        self,
        kv_indices: Any,
        state_indices: Any = None,
        num_kv_tokens: int | None = None,
        indices_event: Any = None,
        token_position_offset: int = 0,
        **unknown: Any,
    ) -> None:
        # An early send of a chunked request's computed pages may come before
        # the previous step's forward finished writing them (SGLang's overlap
        # scheduler records this event on its forward stream): the copy must
        # not read the pages before it. Taken even when the send is refused,
        # so it never carries over to another chunk.
        written = self._early_send_wait_event
        self._early_send_wait_event = None
        if self.conclude_state is not None or self.slots_held is None:
            return
        if state_indices:
            self._abort_daemon_room("state_unsupported")
            self._fail("pdlink carries no state components (state_indices given)")
            return
        # A newer SGLang's argument this backend does not implement would be
        # dropped silently and the pages land at the wrong positions: refuse.
        if token_position_offset or unknown:
            given = sorted(unknown) + (["token_position_offset"] if token_position_offset else [])
            self._abort_daemon_room("send_argument_unsupported")
            self._fail(f"pdlink send does not implement {', '.join(given)}")
            return
        for event in (written, indices_event):
            if event is not None:
                event.synchronize()
        first = self.curr_idx
        self.curr_idx += len(kv_indices)
        last = self.curr_idx == self.num_kv_indices
        slots = self.slots_held[first : self.curr_idx]
        mgr = self.kv_mgr
        copy_pages(
            mgr.copy,
            mgr.kv_args.kv_data_ptrs,
            mgr.region_bases,
            mgr.item_lens,
            kv_indices,
            slots,
        )
        aux_index = 0
        if last and self.aux_index is not None and mgr.region_aux_row_len:
            mgr.copy_aux_in(self.aux_index)
            aux_index = int(self.aux_index)
        mgr.submit_send(
            self,
            room_id=self.bootstrap_room,
            pages=slots,
            rank=mgr.rank,
            start_position=self.prefix_pages + first,
            last=last,
            aux_index=aux_index,
        )
        self._record_transfer_indices(kv_indices, None)

    # The cached status the last poll mapped, and what it mapped to: the
    # cache replaces a status whole on every change, so while it still holds
    # the same object the answer is the same, and most polls of a tick end
    # at that identity check.
    _polled: object = _NOT_POLLED
    _polled_state = KVPoll.Bootstrapping
    # Set by the send worker when one of this room's Sends failed: the reason.
    send_failed: str | None = None

    def poll(self) -> int:
        if self.conclude_state is not None:
            return self.conclude_state
        if self.send_failed is not None:
            return self._fail(self.send_failed)
        mgr = self.kv_mgr
        if mgr.status_cache.disconnected_since is not None:
            lost = mgr.daemon_lost()
            if lost is not None:
                return self._fail(lost)
        st = mgr.cached_status(self.bootstrap_room)
        if st is self._polled:
            return self._polled_state
        if st is None or not st.found:
            return self._fail(_failure_text(st or RoomStatus(self.bootstrap_room)))
        state = PREFILL_STATE_TO_KVPOLL[st.state]
        if state == KVPoll.Failed:
            return self._fail(_failure_text(st))
        if state == KVPoll.Success:
            self.conclude_state = KVPoll.Success
        self._polled, self._polled_state = st, state
        return state

    def clear(self) -> None:
        self._release("cleared by SGLang")
        self.kv_mgr.request_status.pop(self.bootstrap_room, None)


def _prefix_names(region_pages: int, held: np.ndarray, count: int) -> np.ndarray | None:
    """count distinct region pages, none of held, to stand at a room's prefix positions.

    decoded never writes a position below prefix_len, so these pages are
    named, not held: another room's slots may be among them.
    """
    free = np.setdiff1d(np.arange(region_pages, dtype=np.int64), held, assume_unique=True)
    return free[:count] if len(free) >= count else None


def _prefilld_addr(info: dict) -> str:
    """The prefilld bootstrap endpoint a prefill rank advertised on /route."""
    host = str(info["rank_ip"])
    if ":" in host:
        host = f"[{host}]"
    return f"tcp://{host}:{int(info['rank_port'])}"


class PdlinkKVReceiver(_Room, CommonKVReceiver):
    """Decode, one per request: OpenReceiver at init, SendMetadata, Success after the copy."""

    def __init__(
        self, mgr: PdlinkKVManager, bootstrap_addr: str, bootstrap_room: int | None = None
    ) -> None:
        super().__init__(mgr, bootstrap_addr, bootstrap_room)
        self.dst_pages: np.ndarray | None = None
        self.dst_aux_index: int | None = None

    def _register_kv_args(self) -> bool:
        # SGLang's registration frame carries raw pointers for its own data
        # plane; pdlink's daemons learn the region from RegisterRegion.
        return self.bootstrap_infos is not None

    def init(self, prefill_dp_rank: int) -> None:
        super().init(prefill_dp_rank)
        if self.conclude_state is not None:
            return
        addrs = sorted({_prefilld_addr(info) for info in self.bootstrap_infos})
        if len(addrs) != 1:
            self._fail(
                f"pdlink room {self.bootstrap_room}: the prefill ranks it reads from "
                f"advertise {addrs}; one prefilld must serve every prefill rank"
            )
            return
        addr = addrs[0]
        prefill_tp = int(self.prefill_info.attn_tp_size)
        mgr = self.kv_mgr
        if prefill_tp != mgr.rank[1] and mgr.region.layout.attention is None:
            self._fail(
                f"pdlink room {self.bootstrap_room}: prefill TP {prefill_tp} to decode TP "
                f"{mgr.rank[1]} needs the KV head counts in the decode region; set "
                "PDLINK_TOTAL_KV_HEADS to the model's KV heads"
            )
            return
        try:
            # Every decode rank names the prefill TP: decoded plans each
            # rank's sources (head slices) from it, and the Opens must agree.
            mgr.client.open(self.bootstrap_room, addr, expected_senders=prefill_tp, rank=mgr.rank)
            self._opened = True
        except PdlinkError as err:
            self._fail(
                f"pdlink OpenReceiver of room {self.bootstrap_room} to {addr} refused: {err}"
            )

    def send_metadata(
        self,
        kv_indices: Any,
        aux_index: int | None = None,
        state_indices: Any = None,
        decode_prefix_len: int | None = None,
        destination: Any = KVTransferDestination.DEVICE,
        **_: Any,
    ) -> None:
        if self.conclude_state is not None:
            return
        if state_indices:
            self._abort_daemon_room("state_unsupported")
            self._fail("pdlink carries no state components (state_indices given)")
            return
        # SGLang's decode_prefix_len counts tokens decode already holds (its
        # radix cache); kv_indices are the pages after them only.
        page_size = int(self.kv_mgr.kv_args.page_size)
        prefix_tokens = int(decode_prefix_len or 0)
        if prefix_tokens % page_size:
            self._abort_daemon_room("prefix_unaligned")
            self._fail(
                f"pdlink room {self.bootstrap_room}: decode_prefix_len {prefix_tokens} is not "
                f"a whole number of pages of {page_size} tokens"
            )
            return
        prefix_pages = prefix_tokens // page_size
        try:
            slots = self.kv_mgr.slots.take(self.bootstrap_room, len(kv_indices))
        except StagingFull as err:
            self._abort_daemon_room("staging_full")
            self._fail(str(err))
            return
        dst = slots
        if prefix_pages:
            names = _prefix_names(self.kv_mgr.slots.slots, slots, prefix_pages)
            if names is None:
                self._abort_daemon_room("staging_full")
                self._fail(
                    f"pdlink room {self.bootstrap_room}: {prefix_pages} prefix and "
                    f"{len(slots)} new pages exceed the {self.kv_mgr.slots.slots} staging "
                    "pages that name them (raise PDLINK_STAGING_SLOTS)"
                )
                return
            dst = np.concatenate([names, slots])
        self.dst_pages = np.asarray(kv_indices, dtype=np.int64)
        self.dst_aux_index = aux_index
        try:
            # prefilld reports prefix_pages as the prefill room's prefix_len,
            # so SGLang's prefill starts sending after it; decoded never
            # writes a prefix position, whoever sends it.
            self.kv_mgr.client.send_metadata(
                self.bootstrap_room,
                dst,
                rank=self.kv_mgr.rank,
                aux_index=int(aux_index or 0),
                prefix_len=prefix_pages,
            )
        except PdlinkError as err:
            self._fail(f"pdlink SendMetadata of room {self.bootstrap_room} failed: {err}")

    def poll(self) -> int:
        if self.conclude_state is not None:
            return self.conclude_state
        if self._opened:
            lost = self.kv_mgr.daemon_lost()
            if lost is not None:
                return self._fail(lost)
            st = self._daemon_status()
            if st is None or not st.found:
                return self._fail(_failure_text(st or RoomStatus(self.bootstrap_room)))
            if st.state == RoomState.FAILED:
                return self._fail(_failure_text(st))
        if self.dst_pages is None:
            # Before send_metadata SGLang's prealloc queue accepts only
            # Bootstrapping, WaitingForInput and Failed: init's own state.
            return self.kv_mgr.request_status.get(self.bootstrap_room, KVPoll.Bootstrapping)
        if not self._opened:
            # Metadata sent but the daemon's room is gone (cleared, or never
            # opened): no page will arrive.
            self.conclude_state = KVPoll.Failed
            return self.conclude_state
        state = DECODE_STATE_TO_KVPOLL[st.state]
        if state == KVPoll.Success:
            self._copy_out()
            self.conclude_state = KVPoll.Success
            self.kv_mgr.update_status(self.bootstrap_room, KVPoll.Success)
        return state

    def _copy_out(self) -> None:
        mgr = self.kv_mgr
        slots = mgr.slots.held(self.bootstrap_room)
        assert slots is not None and self.dst_pages is not None
        copy_pages(
            mgr.copy,
            mgr.region_bases,
            mgr.kv_args.kv_data_ptrs,
            mgr.item_lens,
            slots,
            self.dst_pages,
        )
        if self.dst_aux_index is not None and mgr.region_aux_row_len:
            mgr.copy_aux_out(int(self.dst_aux_index))

    def clear(self) -> None:
        self._release("cleared by SGLang")
        if self.conclude_state is None:
            self.conclude_state = KVPoll.Failed
        mgr = self.kv_mgr
        mgr.request_status.pop(self.bootstrap_room, None)
        mgr.required_prefill_response_num_table.pop(self.bootstrap_room, None)
        mgr.prefill_response_tracker.pop(self.bootstrap_room, None)
        mgr.addr_to_rooms_tracker[self.bootstrap_addr].discard(self.bootstrap_room)


class PdlinkKVBootstrapServer(CommonKVBootstrapServer):
    """SGLang's own bootstrap HTTP server: /route carries prefilld's endpoint."""


_CLASSES = {
    KVClassType.KVARGS: KVArgs,
    KVClassType.MANAGER: PdlinkKVManager,
    KVClassType.SENDER: PdlinkKVSender,
    KVClassType.RECEIVER: PdlinkKVReceiver,
    KVClassType.BOOTSTRAP_SERVER: PdlinkKVBootstrapServer,
}


def kv_class(class_type: Any) -> Any:
    """get_kv_class's answer for the pdlink backend (class_type compared by value)."""
    for key, cls in _CLASSES.items():
        if key.value == getattr(class_type, "value", class_type):
            return cls
    raise ValueError(f"pdlink has no {class_type} class")
