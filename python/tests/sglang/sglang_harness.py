"""SGLang's real disaggregation classes, wired as its schedulers wire them, on real daemons.

Not an imitation of SGLang: the classes come from get_kv_class after
SGLang's own load_plugins() found pdlink's entry point, the process's
config is SGLang's RuntimeContext (override_server_args, as SGLang's unit
tests do), and the bootstrap server is SGLang's, on loopback.
"""

from __future__ import annotations

import os
import socket
import time
from contextlib import contextmanager
from dataclasses import dataclass

import pytest


def require_sglang() -> None:
    """Skip (printing why) when SGLang is absent; under CI=true fail instead."""
    try:
        import sglang.srt.disaggregation.common.conn  # noqa: F401
    except ImportError as err:
        msg = f"SGLang is not installed ({err}); install it with scripts/pyenv.sh sglang"
        if os.environ.get("CI") == "true":
            pytest.fail(msg + " (CI=true: make test installs the sglang group)", pytrace=False)
        pytest.skip(msg, allow_module_level=True)


# Bound on any wait for a room's state (a loaded 2-core machine).
WAIT = 30.0


def kv_class(class_type):
    """SGLang's class of class_type for the pdlink backend (get_kv_class)."""
    from sglang.srt.disaggregation.utils import TransferBackend, get_kv_class

    return get_kv_class(TransferBackend("pdlink"), class_type)


def wait_poll(obj, want: set[int], what: str) -> int:
    """Poll as a scheduler tick does until the state is in want (bounded)."""
    from sglang.srt.disaggregation.base.conn import KVPoll

    end = time.monotonic() + WAIT
    while True:
        state = obj.poll()
        if state in want:
            return state
        assert state != KVPoll.Failed, f"{what}: Failed unexpectedly"
        if time.monotonic() > end:
            raise AssertionError(f"{what}: still {state} after {WAIT}s")
        # SGLang's schedulers poll: poll() is the only way they learn a state,
        # so the wait is a scheduler's tick, not a stand-in for an event.
        time.sleep(0.002)


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def install_config(monkeypatch, staging_slots: int):
    """This process's SGLang config as a pdlink server's, on loopback, and the
    backend's environment; returns (the override to restore, its ServerArgs,
    the bootstrap port)."""
    from sglang.srt.runtime_context import get_context

    monkeypatch.setenv("SGLANG_HOST_IP", "127.0.0.1")
    monkeypatch.setenv("PDLINK_STAGING_SLOTS", str(staging_slots))
    monkeypatch.setenv("PDLINK_DAEMON_LOST_TIMEOUT", "1")
    port = free_port()
    override = get_context().override_server_args(
        host="127.0.0.1",
        disaggregation_bootstrap_port=port,
        disaggregation_transfer_backend="pdlink",
    )
    return override, override.install(), port


@dataclass
class Pool:
    """A KV pool and metadata buffers as torch CPU tensors, as SGLang's pools hand them over."""

    kv: list  # one uint8 tensor (pages, item_len) per layer-buffer (K layers, then V)
    aux: list  # one tensor (rows, ...) per metadata buffer

    @classmethod
    def make(cls, buffers: int, pages: int, item_len: int, aux_rows: int):
        import torch

        kv = [torch.zeros((pages, item_len), dtype=torch.uint8) for _ in range(buffers)]
        # Two metadata buffers of different row sizes: the output ids and the
        # bootstrap-room echo, like MetadataBuffers' first token and room.
        aux = [
            torch.zeros((aux_rows, 16), dtype=torch.int32),
            torch.zeros((aux_rows, 8), dtype=torch.int64),
        ]
        return cls(kv, aux)

    def kv_args(
        self,
        kv_args_cls,
        page_size: int,
        engine_rank: int = 0,
        kv_head_num: int = 1,
        total_kv_head_num: int = 1,
    ):
        a = kv_args_cls()
        a.engine_rank = engine_rank
        a.kv_data_ptrs = [t.data_ptr() for t in self.kv]
        a.kv_data_lens = [t.numel() * t.element_size() for t in self.kv]
        a.kv_item_lens = [t[0].numel() * t.element_size() for t in self.kv]
        a.kv_layer_ids = list(range(len(self.kv)))
        a.kv_cache_dtype_str = "bfloat16"
        a.aux_data_ptrs = [t.data_ptr() for t in self.aux]
        a.aux_data_lens = [t.numel() * t.element_size() for t in self.aux]
        a.aux_item_lens = [t[0].numel() * t.element_size() for t in self.aux]
        a.state_types = []
        a.state_data_ptrs = []
        a.state_data_lens = []
        a.state_item_lens = []
        a.state_layer_ids = []
        a.state_dim_per_tensor = []
        a.state_slice_outer_counts = []
        a.state_conv_shard_groups = []
        a.is_hybrid_mla_backend = False
        a.swa_kv_cache_layout = None
        a.ib_device = None
        a.gpu_id = 0
        a.kv_head_num = kv_head_num
        a.total_kv_head_num = total_kv_head_num
        a.page_size = page_size
        a.system_dp_rank = 0
        a.rust_http_port = None
        a.pp_rank = 0
        a.prefill_start_layer = 0
        a.prefill_end_layer = None
        a.mla_compression_ratios = None
        return a


@contextmanager
def sglang_process(bootstrap_port: int, attn_tp_group=None, **server_args):
    """This process configured as one single-GPU SGLang server with the pdlink
    backend: SGLang's RuntimeContext (override_server_args, as SGLang's unit
    tests do) and the process's ranks as a scheduler has them once its
    groups are built. Yields the installed ServerArgs; restores on exit."""
    from sglang.srt.runtime_context import get_context, get_parallel

    override = get_context().override_server_args(
        host="127.0.0.1",
        disaggregation_bootstrap_port=bootstrap_port,
        disaggregation_transfer_backend="pdlink",
        **server_args,
    )
    installed = override.install()
    ranks = dict(
        pp_group=0,
        attn_dcp_rank=0,
        attn_tp_rank=0,
        attn_cp_rank=0,
        attn_dp_rank=0,
    )
    if attn_tp_group is not None:
        ranks.update(tp_rank=0, pp_rank=0, dp_rank=None, attn_tp_group=attn_tp_group)
    try:
        with get_parallel().override(**ranks):
            yield installed
    finally:
        override.restore()
