"""PdlinkConnector's worker side: staging, rooms' progress, finished sends and loads.

Each step (start_load_kv) takes the scheduler's new jobs; each step's
get_transfer_results polls the rooms in flight in one batched Poll per
daemon and moves them on:

- prefill: once decode bound the room (WaitingForInput, its prefix_len
  known) the request's blocks after decode's prefix are copied into
  staging slots and Sent (last). The room's terminal state (Success, or
  Failed with its reason logged) frees the blocks: finished_sending.
- decode: the room is opened (OpenReceiver to the prefilld the params name)
  and its staging slots sent as metadata, the prefix positions named but
  never written. Success: staging -> the request's blocks, then
  finished_recving. Failed (or a daemon gone past daemon_lost_timeout):
  finished_recving and failed_recving, vLLM's kv_load_failure_policy
  decides (an error by default); the blocks are never written.

Every room is cleared once terminal, so neither daemon keeps it.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from pdlink import DecodeClient, NotFound, PdlinkError, PrefillClient, RoomState, RoomStatus
from pdlink.sglang.staging import SlotPool, StagingFull
from pdlink.vllm.config import Settings
from pdlink.vllm.layerwise import StagedSends
from pdlink.vllm.metadata import (
    LoadJob,
    PdlinkMetadata,
    PdlinkWorkerMetadata,
    SendJob,
    failure_text,
)
from pdlink.vllm.staging import Staging, layer_buffers, page_buffers

logger = logging.getLogger("pdlink.vllm")

_CALL_TIMEOUT = 5.0
# The per-step Poll runs on vLLM's step loop: a daemon that hangs must not
# stall the engine for long (a lost daemon fails its rooms past
# daemon_lost_timeout anyway).
_POLL_TIMEOUT = 1.0


@dataclass
class _Send:
    job: SendJob
    sent: bool = False
    failed: str = ""


@dataclass
class _Load:
    job: LoadJob
    opened: bool = False
    failed: str = ""
    aborted: bool = False
    started: float = field(default_factory=time.monotonic)


class _Side:
    """One daemon, its staging region and slots, and the rooms in flight on it."""

    def __init__(self, client: Any, staging: Staging, slots: int, rank: tuple[int, int]) -> None:
        self.client = client
        self.staging = staging
        self.pool = SlotPool(slots)
        self.rank = rank
        self.lost_since: float | None = None
        self.quarantine: set[int] = set()

    def poll(self, rooms: list[int], lost_timeout: float) -> list[RoomStatus] | None:
        """Statuses, or None while the daemon does not answer (rooms fail past lost_timeout)."""
        try:
            out = self.client.poll(rooms, timeout=_POLL_TIMEOUT)
        except PdlinkError as err:
            now = time.monotonic()
            if self.lost_since is None:
                self.lost_since = now
                logger.warning("pdlink daemon %s unreachable: %s", self.client.address, err)
            if now - self.lost_since >= lost_timeout:
                return [
                    RoomStatus(
                        room_id=r,
                        found=True,
                        state=RoomState.FAILED,
                        reason=f"daemon_lost: {self.client.address} unreachable for "
                        f"{now - self.lost_since:.1f}s",
                    )
                    for r in rooms
                ]
            return None
        self.lost_since = None
        if self.quarantine:
            self._drain_quarantine()
        return out

    def _drain_quarantine(self) -> None:
        for room in list(self.quarantine):
            try:
                with contextlib.suppress(NotFound):
                    self.client.abort(room, "daemon was unreachable", timeout=_POLL_TIMEOUT)
                res = self.client.clear([room], timeout=_POLL_TIMEOUT)
            except PdlinkError:
                return
            if res and (res[0].cleared or res[0].error == "NOT_FOUND"):
                self.quarantine.discard(room)
                self.pool.give_back(room)

    def release(self, room: int, abort_reason: str = "") -> None:
        if self.lost_since is not None:
            # The daemon does not answer: calls would stall the step. If it
            # only hangs it may still read (prefill) or write (decode) the
            # room's staging slots, so they stay out of the pool until the
            # daemon answers again and the room is gone from it.
            self.quarantine.add(room)
            return
        self.pool.give_back(room)
        try:
            if abort_reason:
                self.client.abort(room, abort_reason, timeout=_POLL_TIMEOUT)
            res = self.client.clear([room], timeout=_POLL_TIMEOUT)
            if res and res[0].error == "NOT_TERMINAL":
                self.client.abort(room, "cleared by vLLM", timeout=_POLL_TIMEOUT)
                self.client.clear([room], timeout=_POLL_TIMEOUT)
        except PdlinkError as err:
            logger.warning("pdlink clear failed: room=%d err=%s", room, err)

    def close(self) -> None:
        try:
            self.client.unregister_region(rank=self.rank, timeout=_CALL_TIMEOUT)
        except PdlinkError as err:
            logger.warning("pdlink unregister failed: %s", err)
        self.client.close()
        self.staging.close()


class WorkerSide:
    def __init__(self, settings: Settings, vllm_config: Any, kv_cache_config: Any) -> None:
        from vllm.distributed.parallel_state import (
            get_tensor_model_parallel_rank,
            get_tensor_model_parallel_world_size,
        )

        self.settings = settings
        self.kv_cache_config = kv_cache_config
        self.rank = (get_tensor_model_parallel_rank(), get_tensor_model_parallel_world_size())
        self.prefill: _Side | None = None
        self.decode: _Side | None = None
        # Prefill's rooms of the concurrent flow (staged per layer).
        self.staged: StagedSends | None = None
        self._sends: dict[int, _Send] = {}
        self._loads: dict[int, _Load] = {}
        self._load_by_req: dict[str, int] = {}
        self._finished_seen: set[str] = set()
        self._done_sending: set[str] = set()
        self._done_recving: set[str] = set()
        self._failed_recving: set[str] = set()
        # Failed rooms by reason, for the logs' totals and the tests.
        self.failures: collections.Counter[str] = collections.Counter()

    # -- start ------------------------------------------------------------

    def register_kv_caches(self, kv_caches: dict[str, Any]) -> None:
        buffers = page_buffers(kv_caches, int(self.kv_cache_config.num_blocks))
        slots = min(self.settings.staging_slots, int(self.kv_cache_config.num_blocks))
        s = self.settings
        if s.prefill:
            self.prefill = self._side(
                PrefillClient, s.prefilld_addr, s.prefill_region_dir, buffers, slots
            )
            self.staged = StagedSends(
                self.prefill, self.rank, layer_buffers(buffers), s.daemon_lost_timeout
            )
        if s.decode:
            self.decode = self._side(
                DecodeClient, s.decoded_addr, s.decode_region_dir, buffers, slots
            )
        logger.info(
            "pdlink connector ready: rank=%s buffers=%d page_bytes=%d slots=%d "
            "prefill=%s decode=%s",
            self.rank,
            len(buffers),
            sum(b.item_len for b in buffers),
            slots,
            s.prefilld_addr if s.prefill else "-",
            s.decoded_addr if s.decode else "-",
        )

    def _side(
        self, client_type: Any, addr: str, region_dir: str, buffers: list, slots: int
    ) -> _Side:
        staging = Staging.create(region_dir, buffers, slots)
        # The Watch stream (watch=True) is kept so the client registers the
        # region again after a daemon restart (keep_region); rooms are polled
        # in one batch per step.
        client = client_type(addr, timeout=_CALL_TIMEOUT)
        try:
            client.keep_region(staging.region, rank=self.rank)
            client.wait_connected(30)
        except BaseException:
            client.close()
            staging.close()
            raise
        return _Side(client, staging, slots, self.rank)

    # -- each step --------------------------------------------------------

    def begin_step(self, meta: PdlinkMetadata) -> None:
        """Before the forward: the concurrent flow's rooms of this step."""
        if meta.stages and self.staged is not None:
            self.staged.begin_step(meta.stages)

    def save_kv_layer(self, layer_name: str, meta: PdlinkMetadata) -> None:
        if meta.stages and self.staged is not None:
            self.staged.save_layer(layer_name, meta.stages)

    def wait_for_save(self, meta: PdlinkMetadata) -> None:
        if meta.stages and self.staged is not None:
            self.staged.end_step(meta.stages)

    def worker_meta(self) -> PdlinkWorkerMetadata | None:
        if self.staged is None or not self.staged.ended:
            return None
        ended, self.staged.ended = self.staged.ended, []
        return PdlinkWorkerMetadata(dict.fromkeys(ended, 1))

    def start_load_kv(self, meta: PdlinkMetadata) -> None:
        for job in meta.sends:
            self._sends[job.room] = _Send(job)
            if self.rank[0] != 0 and self.prefill is not None:
                self._join_sender(job)
        for job in meta.loads:
            self._start_load(job)
        for rid in meta.abort_loads:
            room = self._load_by_req.get(rid)
            if room is not None and room in self._loads:
                self._abort_load(self._loads[room], "aborted by vLLM (request finished)")

    def _join_sender(self, job: SendJob) -> None:
        # The scheduler opened the room for rank 0; every other rank joins it.
        assert self.prefill is not None
        try:
            self.prefill.client.open(job.room, expected_receivers=1, rank=self.rank)
        except PdlinkError as err:
            self._sends[job.room].failed = f"OpenSender of rank {self.rank} refused: {err}"

    def _start_load(self, job: LoadJob) -> None:
        load = _Load(job)
        self._load_by_req[job.req_id] = job.room
        if job.error or self.decode is None:
            load.failed = job.error or "no pdlink decode side"
            self._finish_load(load)
            return
        if job.room in self._loads:
            load.failed = f"room {job.room} is already loading for another request on this engine"
            self._finish_load(load)
            return
        self._loads[job.room] = load
        side = self.decode
        try:
            side.client.open(job.room, job.bootstrap, expected_senders=self.rank[1], rank=self.rank)
            load.opened = True
        except PdlinkError as err:
            del self._loads[job.room]
            load.failed = f"OpenReceiver of room {job.room} to {job.bootstrap} refused: {err}"
            self._finish_load(load)
            return
        new = len(job.blocks) - job.prefix_pages
        try:
            slots = side.pool.take(job.room, new)
        except StagingFull as err:
            self._abort_load(load, "staging_full", failed=str(err))
            return
        dst = slots
        if job.prefix_pages:
            # decoded never writes a position below prefix_len: these name
            # pages, they are not held (another room's slots may be among them).
            free = np.setdiff1d(np.arange(side.pool.slots, dtype=np.int64), slots)
            if len(free) < job.prefix_pages:
                self._abort_load(load, "staging_full", failed="too few staging pages to name")
                return
            dst = np.concatenate([free[: job.prefix_pages], slots])
        try:
            side.client.send_metadata(
                job.room, dst, rank=self.rank, prefix_len=job.prefix_pages, timeout=_CALL_TIMEOUT
            )
        except PdlinkError as err:
            self._abort_load(load, "metadata_failed", failed=f"SendMetadata failed: {err}")

    def _abort_load(self, load: _Load, reason: str, failed: str = "") -> None:
        """Abort the room; it is reported when the daemon says it is terminal."""
        load.aborted = True
        if failed:
            load.failed = failed
        try:
            assert self.decode is not None
            self.decode.client.abort(load.job.room, reason, timeout=_CALL_TIMEOUT)
        except PdlinkError as err:
            logger.warning("pdlink abort failed: room=%d err=%s", load.job.room, err)

    def get_transfer_results(self, finished_req_ids: set[str]) -> tuple[set, set, set]:
        # Only this side's sends: every other finished request's id would stay
        # in the set forever.
        if self._sends or self._done_sending:
            ours = {s.job.req_id for s in self._sends.values()} | self._done_sending
            self._finished_seen |= finished_req_ids & ours
        if self._sends and self.prefill is not None:
            self._progress_sends(self.prefill)
        if self.staged is not None and self.staged.rooms:
            for req_id, room, reason in self.staged.poll():
                self._count_failure("send", req_id, room, reason)
        if self._loads and self.decode is not None:
            self._progress_loads(self.decode)
        sending = self._done_sending & self._finished_seen
        self._done_sending -= sending
        self._finished_seen -= sending
        recving, self._done_recving = self._done_recving, set()
        failed, self._failed_recving = self._failed_recving, set()
        return sending, recving, failed

    def _progress_sends(self, side: _Side) -> None:
        rooms = list(self._sends)
        statuses = side.poll(rooms, self.settings.daemon_lost_timeout)
        if statuses is None:
            return
        for st in statuses:
            send = self._sends[st.room_id]
            if send.failed:
                self._finish_send(side, send, abort=send.failed)
            elif st.terminal:
                if st.found and st.state == RoomState.SUCCESS:
                    self._finish_send(side, send)
                else:
                    send.failed = failure_text(st)
                    self._finish_send(side, send)
            elif st.state == RoomState.WAITING_FOR_INPUT and not send.sent:
                self._stage_and_send(side, send, st.prefix_len)

    def _stage_and_send(self, side: _Side, send: _Send, prefix: int) -> None:
        job = send.job
        blocks = job.blocks[min(prefix, len(job.blocks)) :]
        send.sent = True
        try:
            slots = side.pool.take(job.room, len(blocks))
        except StagingFull as err:
            send.failed = str(err)
            self._finish_send(side, send, abort="staging_full")
            return
        side.staging.stage_out(blocks, slots)
        try:
            side.client.send(
                job.room,
                slots,
                rank=self.rank,
                start_position=prefix,
                last=True,
                timeout=_CALL_TIMEOUT,
            )
        except PdlinkError as err:
            send.failed = f"Send failed: {err}"
            self._finish_send(side, send, abort="send_failed")

    def _finish_send(self, side: _Side, send: _Send, abort: str = "") -> None:
        job = send.job
        del self._sends[job.room]
        side.release(job.room, abort_reason=abort)
        if send.failed:
            self._count_failure("send", job.req_id, job.room, send.failed)
        self._done_sending.add(job.req_id)

    def _progress_loads(self, side: _Side) -> None:
        rooms = list(self._loads)
        statuses = side.poll(rooms, self.settings.daemon_lost_timeout)
        if statuses is None:
            return
        for st in statuses:
            load = self._loads[st.room_id]
            if not st.terminal:
                continue
            if st.found and st.state == RoomState.SUCCESS and not load.aborted:
                job = load.job
                slots = side.pool.held(job.room)
                assert slots is not None
                side.staging.stage_in(slots, job.blocks[job.prefix_pages :])
            elif not load.failed:
                load.failed = failure_text(st)
            del self._loads[st.room_id]
            side.release(st.room_id)
            self._finish_load(load)

    def _finish_load(self, load: _Load) -> None:
        job = load.job
        self._load_by_req.pop(job.req_id, None)
        if load.failed:
            self._count_failure("load", job.req_id, job.room, load.failed)
            self._failed_recving.add(job.req_id)
        self._done_recving.add(job.req_id)

    def _count_failure(self, what: str, req_id: str, room: int, reason: str) -> None:
        self.failures[reason.split(":", 1)[0]] += 1
        logger.warning(
            "pdlink %s failed: req=%s room=%d reason=%s (failures so far: %s)",
            what,
            req_id,
            room,
            reason,
            dict(self.failures),
        )

    def shutdown(self) -> None:
        for side in (self.prefill, self.decode):
            if side is not None:
                side.close()
