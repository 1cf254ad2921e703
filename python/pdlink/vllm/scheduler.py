"""PdlinkConnector's scheduler side: which requests move, rooms, held blocks.

Prefill: a request sent with kv_transfer_params {"do_remote_decode": true}
finishes (max_tokens 1); request_finished opens its room on prefilld here,
before the answer leaves the engine (decode's metadata for a room prefilld
does not know is refused, so the room must exist first), holds the
request's blocks (delay_free) and returns the params decode needs. The
worker frees them (finished_sending) when the room is terminal.

Prefill, concurrent flow (the proxy names the room to both servers at once):
on_new_request opens the room as the request arrives; each step that
computes some of its prompt hands the worker a StageJob, so every layer's
pages are staged as the forward writes them and leave once decode is bound.
When the request finishes its pages are all in staging: its blocks are freed
at once, not held.

Decode: a request carrying those params loads its prompt's KV
asynchronously; update_state_after_alloc records the blocks vLLM allocated
and how many leading ones its prefix cache already holds, and the worker
opens the room and reports the load only after pdlink's Success (a Failed
room is a failed load).
"""

from __future__ import annotations

import logging
import secrets
from dataclasses import dataclass, field
from typing import Any

from vllm.v1.request import RequestStatus

from pdlink import PdlinkError, PrefillClient
from pdlink.vllm.config import Settings
from pdlink.vllm.metadata import (
    BOOTSTRAP,
    CONCURRENT,
    ERROR,
    FLOW,
    PAGES,
    PROMPT_HASH,
    ROOM,
    LoadJob,
    PdlinkMetadata,
    PdlinkWorkerMetadata,
    SendJob,
    StageJob,
    failed_params,
    prefill_params,
    prompt_hash,
)

logger = logging.getLogger("pdlink.vllm")

# OpenSender answers in about a millisecond; a daemon that does not answer in
# this long is down, and the request's blocks are freed at once instead.
_OPEN_TIMEOUT = 2.0


def _new_room() -> int:
    return secrets.randbits(63) or 1


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _valid_room(room: Any) -> bool:
    return isinstance(room, int) and not isinstance(room, bool) and 0 < room < 2**63


@dataclass
class _Opened:
    """Prefill, concurrent flow: a request whose room was opened when it arrived."""

    room: int
    prompt_tokens: int
    blocks: list[int] = field(default_factory=list)
    error: str = ""
    # A StageJob went to the worker: it polls the room and clears it.
    staged: bool = False


