"""Host staging: the registered region's page slots, lent to rooms.

The engine's KV pool (GPU memory in production) is not the region the
daemons map: each room borrows slots of the region for its pages, filled
from the pool before Send (prefill) or copied into the pool after Success
(decode), and returns them at clear. The region may be much smaller than
the pool; a room that finds too few free slots fails instead of waiting.
"""

from __future__ import annotations

import ctypes
import threading
from collections.abc import Sequence

import numpy as np


class StagingFull(RuntimeError):
    """Fewer free staging slots than a room's pages."""


class SlotPool:
    """Free staging slots, taken and returned per room (thread-safe)."""

    def __init__(self, slots: int) -> None:
        self._free = list(range(slots - 1, -1, -1))
        self._held: dict[int, np.ndarray] = {}
        self._lock = threading.Lock()
        self.slots = slots

    def take(self, room: int, count: int) -> np.ndarray:
        with self._lock:
            if room in self._held:
                raise ValueError(f"room {room} already holds staging slots")
            if count > len(self._free):
                raise StagingFull(
                    f"room {room} needs {count} staging slots, {len(self._free)} of "
                    f"{self.slots} free (raise PDLINK_STAGING_SLOTS)"
                )
            got = np.array([self._free.pop() for _ in range(count)], dtype=np.int64)
            self._held[room] = got
            return got

    def held(self, room: int) -> np.ndarray | None:
        with self._lock:
            return self._held.get(room)

    def give_back(self, room: int) -> None:
        with self._lock:
            got = self._held.pop(room, None)
            if got is not None:
                self._free.extend(int(s) for s in got[::-1])

    @property
    def free(self) -> int:
        with self._lock:
            return len(self._free)


def _memcpy_host(dst: int, src: int, n: int) -> None:
    ctypes.memmove(dst, src, n)


def _memcpy_device(dst: int, src: int, n: int) -> None:
    # cudaMemcpyDefault (4): the direction follows from unified addressing,
    # so one call serves device-to-host and host-to-device.
    import torch

    err = torch.cuda.cudart().cudaMemcpy(dst, src, n, 4)
    if err not in (0, None) and int(getattr(err, "value", err)) != 0:
        raise RuntimeError(f"cudaMemcpy of {n} bytes failed: {err}")


def copier(on_device: bool):
    """The copy for a pool in device memory (on_device) or host memory."""
    return _memcpy_device if on_device else _memcpy_host


# From this many pages the runs are found with numpy: its fixed cost (about
# 15 us) beats the Python loop's (0.2 us a page) from some 64 pages on, and a
# prefill chunk of 8192 one-token pages took the loop 1.7 ms (numpy: 17 us).
_VECTOR_RUNS_FROM = 64


def _runs(src: Sequence[int], dst: Sequence[int]) -> list[tuple[int, int, int]]:
    """(src, dst, count) runs where both page sequences go up by one."""
    if len(src) != len(dst):
        raise ValueError(f"{len(src)} source pages for {len(dst)} destination pages")
    if len(src) >= _VECTOR_RUNS_FROM:
        return _runs_vector(src, dst)
    out: list[tuple[int, int, int]] = []
    for s, d in zip(src, dst, strict=True):
        s, d = int(s), int(d)
        if out and out[-1][0] + out[-1][2] == s and out[-1][1] + out[-1][2] == d:
            a, b, c = out[-1]
            out[-1] = (a, b, c + 1)
        else:
            out.append((s, d, 1))
    return out


def _runs_vector(src: Sequence[int], dst: Sequence[int]) -> list[tuple[int, int, int]]:
    s = np.asarray(src, dtype=np.int64)
    d = np.asarray(dst, dtype=np.int64)
    starts = np.flatnonzero((np.diff(s) != 1) | (np.diff(d) != 1)) + 1
    starts = np.concatenate(([0], starts))
    counts = np.diff(np.append(starts, s.size))
    return list(zip(s[starts].tolist(), d[starts].tolist(), counts.tolist(), strict=True))


def copy_pages(
    copy,
    src_bases: Sequence[int],
    dst_bases: Sequence[int],
    item_lens: Sequence[int],
    src_pages: Sequence[int],
    dst_pages: Sequence[int],
) -> None:
    """Copy page src_pages[i] of every buffer to page dst_pages[i] of the same buffer."""
    runs = _runs(src_pages, dst_pages)
    for sb, db, item in zip(src_bases, dst_bases, item_lens, strict=True):
        for s, d, c in runs:
            copy(db + d * item, sb + s * item, c * item)
