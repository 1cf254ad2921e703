"""The region helper: files, views and the RegionLayout a daemon registers."""

from __future__ import annotations

import mmap

import numpy as np
import pytest

from pdlink import AuxLayout, BufferLayout, Region, RegionLayout
from pdlink.v1 import common_pb2


def test_layout_places_each_part_page_aligned_without_overlap():
    layout = RegionLayout((BufferLayout(3, 100), BufferLayout(5, 64)), AuxLayout(4, 10))
    assert layout.offsets == (0, mmap.PAGESIZE)
    assert layout.aux_offset == 2 * mmap.PAGESIZE
    assert layout.size == 3 * mmap.PAGESIZE
    msg = layout.to_proto(rank=(1, 2))
    assert (msg.rank.tp_rank, msg.rank.tp_size) == (1, 2)
    assert [(b.offset, b.length, b.item_len) for b in msg.buffers] == [
        (0, 300, 100),
        (mmap.PAGESIZE, 320, 64),
    ]
    assert (msg.aux.offset, msg.aux.row_len, msg.aux.rows) == (2 * mmap.PAGESIZE, 10, 4)
    assert msg.attention == common_pb2.ATTENTION_UNSPECIFIED


def test_described_layout_carries_the_head_fields():
    b = BufferLayout(8, 16 * 2 * 128, page_tokens=16, total_heads=8, rank_heads=2, head_bytes=128)
    msg = RegionLayout((b,), attention="mha").to_proto(rank=(0, 4))
    assert msg.attention == common_pb2.ATTENTION_MHA
    got = msg.buffers[0]
    assert (got.page_tokens, got.total_heads, got.rank_heads, got.head_bytes) == (16, 8, 2, 128)
    with pytest.raises(ValueError):
        RegionLayout((b,), attention="gqa")


def test_views_write_through_to_the_file_and_open_sees_them(tmp_path):
    layout = RegionLayout.uniform(buffers=2, pages=4, item_len=32, aux_rows=2, aux_row_len=8)
    r = Region.create(str(tmp_path), layout, name="r0")
    assert r.pages(1).shape == (4, 32) and r.aux().shape == (2, 8)
    r.pages(1)[2] = 9
    r.aux()[1] = 5
    again = Region.open(r.path, layout)
    assert (again.pages(1)[2] == 9).all() and (again.aux()[1] == 5).all()
    assert (again.pages(0) == 0).all()
    with open(r.path, "rb") as f:
        raw = np.frombuffer(f.read(), dtype=np.uint8)
    assert (raw[layout.offsets[1] + 2 * 32 : layout.offsets[1] + 3 * 32] == 9).all()
    assert again.identity() == r.identity()
    r.close()
    again.close()
    with pytest.raises(ValueError, match="closed"):
        r.pages(0)
    with pytest.raises(FileExistsError):
        Region.create(str(tmp_path), layout, name="r0")
    with pytest.raises(ValueError, match="bytes"):
        Region.open(r.path, RegionLayout.uniform(buffers=8, pages=64, item_len=4096))
    r.unlink()
    r.unlink()  # a repeat is a no-op


def test_torch_views_share_the_memory(tmp_path):
    torch = pytest.importorskip("torch", reason="torch is optional: installed by the sglang group")
    layout = RegionLayout.uniform(buffers=1, pages=2, item_len=16, aux_rows=1, aux_row_len=4)
    with Region.create(str(tmp_path), layout) as r:
        t = r.torch_pages(0)
        assert t.dtype == torch.uint8 and tuple(t.shape) == (2, 16)
        t[1] = 3
        assert (r.pages(0)[1] == 3).all()
        r.torch_aux()[0] = 1
        assert (r.aux()[0] == 1).all()
