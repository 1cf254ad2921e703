"""Fixtures: real daemons (tests/daemons.py), clients, and registered regions."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import pytest
from daemons import Pair

from pdlink import DecodeClient, PrefillClient, Region, RegionLayout, RoomState
from pdlink.client import wait_for

# Two buffers of 64 pages of 256 bytes and 16 aux rows of 32 bytes: small
# enough that a test fills every page, big enough for many rooms at once.
LAYOUT = RegionLayout.uniform(buffers=2, pages=64, item_len=256, aux_rows=16, aux_row_len=32)


@dataclass
class Env:
    pair: Pair
    prefill: PrefillClient
    decode: DecodeClient
    src: Region
    dst: Region

    @property
    def bootstrap(self) -> str:
        return self.pair.prefill.bootstrap


@pytest.fixture
def pair(tmp_path, request) -> Iterator[Pair]:
    extra = getattr(request, "param", {})
    p = Pair(tmp_path, tuple(extra.get("prefill", ())), tuple(extra.get("decode", ())))
    yield p
    p.kill()
    if request.node.rep_call.failed if hasattr(request.node, "rep_call") else False:
        print(p.logs())


@pytest.fixture
def env(pair) -> Iterator[Env]:
    pre = PrefillClient(pair.prefill.address)
    dec = DecodeClient(pair.decode.address)
    src = Region.create(str(pair.prefill.region_dir), LAYOUT)
    dst = Region.create(str(pair.decode.region_dir), LAYOUT)
    pre.register_region(src)
    dec.register_region(dst)
    assert pre.wait_connected(10) and dec.wait_connected(10)
    yield Env(pair, pre, dec, src, dst)
    pre.close()
    dec.close()
    src.close()
    dst.close()


@pytest.fixture(autouse=True)
def no_watch_thread_left():
    """Every client a test made is closed by its end: no watch thread outlives it."""
    yield
    wait_for(
        lambda: not [t for t in threading.enumerate() if t.name.startswith("pdlink-watch")],
        10,
        what="watch threads of closed clients ended",
    )


def _bootstrap_threads() -> list[threading.Thread]:
    # SGLang's bootstrap server runs its aiohttp app on a thread whose target
    # is CommonKVBootstrapServer._run_server (Python names it after the target).
    return [t for t in threading.enumerate() if t.name.endswith("(_run_server)")]


@pytest.fixture(autouse=True)
def no_bootstrap_server_left():
    """Every SGLang bootstrap server a test started (tests/sglang) is closed by its end.

    The "Task was destroyed but it is pending! ... CommonKVBootstrapServer.
    _cleanup_expired_entries()" lines the suite prints at exit do not mean a
    server was left running: SGLang's own close() (0.5.23,
    disaggregation/common/conn.py) stops the server's event loop without
    cancelling the cleanup task it started on it, so asyncio reports that
    task whenever a closed server is garbage collected; during a test pytest's
    log capture hides it, the servers still referenced at interpreter exit
    print theirs. Nothing silences it: it is SGLang's to fix.
    """
    yield
    wait_for(lambda: not _bootstrap_threads(), 10, what="bootstrap servers of the test closed")


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    rep = yield
    if rep.when == "call":
        item.rep_call = rep
    return rep


def settle(pred, what: str, timeout: float = 15.0):
    """Wait (a bounded poll) until pred() is truthy; returns its value."""
    return wait_for(pred, timeout, what=what)


def state_of(client, room: int) -> RoomState | None:
    st = client.status(room)
    return st.state if st is not None else None


def fill(region: Region, buffer: int, page: int, seed: int) -> None:
    """A page pattern that differs per buffer, page and seed."""
    row = region.pages(buffer)[page]
    row[:] = (np.arange(row.size, dtype=np.uint32) * 31 + seed * 7 + buffer * 13 + page) % 251


def open_bound(env: Env, room: int, dst_pages, *, aux_index: int = 0) -> int:
    """Open room on both sides, send decode's metadata, wait until prefill is bound
    (WaitingForInput); returns decode's nonce."""
    d = env.decode.open(room, env.bootstrap)
    env.prefill.open(room)
    env.decode.send_metadata(room, dst_pages, aux_index=aux_index)
    settle(
        lambda: state_of(env.prefill, room) == RoomState.WAITING_FOR_INPUT,
        f"prefill room {room} bound",
    )
    return d.nonce
