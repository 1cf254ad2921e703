"""What the scheduler side hands the worker side each step, and the kv_transfer_params."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorMetadata,
    KVConnectorWorkerMetadata,
)

# kv_transfer_params keys (see KV_PARAMS / docs/vllm.md): the room, prefilld's
# bootstrap socket, and the page count decode must allocate for.
ROOM = "pdlink_room"
BOOTSTRAP = "pdlink_bootstrap"
PAGES = "pdlink_pages"
ERROR = "pdlink_error"
PROMPT_HASH = "pdlink_prompt_hash"
# The concurrent flow (pdlink.vllm.proxy --flow concurrent): the proxy names the room
# to both servers at once, FLOW: CONCURRENT in decode's params says so.
FLOW = "pdlink_flow"
CONCURRENT = "concurrent"


def prompt_hash(token_ids: Any) -> str:
    """A digest of the prompt's token ids: decode refuses params made for another prompt
    (same length or not), which would otherwise load another request's KV."""
    data = np.asarray(list(token_ids or ()), dtype=np.int64).tobytes()
    return hashlib.blake2b(data, digest_size=8).hexdigest()


@dataclass
class SendJob:
    """Prefill: a finished request whose blocks wait for decode's pages."""

    req_id: str
    room: int
    blocks: list[int]


@dataclass
class LoadJob:
    """Decode: a request whose prompt blocks come from prefill's room.

    blocks are all page positions' blocks; the first prefix_pages are the
    local prefix cache's and move no bytes. error set: the params were
    refused, the load fails without a room.
    """

    req_id: str
    room: int
    bootstrap: str
    blocks: list[int]
    prefix_pages: int
    error: str = ""


@dataclass
class StageJob:
    """Prefill, concurrent flow: a request computed this step whose room is already open.

    Its first end_page pages are whole once this step's forward ran: each
    layer's are staged as that layer's forward wrote them, and sent at once
    when decode is bound (per layer), else as soon as it is. blocks are the
    request's blocks of those pages; done: the prompt is complete, the room
    can be closed (its last Send) once every buffer has every page.
    """

    req_id: str
    room: int
    blocks: list[int]
    end_page: int
    pages: int
    done: bool


@dataclass
class PdlinkMetadata(KVConnectorMetadata):
    sends: list[SendJob] = field(default_factory=list)
    stages: list[StageJob] = field(default_factory=list)
    loads: list[LoadJob] = field(default_factory=list)
    # Decode requests finished (aborted) while their load was in flight.
    abort_loads: list[str] = field(default_factory=list)


@dataclass
class PdlinkWorkerMetadata(KVConnectorWorkerMetadata):
    """Worker -> scheduler, each step: the concurrent flow's rooms each rank saw end
    (room -> ranks), so the scheduler keeps the engine stepping until all did."""

    rooms_ended: dict[int, int] = field(default_factory=dict)

    def aggregate(self, other: KVConnectorWorkerMetadata) -> KVConnectorWorkerMetadata:
        assert isinstance(other, PdlinkWorkerMetadata)
        out = dict(self.rooms_ended)
        for room, n in other.rooms_ended.items():
            out[room] = out.get(room, 0) + n
        return PdlinkWorkerMetadata(out)


def prefill_params(
    *,
    room: int,
    bootstrap: str,
    pages: int,
    block_size: int,
    num_tokens: int,
    engine_id: str,
    req_id: str,
    tp_size: int,
    prompt_digest: str,
) -> dict[str, Any]:
    return {
        "do_remote_prefill": True,
        "do_remote_decode": False,
        ROOM: room,
        BOOTSTRAP: bootstrap,
        PAGES: pages,
        "remote_block_size": block_size,
        "remote_num_tokens": num_tokens,
        "remote_engine_id": engine_id,
        "remote_request_id": req_id,
        "tp_size": tp_size,
        PROMPT_HASH: prompt_digest,
    }


def failed_params(reason: str) -> dict[str, Any]:
    return {"do_remote_prefill": True, "do_remote_decode": False, ERROR: reason}


def failure_text(st: Any) -> str:
    """A terminal, not successful RoomStatus's reason, as the logs and errors say it."""
    if not st.found:
        return "room gone from the daemon (cleared, reaped or restarted)"
    reason = st.reason or "unknown"
    if st.peer_reason:
        reason += f" (peer: {st.peer_reason})"
    return reason
