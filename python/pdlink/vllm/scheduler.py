"""PdlinkConnector's scheduler side: which requests move, rooms, held blocks.

Prefill: a request sent with kv_transfer_params {"do_remote_decode": true}
finishes (max_tokens 1); request_finished opens its room on prefilld here,
before the answer leaves the engine (decode's metadata for a room prefilld
does not know is refused, so the room must exist first), holds the
request's blocks (delay_free) and returns the params decode needs. The
worker frees them (finished_sending) when the room is terminal.

Decode: a request carrying those params loads its prompt's KV
asynchronously; update_state_after_alloc records the blocks vLLM allocated
and how many leading ones its prefix cache already holds, and the worker
opens the room and reports the load only after pdlink's Success (a Failed
room is a failed load).
"""

from __future__ import annotations

import logging
import secrets
from typing import Any

from vllm.v1.request import RequestStatus

from pdlink import PdlinkError, PrefillClient
from pdlink.vllm.config import Settings
from pdlink.vllm.metadata import (
    BOOTSTRAP,
    ERROR,
    PAGES,
    PROMPT_HASH,
    ROOM,
    LoadJob,
    PdlinkMetadata,
    SendJob,
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
        if not isinstance(room, int) or isinstance(room, bool) or not 0 < room < 2**63:
            return f"kv_transfer_params name no pdlink room ({ROOM}={room!r})"
        if not isinstance(bootstrap, str) or not bootstrap.startswith("tcp://"):
            return f"kv_transfer_params name no prefilld bootstrap ({BOOTSTRAP}={bootstrap!r})"
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
        pages = int(params.get(PAGES) or 0) if not error else 0
        total = int(params["remote_num_tokens"]) if not error else request.num_prompt_tokens
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

    def request_finished(self, request: Any, block_ids: list[int]) -> tuple[bool, dict | None]:
        rid = request.request_id
        if rid in self._loading:
            # Finished (aborted) while its KV was still coming: the worker
            # aborts the room and reports the load when the room is terminal;
            # vLLM frees the blocks then.
            self._meta.abort_loads.append(rid)
            return False, None
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
        meta, self._meta = self._meta, PdlinkMetadata()
        return meta

    def update_connector_output(self, output: Any) -> None:
        for rid in output.finished_recving or ():
            self._loading.discard(rid)
        for rid in output.finished_sending or ():
            self._holding.discard(rid)

    def shutdown(self) -> None:
        if self.client is not None:
            self.client.close()
