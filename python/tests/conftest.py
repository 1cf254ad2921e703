"""Fixtures: real daemons (tests/daemons.py), clients, and registered regions."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import pytest
from daemons import Pair

from pdlink import DecodeClient, PrefillClient, Region, RegionLayout

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
    p.stop()
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


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    rep = yield
    if rep.when == "call":
        item.rep_call = rep
    return rep
