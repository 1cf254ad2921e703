"""Fixtures of the SGLang real-server suite: the tiny model, the oracle, daemons, servers.

A server start costs 30-60 s here, so the oracle runs once per session
(then stops) and each module starts its prefill and decode servers once.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/engines

try:
    import fastapi  # noqa: F401
    import sglang.launch_server  # noqa: F401
    import uvicorn  # noqa: F401
except ImportError as err:
    if os.environ.get("CI") == "true":
        raise
    pytest.skip(
        f"SGLang's server is not installed ({err}): scripts/pyenv.sh test sglang",
        allow_module_level=True,
    )

import tiny_llama
from daemons import Pair
from harness import colocated, decode_server, generate, prefill_server
from servers import Server

MAX_NEW = 16
# Bounds short enough that a fault ends within a test's patience, long
# enough for a loaded 2-core machine's normal transfers.
DAEMON_BOUNDS = ("--bootstrap-timeout=8s", "--waiting-timeout=8s", "--transfer-idle-timeout=5s")


def _prompts() -> dict[str, list[int]]:
    p = tiny_llama.prompt_ids
    base96 = p(96, 30)
    return {
        "len5": p(5, 1),
        "len16_one_page": p(16, 2),
        "len17": p(17, 3),
        "len40": p(40, 4),
        "len100": p(100, 5),
        # Prefilled in 5 chunks (the prefill server's --chunked-prefill-size 64).
        "len300_chunked": p(300, 6),
        "len1000": p(1000, 7),
        "prefix_base": base96,
        # Shares prefix_base's first 4 pages (64 tokens), then differs.
        "prefix_child": base96[:64] + p(40, 31),
        **{f"fresh{i}": p(60 + i, 100 + i) for i in range(8)},
    }


PROMPTS = _prompts()


@pytest.fixture(scope="session")
def model_dir(tmp_path_factory) -> Path:
    return tiny_llama.write(tmp_path_factory.mktemp("tiny-llama"))


@pytest.fixture(scope="session")
def log_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("sglang-logs")


@pytest.fixture(scope="session")
def oracle(model_dir, log_dir) -> dict[str, list[int]]:
    """Greedy output ids of every prompt from one colocated server (stopped afterwards)."""
    srv = colocated("oracle", model_dir, log_dir)
    try:
        srv.wait_ready()
        return {name: generate(srv, ids, MAX_NEW)["output_ids"] for name, ids in PROMPTS.items()}
    finally:
        srv.stop()


@dataclass
class Stack:
    pair: Pair
    prefill: Server
    decode: Server
    model_dir: Path
    log_dir: Path
    decode_extra: tuple[str, ...]

    def restart_decode(self) -> None:
        if self.decode.alive():
            self.decode.kill()
        self.decode = decode_server(
            self.decode.name + "+",
            self.model_dir,
            self.log_dir,
            self.pair.decode,
            extra=self.decode_extra,
        )
        self.decode.wait_ready()


def make_stack(tmp, model_dir, log_dir, name: str, decode_extra: tuple[str, ...]) -> Stack:
    pair = Pair(tmp, DAEMON_BOUNDS, DAEMON_BOUNDS)
    pre = prefill_server(
        f"{name}-prefill", model_dir, log_dir, pair.prefill, extra=("--chunked-prefill-size", "64")
    )
    dec = decode_server(f"{name}-decode", model_dir, log_dir, pair.decode, extra=decode_extra)
    return Stack(pair, pre, dec, model_dir, log_dir, decode_extra)


def close_stack(st: Stack) -> None:
    for srv in (st.prefill, st.decode):
        if srv.alive():
            srv.stop()
    st.pair.kill()
    for srv in (st.prefill, st.decode):
        print(f"--- {srv.name} log tail\n{srv.tail(40)}")
    print(st.pair.logs())


@pytest.fixture(scope="module")
def stack(request, model_dir, log_dir, oracle, tmp_path_factory) -> Iterator[Stack]:
    """Prefill + decode servers beside their daemons; the module picks decode's flags
    with a module-level DECODE_EXTRA."""
    extra = tuple(getattr(request.module, "DECODE_EXTRA", ()))
    name = request.module.__name__.rsplit(".", 1)[-1].removeprefix("test_")
    st = make_stack(tmp_path_factory.mktemp("stack"), model_dir, log_dir, name, extra)
    try:
        st.prefill.wait_ready()
        st.decode.wait_ready()
        yield st
    finally:
        close_stack(st)
