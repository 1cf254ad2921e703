"""vLLM's KV tensors as page buffers, the staging region, and the copies between them.

Why staging (a copy into a registered region) and not vLLM's KV cache placed
in the region file itself:
- vLLM allocates its KV tensors (torch.zeros per layer in the model
  runner); on GPU they are device memory, which no file can back. Staging
  is the same code path on CPU and CUDA: a gather of the request's blocks
  into host pages before Send, a scatter out of them after Success.
- The region then holds only the blocks in flight (staging_slots), not the
  whole pool: a few MiB instead of VLLM_CPU_KVCACHE_SPACE or the GPU pool.
- vLLM's blocks are written only by vLLM: decoded writes the staging pages,
  and the connector copies them into the request's blocks after pdlink's
  Success, never for a Failed or aborted room. A late byte of a dead room
  cannot reach a block vLLM already gave to another request.
The cost is one copy per side of the request's new blocks (measured by
python/bench/vllm_connector_staging.py; the numbers are in docs/vllm.md).

A layer's KV tensor is cut into page buffers: the dimension whose length is
the pool's block count is the page index; the dimensions before it (K/V in
the flash layouts, none in the CPU backend's [blocks, heads, block_size,
2*head] layout) make separate buffers, each one page per block of the
contiguous bytes after it. A layout where a block's bytes are not
contiguous per buffer is refused at start.

The tensor code is device-agnostic (index_select / index_copy_ between the
KV tensor and the region's torch view, .to() across devices); it is tested
on CPU only.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from pdlink.region import BufferLayout, Region, RegionLayout
from pdlink.vllm.config import UnsupportedConfig


@dataclass(frozen=True)
class PageBuffer:
    """One page buffer of the engine's KV: (num_blocks, item_len) uint8 over the tensor."""

    name: str
    pages: torch.Tensor
    # The attention layer whose KV tensor this is (vLLM's layer name).
    layer: str = ""

    @property
    def item_len(self) -> int:
        return int(self.pages.shape[1])


def _block_dim(t: torch.Tensor, num_blocks: int) -> int:
    dims = [d for d, n in enumerate(t.shape) if n == num_blocks]
    if not dims:
        raise UnsupportedConfig(
            f"a KV tensor of shape {tuple(t.shape)} has no dimension of the pool's "
            f"{num_blocks} blocks"
        )
    # Several candidates (a head count equal to the block count): the page
    # index is the outermost of them, the one with the largest stride.
    return max(dims, key=lambda d: t.stride(d))


def page_buffers(kv_caches: dict[str, torch.Tensor], num_blocks: int) -> list[PageBuffer]:
    """The page buffers of every layer, in the dict's (layer) order.

    A tensor that another layer already gave (cross-layer KV sharing) adds
    no buffer: its bytes move once.
    """
    out: list[PageBuffer] = []
    seen: set[tuple[int, tuple[int, ...], tuple[int, ...]]] = set()
    for name, t in kv_caches.items():
        key = (t.data_ptr(), tuple(t.shape), tuple(t.stride()))
        if key in seen:
            continue
        seen.add(key)
        d = _block_dim(t, num_blocks)
        try:
            flat = t.view(-1, *t.shape[d:]) if d else t.unsqueeze(0)
        except RuntimeError as err:
            raise UnsupportedConfig(
                f"layer {name}: KV tensor {tuple(t.shape)} strides {tuple(t.stride())} cannot "
                f"be cut into pages: {err}"
            ) from None
        for i in range(flat.shape[0]):
            sub = flat[i]
            if sub.shape[0] != num_blocks or not sub[0].is_contiguous():
                raise UnsupportedConfig(
                    f"layer {name}: a block's KV bytes are not contiguous (shape "
                    f"{tuple(t.shape)}, strides {tuple(t.stride())}); pdlink cannot page it"
                )
            pages = sub.flatten(1).view(torch.uint8)
            if pages.data_ptr() != sub.data_ptr() or pages.stride(1) != 1:
                raise UnsupportedConfig(f"layer {name}: KV pages are not a view of the tensor")
            if pages.stride(0) < pages.shape[1]:
                raise UnsupportedConfig(f"layer {name}: KV blocks overlap in memory")
            out.append(PageBuffer(f"{name}[{i}]" if d else name, pages, layer=name))
    if not out:
        raise UnsupportedConfig("no KV cache tensors registered")
    return out


