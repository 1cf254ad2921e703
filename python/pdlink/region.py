"""KV region files: create or open one, view its pages, describe it to a daemon.

A region is one rank's KV memory as a file under a daemon's --region-dir
(on /dev/shm in production): one or more buffers of fixed-size pages (page
p of a buffer at offset + p * item_len) and optional aux rows. The engine
writes (prefill) or reads (decode) pages through the numpy views here; the
daemon maps the same file and moves the bytes.
"""

from __future__ import annotations

import contextlib
import mmap
import os
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from pdlink.v1 import common_pb2

# Buffers start on a page boundary of the host, so every view is aligned for
# any dtype an engine reinterprets it as.
_ALIGN = mmap.PAGESIZE

_ATTENTION = {
    None: common_pb2.ATTENTION_UNSPECIFIED,
    "mha": common_pb2.ATTENTION_MHA,
    "mla": common_pb2.ATTENTION_MLA,
}


@dataclass(frozen=True)
class BufferLayout:
    """One KV buffer (one layer's K or V, or one MLA layer): pages of item_len bytes.

    The head fields are optional and go together (all zero is an opaque
    buffer): item_len must then equal page_tokens * rank_heads * head_bytes.
    """

    pages: int
    item_len: int
    page_tokens: int = 0
    total_heads: int = 0
    rank_heads: int = 0
    head_bytes: int = 0

    @property
    def length(self) -> int:
        return self.pages * self.item_len


@dataclass(frozen=True)
class AuxLayout:
    """The aux rows (first token, logprobs, room echo): rows of row_len bytes."""

    rows: int
    row_len: int


def _align(n: int) -> int:
    return (n + _ALIGN - 1) // _ALIGN * _ALIGN


@dataclass(frozen=True)
class RegionLayout:
    """Where each buffer and the aux rows live in a region file.

    Offsets are computed here (each part page-aligned, in order). attention
    is None for an opaque layout, or "mha" / "mla" when every buffer sets
    its head fields.
    """

    buffers: tuple[BufferLayout, ...]
    aux: AuxLayout | None = None
    attention: str | None = None
    offsets: tuple[int, ...] = field(init=False)
    aux_offset: int = field(init=False)
    size: int = field(init=False)

    def __post_init__(self) -> None:
        if not self.buffers:
            raise ValueError("a region layout needs at least one buffer")
        if self.attention not in _ATTENTION:
            raise ValueError(f"attention {self.attention!r}: want None, 'mha' or 'mla'")
        object.__setattr__(self, "buffers", tuple(self.buffers))
        offsets, off = [], 0
        for i, b in enumerate(self.buffers):
            if b.pages < 1 or b.item_len < 1:
                raise ValueError(f"buffer {i}: pages {b.pages} item_len {b.item_len}")
            offsets.append(off)
            off = _align(off + b.length)
        aux_offset = off
        if self.aux is not None:
            if self.aux.rows < 1 or self.aux.row_len < 1:
                raise ValueError(f"aux: rows {self.aux.rows} row_len {self.aux.row_len}")
            off = _align(off + self.aux.rows * self.aux.row_len)
        object.__setattr__(self, "offsets", tuple(offsets))
        object.__setattr__(self, "aux_offset", aux_offset)
        object.__setattr__(self, "size", max(off, _ALIGN))

    @classmethod
    def uniform(
        cls, buffers: int, pages: int, item_len: int, aux_rows: int = 0, aux_row_len: int = 0
    ) -> RegionLayout:
        """buffers buffers of the same pages and item_len, and aux rows if aux_rows > 0."""
        aux = AuxLayout(aux_rows, aux_row_len) if aux_rows else None
        return cls(tuple(BufferLayout(pages, item_len) for _ in range(buffers)), aux)

    def to_proto(self, rank: tuple[int, int] = (0, 1)) -> common_pb2.RegionLayout:
        """The RegionLayout message of RegisterRegion for rank (tp_rank, tp_size)."""
        tp_rank, tp_size = rank
        msg = common_pb2.RegionLayout(
            rank=common_pb2.Rank(tp_rank=tp_rank, tp_size=tp_size),
            attention=_ATTENTION[self.attention],
        )
        for b, off in zip(self.buffers, self.offsets, strict=True):
            msg.buffers.add(
                offset=off,
                length=b.length,
                item_len=b.item_len,
                page_tokens=b.page_tokens,
                total_heads=b.total_heads,
                rank_heads=b.rank_heads,
                head_bytes=b.head_bytes,
            )
        if self.aux is not None:
            msg.aux.offset = self.aux_offset
            msg.aux.row_len = self.aux.row_len
            msg.aux.rows = self.aux.rows
        return msg


