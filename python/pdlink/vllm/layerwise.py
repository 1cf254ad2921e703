"""Prefill's worker side of the concurrent flow: pages staged per layer, sent once decode is bound.

The scheduler opened the room when the request arrived and hands a StageJob
each step that computes some of its prompt. Here, for each job:

- save_kv_layer (each attention layer, right after its forward wrote the
  KV): that layer's buffers of the job's whole pages are copied into the
  room's staging slots, and, if decode has bound the room, sent at once
  (a Send naming that layer's buffers), so pages leave while the next layers
  compute.
- wait_for_save (the step's end): any buffer no save_kv_layer staged (a
  layer vLLM did not report) is staged now, so correctness never rests on
  the per-layer hook; what decode can take is sent.
- every step (poll): a room decode bound since gets everything staged so far;
  a terminal room gives its slots back and is cleared.

The last Send (every buffer at every page) closes the room. The engine's
blocks are not held: once the prompt is complete every page is in staging,
so request_finished frees them at once.

Positions below decode's prefix (its own prefix cache) are never sent;
they are staged anyway, since decode's prefix is only known once it bound.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import numpy as np

from pdlink import PdlinkError, RoomState
from pdlink.sglang.staging import StagingFull
from pdlink.vllm.metadata import StageJob, failure_text

logger = logging.getLogger("pdlink.vllm")

_CALL_TIMEOUT = 5.0


@dataclass
class _Room:
    req_id: str
    room: int
    pages: int
    slots: np.ndarray
    # Per buffer: pages staged, and the next position to send.
    staged: list[int]
    sent: list[int]
    bound: bool = False
    prefix: int = 0
    # The prompt is complete (every page staged once the step ends).
    done: bool = False
    closed: bool = False
    failed: str = ""
    # Sends made inside the forward (save_kv_layer) and after it.
    layer_sends: int = 0
    late_sends: int = 0


class StagedSends:
    """The concurrent flow's rooms on one prefill side (see the module doc)."""

    def __init__(
        self, side: Any, rank: tuple[int, int], layers: dict[str, list[int]], lost_timeout: float
    ) -> None:
        self.side = side
        self.rank = rank
        self.lost_timeout = lost_timeout
        self.layers = layers
        self.rooms: dict[int, _Room] = {}
        # Rooms ended since the scheduler last heard (worker metadata).
        self.ended: list[int] = []
        self.nbuf = sum(len(b) for b in layers.values())

    # -- each step, before the forward ------------------------------------

    def begin_step(self, jobs: list[StageJob]) -> None:
        """Rooms new this step are joined (ranks > 0) and get slots; unbound ones are
        polled once, so a decode that bound in the meantime gets per-layer Sends."""
        for job in jobs:
            if job.room not in self.rooms:
                self._start(job)
        unbound = [j.room for j in jobs if self._live(j.room) and not self.rooms[j.room].bound]
        if unbound:
            self._poll(unbound)

    def _start(self, job: StageJob) -> None:
        try:
            slots = self.side.pool.take(job.room, job.pages)
        except StagingFull as err:
            slots = np.zeros(0, dtype=np.int64)
            failed = f"staging_full: {err}"
        else:
            failed = ""
        room = _Room(
            job.req_id, job.room, job.pages, slots, [0] * self.nbuf, [0] * self.nbuf, failed=failed
        )
        self.rooms[job.room] = room
        if not failed and self.rank[0] != 0:
            # The scheduler opened the room for rank 0; every other rank joins it.
            try:
                self.side.client.open(job.room, expected_receivers=1, rank=self.rank)
            except PdlinkError as err:
                room.failed = f"OpenSender of rank {self.rank} refused: {err}"
        if room.failed:
            self._abort(room)

    def _live(self, room: int) -> bool:
        r = self.rooms.get(room)
        return r is not None and not r.failed and not r.closed

    # -- the forward --------------------------------------------------------

    def save_layer(self, layer: str, jobs: list[StageJob]) -> None:
        bufs = self.layers.get(layer)
        if not bufs:
            return
        for job in jobs:
            if self._live(job.room):
                room = self.rooms[job.room]
                self._stage(room, job, bufs)
                if room.bound:
                    room.layer_sends += self._send_ready(room, bufs)

    def end_step(self, jobs: list[StageJob]) -> None:
        every = list(range(self.nbuf))
        for job in jobs:
            if self._live(job.room):
                room = self.rooms[job.room]
                self._stage(room, job, every)
                if room.bound:
                    room.late_sends += self._send_ready(room, every)

    def _stage(self, room: _Room, job: StageJob, bufs: list[int]) -> None:
        todo = [b for b in bufs if room.staged[b] < job.end_page]
        if todo:
            room.done = room.done or job.done
        # Buffers at different counts (a layer staged by save_layer, another
        # not) are staged from their own count; one copy per distinct start.
        for first in sorted({room.staged[b] for b in todo}):
            group = [b for b in todo if room.staged[b] == first]
            self.side.staging.stage_out(
                job.blocks[first : job.end_page], room.slots[first : job.end_page], buffers=group
            )
            for b in group:
                room.staged[b] = job.end_page

    def _send_ready(self, room: _Room, bufs: list[int]) -> int:
        """Send what decode can take of bufs, one Send per distinct range; the Send that
        leaves every buffer at every page is the last. Returns the Sends made."""
        groups: dict[tuple[int, int], list[int]] = {}
        for b in bufs:
            lo, hi = max(room.sent[b], room.prefix), room.staged[b]
            if hi > lo:
                groups.setdefault((lo, hi), []).append(b)
        after = list(room.sent)
        for (_, hi), group in groups.items():
            for b in group:
                after[b] = hi
        complete = room.done and all(max(a, room.prefix) >= room.pages for a in after)
        ranges = list(groups.items())
        if complete and not ranges and not room.closed:
            # Decode's prefix holds every page left: an empty last Send closes it.
            ranges = [((room.prefix, room.prefix), [])]
        made = 0
        for i, ((lo, hi), group) in enumerate(ranges):
            last = complete and i == len(ranges) - 1
            try:
                self.side.client.send(
                    room.room,
                    room.slots[lo:hi],
                    rank=self.rank,
                    start_position=lo,
                    buffers=group,
                    last=last,
                    timeout=_CALL_TIMEOUT,
                )
            except PdlinkError as err:
                room.failed = f"Send failed: {err}"
                self._abort(room, "send_failed")
                return made
            made += 1
            for b in group:
                room.sent[b] = hi
            room.closed = room.closed or last
        return made

    # -- every step, after the forward -------------------------------------

    def poll(self) -> list[tuple[str, int, str]]:
        """Moves every room on; returns (req_id, room, reason) of rooms that failed."""
        if not self.rooms:
            return []
        return self._poll(list(self.rooms))

    def _poll(self, rooms: list[int]) -> list[tuple[str, int, str]]:
        statuses = self.side.poll(rooms, self.lost_timeout)
        if statuses is None:
            return []
        failed = []
        for st in statuses:
            room = self.rooms.get(st.room_id)
            if room is None:
                continue
            if st.terminal:
                if not (st.found and st.state == RoomState.SUCCESS):
                    reason = room.failed or failure_text(st)
                    failed.append((room.req_id, room.room, reason))
                else:
                    # How the pages left: inside the forward (per layer, decode
                    # bound before it ran) or after it.
                    logger.info(
                        "pdlink room sent: req=%s room=%d sends_in_forward=%d "
                        "sends_after_forward=%d",
                        room.req_id,
                        room.room,
                        room.layer_sends,
                        room.late_sends,
                    )
                del self.rooms[st.room_id]
                self.side.release(st.room_id)
                self.ended.append(st.room_id)
            elif st.state == RoomState.WAITING_FOR_INPUT and not room.bound and not room.failed:
                room.bound, room.prefix = True, int(st.prefix_len)
                room.late_sends += self._send_ready(room, list(range(self.nbuf)))
        return failed

    def _abort(self, room: _Room, reason: str = "") -> None:
        try:
            self.side.client.abort(room.room, reason or room.failed, timeout=_CALL_TIMEOUT)
        except PdlinkError as err:
            logger.warning("pdlink abort failed: room=%d err=%s", room.room, err)