def layer_buffers(buffers: list[PageBuffer]) -> dict[str, list[int]]:
    """Each layer's buffer indices: what save_kv_layer stages once that layer's forward ran.
    A layer that shares another's tensor has none (its bytes are the other's)."""
    out: dict[str, list[int]] = {}
    for i, b in enumerate(buffers):
        out.setdefault(b.layer, []).append(i)
    return out


def region_layout(buffers: list[PageBuffer], slots: int) -> RegionLayout:
    """slots pages per buffer, each one vLLM block of that buffer; no aux rows
    (vLLM's decode recomputes the last prompt token, so nothing rides beside
    the KV)."""
    return RegionLayout(tuple(BufferLayout(slots, b.item_len) for b in buffers))


class Staging:
    """The registered region's torch views beside the engine's page buffers."""

    def __init__(self, region: Region, buffers: list[PageBuffer]) -> None:
        self.region = region
        self.buffers = buffers
        # Rows of 8-byte words where every page allows it: torch's index_copy_
        # on CPU moves a uint8 row about 7x slower than the same row of int64
        # (3.3 ms against 0.48 ms for 32 pages of 128 KiB).
        word = torch.int64 if all(b.item_len % 8 == 0 for b in buffers) else torch.uint8
        self.views = [region.torch_pages(i).view(word) for i in range(len(buffers))]
        self._engine = [b.pages.view(word) for b in buffers]
        # Fault every page in now: first touch of a fresh mapping runs at a
        # fraction of the copy speed, and must not land on a request.
        for v in self.views:
            v.zero_()
        self.device = buffers[0].pages.device

    @classmethod
    def create(cls, region_dir: str, buffers: list[PageBuffer], slots: int) -> Staging:
        return cls(Region.create(region_dir, region_layout(buffers, slots)), buffers)

    def _indices(self, blocks: Any, slots: Any) -> tuple[torch.Tensor, torch.Tensor, int | None]:
        b = torch.as_tensor(list(blocks), dtype=torch.long)
        s = torch.as_tensor(list(slots), dtype=torch.long)
        if b.numel() != s.numel():
            raise ValueError(f"{b.numel()} blocks for {s.numel()} staging slots")
        run = None
        if s.numel() and int(s[-1] - s[0]) == s.numel() - 1 and bool((s.diff() == 1).all()):
            run = int(s[0])
        return b.to(self.device), s, run

    def stage_out(self, blocks: Any, slots: Any, buffers: Any = None) -> None:
        """Engine blocks -> staging slots (prefill, before Send), of every buffer or of
        the given buffer indices (one layer's, as its forward wrote them)."""
        b, s, run = self._indices(blocks, slots)
        if not b.numel():
            return
        chosen = range(len(self.views)) if buffers is None else buffers
        for i in chosen:
            pages, view = self._engine[i], self.views[i]
            if run is not None and pages.device == view.device:
                torch.index_select(pages, 0, b, out=view[run : run + b.numel()])
            else:
                view.index_copy_(0, s, pages.index_select(0, b).to(view.device))

    def stage_in(self, slots: Any, blocks: Any) -> None:
        """Staging slots -> engine blocks (decode, after Success)."""
        b, s, run = self._indices(blocks, slots)
        if not b.numel():
            return
        for pages, view in zip(self._engine, self.views, strict=True):
            src = view[run : run + b.numel()] if run is not None else view.index_select(0, s)
            pages.index_copy_(0, b, src.to(pages.device))

    def close(self) -> None:
        self.views = []
        self._engine = []
        self.region.close()
        self.region.unlink()