class Region:
    """A mapped region file: numpy views of its buffers' pages and aux rows.

    Create one with Region.create (a new file under a region dir) or
    Region.open (an existing file, e.g. after an engine restart). close()
    ends the region's own use of the mapping; a view still alive keeps the
    memory mapped until it is dropped, so a view never points at unmapped
    memory.
    """

    def __init__(self, path: str, layout: RegionLayout, mm: mmap.mmap) -> None:
        self.path = path
        self.layout = layout
        self._mm: mmap.mmap | None = mm
        self._whole = np.frombuffer(mm, dtype=np.uint8)

    @classmethod
    def create(cls, region_dir: str, layout: RegionLayout, name: str | None = None) -> Region:
        """A new zero-filled file for layout under region_dir (name, or a unique one)."""
        os.makedirs(region_dir, exist_ok=True)
        if name is None:
            name = f"pdlink-region-{os.getpid()}-{os.urandom(6).hex()}"
        if os.sep in name:
            raise ValueError(f"region name {name!r} must not contain {os.sep!r}")
        path = os.path.join(region_dir, name)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o660)
        try:
            os.ftruncate(fd, layout.size)
            mm = mmap.mmap(fd, layout.size)
        except BaseException:
            os.close(fd)
            os.unlink(path)
            raise
        os.close(fd)
        return cls(path, layout, mm)

    @classmethod
    def open(cls, path: str, layout: RegionLayout) -> Region:
        """An existing file that holds layout."""
        fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
        try:
            size = os.fstat(fd).st_size
            if size < layout.size:
                raise ValueError(f"{path}: {size} bytes, the layout needs {layout.size}")
            mm = mmap.mmap(fd, layout.size)
        finally:
            os.close(fd)
        return cls(path, layout, mm)

    def _mapped(self) -> np.ndarray:
        if self._mm is None:
            raise ValueError(f"region {self.path} is closed")
        return self._whole

    def pages(self, buffer: int) -> np.ndarray:
        """Buffer's pages as a (pages, item_len) uint8 array over the file."""
        b = self.layout.buffers[buffer]
        off = self.layout.offsets[buffer]
        return self._mapped()[off : off + b.length].reshape(b.pages, b.item_len)

    def aux(self) -> np.ndarray:
        """The aux rows as a (rows, row_len) uint8 array over the file."""
        a = self.layout.aux
        if a is None:
            raise ValueError("the layout has no aux rows")
        off = self.layout.aux_offset
        return self._mapped()[off : off + a.rows * a.row_len].reshape(a.rows, a.row_len)

    def torch_pages(self, buffer: int) -> Any:
        """pages(buffer) as a torch uint8 tensor sharing the memory (needs torch)."""
        import torch  # optional: only for engines that have it

        return torch.from_numpy(self.pages(buffer))

    def torch_aux(self) -> Any:
        """aux() as a torch uint8 tensor sharing the memory (needs torch)."""
        import torch

        return torch.from_numpy(self.aux())

    def identity(self) -> tuple[int, int]:
        """(st_dev, st_ino) of the file at path: what RegisterRegion answers for it."""
        st = os.stat(self.path)
        return st.st_dev, st.st_ino

    def close(self) -> None:
        """Unmap the file (it stays on disk: unlink() removes it)."""
        if self._mm is None:
            return
        self._whole = np.empty(0, dtype=np.uint8)
        mm, self._mm = self._mm, None
        # A caller's view still alive keeps the mapping until the last one goes.
        with contextlib.suppress(BufferError):
            mm.close()

    def unlink(self) -> None:
        """Remove the file (after UnregisterRegion, as an engine that shuts down cleanly does)."""
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)

    def __enter__(self) -> Region:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
