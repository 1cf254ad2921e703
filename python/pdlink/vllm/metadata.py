"""What the scheduler side hands the worker side each step, and the kv_transfer_params."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorMetadata

# kv_transfer_params keys (see KV_PARAMS / docs/vllm.md): the room, prefilld's
# bootstrap socket, and the page count decode must allocate for.
ROOM = "pdlink_room"
BOOTSTRAP = "pdlink_bootstrap"
PAGES = "pdlink_pages"
ERROR = "pdlink_error"


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
class PdlinkMetadata(KVConnectorMetadata):
    sends: list[SendJob] = field(default_factory=list)
    loads: list[LoadJob] = field(default_factory=list)
    # Decode requests finished (aborted) while their load was in flight.
    abort_loads: list[str] = field(default_factory=list)


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
    }


def failed_params(reason: str) -> dict[str, Any]:
    return {"do_remote_prefill": True, "do_remote_decode": False, ERROR: reason}