class SchedulerSide:
    def __init__(self, settings: Settings, vllm_config: Any, kv_cache_config: Any) -> None:
        self.settings = settings
        self.block_size = int(vllm_config.cache_config.block_size)
        self.tp_size = int(vllm_config.parallel_config.tensor_parallel_size)
        self.engine_id = str(vllm_config.kv_transfer_config.engine_id)
        self.client = (
            PrefillClient(settings.prefilld_addr, watch=False, timeout=_OPEN_TIMEOUT)
            if settings.prefill
            else None
        )
        self._meta = PdlinkMetadata()
        self._loading: set[str] = set()  # decode: loads in flight
        self._holding: set[str] = set()  # prefill: blocks held for a room
        self._opened: dict[str, _Opened] = {}  # prefill: concurrent flow's rooms
        # Their rooms after the request finished, until every rank's worker saw
        # them end: room -> ranks still to report.
        self._pushing: dict[int, int] = {}
        # Rooms a worker saw end before their request finished here (decode's
        # Success in the request's last step): ranks already reported.
        self._ended_early: dict[int, int] = {}

    # -- decode -----------------------------------------------------------

    def get_num_new_matched_tokens(
        self, request: Any, num_computed_tokens: int
    ) -> tuple[int, bool]:
        params = request.kv_transfer_params
        if not params or not params.get("do_remote_prefill"):
            return 0, False
        total = request.num_prompt_tokens
        remote = params.get("remote_num_tokens")
        if isinstance(remote, int) and 0 < remote <= total and ERROR not in params:
            total = remote
        count = total - num_computed_tokens
        # Refused params still take the async path: the worker fails the
        # load with the reason, which vLLM's kv_load_failure_policy turns
        # into an error (or a local recompute), never a silent local prefill.
        return (count, True) if count > 0 else (0, False)

    def _refusal(self, request: Any, params: dict) -> str:
        if not self.settings.decode:
            return "this server runs no pdlink decode side (no decoded_addr)"
        if ERROR in params:
            return f"prefill refused the transfer: {params[ERROR]}"
        room, bootstrap, pages = params.get(ROOM), params.get(BOOTSTRAP), params.get(PAGES)
        if not _valid_room(room):
            return f"kv_transfer_params name no pdlink room ({ROOM}={room!r})"
        if not isinstance(bootstrap, str) or not bootstrap.startswith("tcp://"):
            return f"kv_transfer_params name no prefilld bootstrap ({BOOTSTRAP}={bootstrap!r})"
        if params.get(FLOW) == CONCURRENT:
            # Prefill has not computed yet: there is nothing of it to check here.
            # The room binds with this request's page count, and prefilld refuses
            # a Send past it or a last Send short of it; this engine's block size
            # is in its region's page size, which prefilld's must equal.
            return ""
        if params.get("remote_block_size") != self.block_size:
            return (
                f"prefill's block size {params.get('remote_block_size')!r} is not this "
                f"engine's {self.block_size}"
            )
        if params.get("tp_size") != self.tp_size:
            return f"prefill TP {params.get('tp_size')!r} is not this engine's {self.tp_size}"
        remote = params.get("remote_num_tokens")
        if not isinstance(remote, int) or not 0 < remote <= request.num_prompt_tokens:
            return (
                f"prefill holds {remote!r} tokens, this request's prompt has "
                f"{request.num_prompt_tokens}: another request's params"
            )
        if pages != _cdiv(remote, self.block_size):
            return f"{PAGES}={pages!r} does not cover {remote} tokens"
        if params.get(PROMPT_HASH) != prompt_hash(request.prompt_token_ids[:remote]):
            return "kv_transfer_params were made for another prompt (prompt hash differs)"
        return ""

    def update_state_after_alloc(self, request: Any, blocks: Any, num_external_tokens: int) -> None:
        params = request.kv_transfer_params
        if not params or not params.get("do_remote_prefill") or num_external_tokens <= 0:
            return
        # One load per request: the second call (after the load) finds it off.
        params["do_remote_prefill"] = False
        block_ids = list(blocks.get_block_ids()[0])
        error = self._refusal(request, params)
        room = int(params.get(ROOM) or 0) if not error else 0
        total = request.num_prompt_tokens
        if params.get(FLOW) == CONCURRENT:
            pages = _cdiv(total, self.block_size) if not error else 0
        else:
            pages = int(params.get(PAGES) or 0) if not error else 0
            if not error:
                total = int(params["remote_num_tokens"])
        local = total - num_external_tokens
        prefix = 0
        if not error:
            if local % self.block_size:
                error = f"the local prefix hit of {local} tokens is not whole blocks"
            elif len(block_ids) < pages:
                error = f"{len(block_ids)} blocks allocated for {pages} pages"
            else:
                prefix = local // self.block_size
        self._loading.add(request.request_id)
        self._meta.loads.append(
            LoadJob(
                req_id=request.request_id,
                room=room,
                bootstrap=str(params.get(BOOTSTRAP) or ""),
                blocks=block_ids[:pages],
                prefix_pages=prefix,
                error=error,
            )
        )

    # -- prefill ----------------------------------------------------------

    def on_new_request(self, request: Any) -> None:
        params = request.kv_transfer_params
        if not params or not params.get("do_remote_decode") or ROOM not in params:
            return
        # The concurrent flow: decode may be binding this room already (prefilld
        # parks its metadata until the room opens), so it opens now.
        rid, room = request.request_id, params.get(ROOM)
        opened = _Opened(
            room=room if _valid_room(room) else 0, prompt_tokens=request.num_prompt_tokens
        )
        self._opened[rid] = opened
        if not _valid_room(room):
            opened.error = f"kv_transfer_params name no pdlink room ({ROOM}={room!r})"
        elif self.client is None:
            opened.error = "the prefill server runs no pdlink prefill side"
        else:
            try:
                self.client.open(room, expected_receivers=1, rank=(0, self.tp_size))
            except PdlinkError as err:
                # Not aborted: the id may be another request's live room. Decode's
                # metadata for it fails at prefilld's --bootstrap-timeout.
                opened.error = f"prefilld refused room {room}: {err}"
        if opened.error:
            logger.warning("pdlink room not opened: req=%s err=%s", rid, opened.error)

    def _stage_jobs(self, scheduler_output: Any) -> None:
        if not self._opened:
            return
        scheduled = scheduler_output.num_scheduled_tokens
        for new in scheduler_output.scheduled_new_reqs:
            opened = self._opened.get(new.req_id)
            if opened is not None:
                opened.blocks = list(new.block_ids[0])
                self._stage(new.req_id, opened, new.num_computed_tokens, scheduled)
        cached = scheduler_output.scheduled_cached_reqs
        for i, rid in enumerate(cached.req_ids):
            opened = self._opened.get(rid)
            if opened is None:
                continue
            new_blocks = cached.new_block_ids[i]
            if rid in cached.resumed_req_ids:
                # Preempted and scheduled again: its blocks are new; the pages it
                # staged before stay valid (the same prompt's KV).
                opened.blocks = list(new_blocks[0]) if new_blocks else []
            elif new_blocks:
                opened.blocks += new_blocks[0]
            self._stage(rid, opened, cached.num_computed_tokens[i], scheduled)

    def _stage(self, rid: str, opened: _Opened, computed: int, scheduled: dict) -> None:
        if opened.error:
            return
        end = computed + int(scheduled.get(rid, 0))
        pages = _cdiv(opened.prompt_tokens, self.block_size)
        done = end >= opened.prompt_tokens
        end_page = pages if done else end // self.block_size
        opened.staged = True
        self._meta.stages.append(
            StageJob(
                req_id=rid,
                room=opened.room,
                blocks=opened.blocks[:end_page],
                end_page=end_page,
                pages=pages,
                done=done,
            )
        )

    def pushing(self) -> bool:
        return bool(self._pushing)

    def _finish_opened(self, request: Any, opened: _Opened) -> tuple[bool, dict | None]:
        if opened.staged:
            left = self.tp_size - self._ended_early.pop(opened.room, 0)
            if left > 0:
                self._pushing[opened.room] = left
        if opened.error:
            return False, failed_params(opened.error)
        if request.status not in (
            RequestStatus.FINISHED_LENGTH_CAPPED,
            RequestStatus.FINISHED_STOPPED,
        ):
            # Aborted or failed before its prompt was computed: decode's load
            # fails with this reason at once, not at a bound.
            assert self.client is not None
            reason = f"prefill request ended {request.status.name.lower()}"
            try:
                self.client.abort(opened.room, reason, timeout=_OPEN_TIMEOUT)
                if not opened.staged:
                    self.client.clear([opened.room], timeout=_OPEN_TIMEOUT)
            except PdlinkError as err:
                logger.warning("pdlink abort failed: room=%d err=%s", opened.room, err)
            return False, None
        # Every page is in staging (the worker copied it as the forward wrote
        # it): vLLM may free the blocks now.
        num_tokens = opened.prompt_tokens
        return False, prefill_params(
            room=opened.room,
            bootstrap=self.settings.prefill_bootstrap,
            pages=_cdiv(num_tokens, self.block_size),
            block_size=self.block_size,
            num_tokens=num_tokens,
            engine_id=self.engine_id,
            req_id=request.request_id,
            tp_size=self.tp_size,
            prompt_digest=prompt_hash(request.prompt_token_ids[:num_tokens]),
        )

    def request_finished(self, request: Any, block_ids: list[int]) -> tuple[bool, dict | None]:
        rid = request.request_id
        if rid in self._loading:
            # Finished (aborted) while its KV was still coming: the worker
            # aborts the room and reports the load when the room is terminal;
            # vLLM frees the blocks then.
            self._meta.abort_loads.append(rid)
            return False, None
        opened = self._opened.pop(rid, None)
        if opened is not None:
            return self._finish_opened(request, opened)
        params = request.kv_transfer_params
        if not params or not params.get("do_remote_decode"):
            return False, None
        if request.status not in (
            RequestStatus.FINISHED_LENGTH_CAPPED,
            RequestStatus.FINISHED_STOPPED,
        ):
            return False, None  # aborted or failed: nothing to hand over
        if self.client is None:
            return False, failed_params("the prefill server runs no pdlink prefill side")
        if not block_ids:
            return False, failed_params("the prefill request holds no KV blocks")
        room = _new_room()
        try:
            self.client.open(room, expected_receivers=1, rank=(0, self.tp_size))
        except PdlinkError as err:
            logger.warning("pdlink OpenSender failed: req=%s room=%d err=%s", rid, room, err)
            return False, failed_params(f"prefilld refused room {room}: {err}")
        self._holding.add(rid)
        self._meta.sends.append(SendJob(req_id=rid, room=room, blocks=list(block_ids)))
        num_tokens = min(int(request.num_computed_tokens), len(block_ids) * self.block_size)
        return True, prefill_params(
            room=room,
            bootstrap=self.settings.prefill_bootstrap,
            pages=len(block_ids),
            block_size=self.block_size,
            num_tokens=num_tokens,
            engine_id=self.engine_id,
            req_id=rid,
            tp_size=self.tp_size,
            prompt_digest=prompt_hash(request.prompt_token_ids[:num_tokens]),
        )

    # -- both -------------------------------------------------------------

    def build_connector_meta(self, scheduler_output: Any) -> PdlinkMetadata:
        self._stage_jobs(scheduler_output)
        meta, self._meta = self._meta, PdlinkMetadata()
        return meta

    def update_connector_output(self, output: Any) -> None:
        ended = getattr(output, "kv_connector_worker_meta", None)
        if isinstance(ended, PdlinkWorkerMetadata):
            for room, ranks in ended.rooms_ended.items():
                if room not in self._pushing:
                    self._ended_early[room] = self._ended_early.get(room, 0) + ranks
                elif self._pushing[room] > ranks:
                    self._pushing[room] -= ranks
                else:
                    del self._pushing[room]
        for rid in output.finished_recving or ():
            self._loading.discard(rid)
        for rid in output.finished_sending or ():
            self._holding.discard(rid)

    def shutdown(self) -> None:
        if self.client is not None:
            self.client.close()
