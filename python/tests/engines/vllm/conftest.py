"""Fixtures of the vLLM real-engine suite: the tiny model, the oracle, daemons, servers.

Every server start costs about a minute here, so servers are started once
per module (the oracle once per session, then stopped) and shared by its
tests; a test that kills one restarts it before it ends.
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
    import vllm  # noqa: F401
except ImportError:
    if os.environ.get("CI") == "true":
        raise
    pytest.skip("vLLM is not installed in this interpreter (.venv-vllm)", allow_module_level=True)

import tiny_llama
from daemons import Pair
from harness import complete, pdlink_config, text_of, vllm_server
from servers import Server

# Daemon bounds short enough that a fault ends within a test's patience on
# this machine, long enough for a loaded 2-core box's normal transfers.
DAEMON_BOUNDS = (
    "--bootstrap-timeout=8s",
    "--waiting-timeout=8s",
    "--transfer-idle-timeout=5s",
)

MAX_TOKENS = 16


@dataclass(frozen=True)
class Prompt:
    name: str
    ids: tuple[int, ...]

    @property
    def text(self) -> str:
        return tiny_llama.prompt_text(list(self.ids))


def _prompts() -> list[Prompt]:
    p = tiny_llama.prompt_ids
    long70 = p(70, 5)
    return [
        Prompt("len5", tuple(p(5, 1))),
        Prompt("len31", tuple(p(31, 2))),
        Prompt("len32", tuple(p(32, 3))),
        Prompt("len33", tuple(p(33, 4))),
        Prompt("len70", tuple(long70)),
        # Shares len70's first two blocks: decode's prefix cache holds them.
        Prompt("len100_shares_len70", tuple(long70[:64] + p(36, 6))),
        Prompt("len200", tuple(p(200, 7))),
        # max_model_len's edge: 1000 prompt + 16 generated of 1024.
        Prompt("len1000", tuple(p(1000, 8))),
    ]


PROMPTS = _prompts()


def _spares() -> dict[str, Prompt]:
    """Prompts no other test sent, one per test that needs decode's cache cold for it."""
    p = tiny_llama.prompt_ids
    base96 = p(96, 30)
    out = {f"fresh{i}": Prompt(f"fresh{i}", tuple(p(100, 100 + i))) for i in range(12)}
    out["prefix_base"] = Prompt("prefix_base", tuple(base96))
    # Shares prefix_base's first two blocks (64 tokens), then differs: 4 blocks.
    out["prefix_child"] = Prompt("prefix_child", tuple(base96[:64] + p(40, 31)))
    return out


SPARES = _spares()


@pytest.fixture(scope="session")
def model_dir(tmp_path_factory) -> Path:
    return tiny_llama.write(tmp_path_factory.mktemp("tiny-llama"))


@pytest.fixture(scope="session")
def log_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("vllm-logs")


@pytest.fixture(scope="session")
def oracle(model_dir, log_dir) -> dict[str, str]:
    """Greedy text of every prompt from one colocated server (stopped afterwards)."""
    srv = vllm_server("oracle", model_dir, log_dir)
    try:
        srv.wait_ready()
        every = [*PROMPTS, *SPARES.values()]
        return {pr.name: text_of(complete(srv, pr.text, MAX_TOKENS)) for pr in every}
    finally:
        srv.stop()


@dataclass
class Stack:
    pair: Pair
    prefill: Server
    decode: Server
    fault_file: Path
    tmp: Path

    def restart_decode(self) -> None:
        self.decode.kill()
        self.decode = start_decode(self.pair, self.decode_model, self.log_dir, self.fault_file)

    decode_model: Path = Path()
    log_dir: Path = Path()


def start_prefill(pair: Pair, model_dir: Path, log_dir: Path, name: str = "prefill") -> Server:
    cfg = pdlink_config(
        "kv_producer",
        prefilld_addr=pair.prefill.address,
        prefill_bootstrap=pair.prefill.bootstrap,
        region_dir=str(pair.prefill.region_dir),
        daemon_lost_timeout=3,
    )
    srv = vllm_server(name, model_dir, log_dir, kv_config=cfg)
    return srv


def start_decode(pair: Pair, model_dir: Path, log_dir: Path, fault_file: Path, name="decode"):
    cfg = pdlink_config(
        "kv_consumer",
        decoded_addr=pair.decode.address,
        region_dir=str(pair.decode.region_dir),
        daemon_lost_timeout=3,
        test_fault_file=str(fault_file),
    )
    cfg["kv_connector"] = "PdlinkTestConnector"
    cfg["kv_connector_module_path"] = "vllm_test_hooks"
    return vllm_server(name, model_dir, log_dir, kv_config=cfg)


@pytest.fixture(scope="module")
def stack(model_dir, log_dir, oracle, tmp_path_factory, request) -> Iterator[Stack]:
    tmp = tmp_path_factory.mktemp("stack")
    pair = Pair(tmp, DAEMON_BOUNDS, DAEMON_BOUNDS)
    fault = tmp / "fault"
    name = request.module.__name__.rsplit(".", 1)[-1]
    pre = start_prefill(pair, model_dir, log_dir, f"{name}-prefill")
    dec = start_decode(pair, model_dir, log_dir, fault, f"{name}-decode")
    st = Stack(pair, pre, dec, fault, tmp, decode_model=model_dir, log_dir=log_dir)
    try:
        pre.wait_ready()
        st.decode.wait_ready()
        yield st
    finally:
        for srv in (st.prefill, st.decode):
            if srv.alive():
                srv.stop()
        pair.kill()
        for srv in (st.prefill, st.decode):
            print(f"--- {srv.name} log tail\n{srv.tail(40)}")
        print(pair.logs())
