"""Import stand-in for sgl_kernel, on the real-server suite's PYTHONPATH only.

SGLang's CPU engine imports its CPU kernels from sgl_kernel at start, but
their CPU build is not on PyPI (the `sglang-kernel` wheel there is the CUDA
build). On the tiny Llama's path (torch_native attention, no CUDA graph)
nothing calls them; if anything ever does, the call raises and says so in
the server's log, which the suite checks, so a stand-in can never quietly
stand for a kernel that ran.
"""

from __future__ import annotations

import sys

MARK = "sgl_kernel stand-in called"


class _Missing:
    def __init__(self, name: str) -> None:
        self.__name__ = name

    def __call__(self, *args: object, **kwargs: object) -> None:
        print(f"{MARK}: {self.__name__}", file=sys.stderr, flush=True)
        raise RuntimeError(f"{MARK}: {self.__name__} (no CPU build of sgl_kernel on PyPI)")


def __getattr__(name: str) -> _Missing:
    if name.startswith("__"):
        raise AttributeError(name)
    return _Missing(name)
