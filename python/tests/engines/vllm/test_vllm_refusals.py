"""What PdlinkConnector refuses at start, with a clear error, never a wrong answer.

Two on real vLLM servers (pipeline parallel, a sliding-window model: each
start fails in about 25 s), the rest on the functions vLLM calls, with the
configuration objects reduced to the fields they read.
"""

from __future__ import annotations

import json
import shutil
from types import SimpleNamespace

import pytest
import torch
from harness import pdlink_config, vllm_server

from pdlink.vllm.config import Settings, UnsupportedConfig, refuse_unsupported
from pdlink.vllm.staging import Staging, page_buffers

START_FAILS_WITHIN = 300.0


def _refused_at_start(srv, needle: str) -> None:
    try:
        srv.proc.wait(START_FAILS_WITHIN)
    finally:
        srv.stop()
    assert srv.proc.returncode != 0
    log = srv.log_path.read_text(errors="replace")
    assert needle in log, srv.tail(80)


def _producer(tmp_path):
    return pdlink_config(
        "kv_producer",
        prefilld_addr=f"unix://{tmp_path}/none.sock",
        prefill_bootstrap="tcp://127.0.0.1:1",
        region_dir=str(tmp_path / "regions"),
    )


def test_pipeline_parallel_is_refused_at_start(model_dir, log_dir, tmp_path):
    srv = vllm_server(
        "refuse-pp",
        model_dir,
        log_dir,
        kv_config=_producer(tmp_path),
        extra_args=("--pipeline-parallel-size", "2"),
        # vLLM's CPU workers need a core each named on a one-NUMA-node box.
        env={"VLLM_CPU_OMP_THREADS_BIND": "0|1"},
    )
    _refused_at_start(srv, "UnsupportedConfig: PdlinkConnector does not support pipeline")


def test_a_sliding_window_model_is_refused_at_start(model_dir, log_dir, tmp_path):
    swa = tmp_path / "tiny-mistral-swa"
    shutil.copytree(model_dir, swa)
    cfg = json.loads((swa / "config.json").read_text())
    cfg.update(architectures=["MistralForCausalLM"], model_type="mistral", sliding_window=64)
    (swa / "config.json").write_text(json.dumps(cfg))
    srv = vllm_server("refuse-swa", swa, log_dir, kv_config=_producer(tmp_path))
    _refused_at_start(srv, "UnsupportedConfig: PdlinkConnector does not support sliding-window")


def _transfer(role="kv_producer", **extra):
    return SimpleNamespace(kv_role=role, kv_connector_extra_config=extra)


def test_settings_name_what_is_missing(monkeypatch):
    for env in ("PDLINK_PREFILLD_ADDR", "PDLINK_PREFILL_BOOTSTRAP", "PDLINK_REGION_DIR"):
        monkeypatch.delenv(env, raising=False)
    with pytest.raises(UnsupportedConfig, match=r"prefilld_addr .*prefill_bootstrap"):
        Settings.from_transfer_config(_transfer())
    with pytest.raises(UnsupportedConfig, match="kv_both needs prefilld_addr or decoded_addr"):
        Settings.from_transfer_config(_transfer("kv_both"))
    monkeypatch.setenv("PDLINK_DECODED_ADDR", "unix:///d.sock")
    monkeypatch.setenv("PDLINK_REGION_DIR", "/dev/shm/x")
    s = Settings.from_transfer_config(_transfer("kv_both"))
    assert (s.prefill, s.decode, s.decode_region_dir) == (False, True, "/dev/shm/x")


def _vllm_config(pp=1, dcp=1, hybrid=False, window=None):
    return SimpleNamespace(
        parallel_config=SimpleNamespace(
            pipeline_parallel_size=pp,
            decode_context_parallel_size=dcp,
            prefill_context_parallel_size=1,
            data_parallel_size=1,
        ),
        model_config=SimpleNamespace(
            is_hybrid=hybrid,
            has_inner_state=False,
            is_attention_free=False,
            get_sliding_window=lambda: window,
        ),
    )


def _kv_cache_config(*specs):
    return SimpleNamespace(kv_cache_groups=[SimpleNamespace(kv_cache_spec=s) for s in specs])


def test_configurations_the_region_cannot_carry_are_refused():
    from vllm.v1.kv_cache_interface import FullAttentionSpec, MambaSpec

    full = FullAttentionSpec.__new__(FullAttentionSpec)
    mamba = MambaSpec.__new__(MambaSpec)
    refuse_unsupported(_vllm_config(), _kv_cache_config(full))
    cases = [
        (_vllm_config(pp=2), _kv_cache_config(full), "pipeline"),
        (_vllm_config(dcp=2), _kv_cache_config(full), "context parallelism"),
        (_vllm_config(hybrid=True), _kv_cache_config(full), "hybrid / Mamba"),
        (_vllm_config(window=4096), _kv_cache_config(full), "sliding-window"),
        (_vllm_config(), _kv_cache_config(full, full), "one KV cache group, the model has 2"),
        (_vllm_config(), _kv_cache_config(mamba), "full-attention KV only, not MambaSpec"),
    ]
    for vcfg, kcfg, needle in cases:
        with pytest.raises(UnsupportedConfig, match=needle):
            refuse_unsupported(vcfg, kcfg)


def test_kv_layouts_become_page_buffers_or_are_refused():
    nb = 8
    # The CPU backend: [blocks, kv_heads, block_size, 2 * head_size] per layer.
    cpu = {"l0": torch.zeros(nb, 2, 32, 128), "l1": torch.zeros(nb, 2, 32, 128)}
    bufs = page_buffers(cpu, nb)
    assert [b.item_len for b in bufs] == [2 * 32 * 128 * 4] * 2
    # The flash layout: [2, blocks, block_size, kv_heads, head_size]: K and V apart.
    flash = {"l0": torch.zeros(2, nb, 16, 2, 64)}
    assert [b.item_len for b in page_buffers(flash, nb)] == [16 * 2 * 64 * 4] * 2
    # A layer sharing another's tensor moves once.
    shared = {"a": cpu["l0"], "b": cpu["l0"]}
    assert len(page_buffers(shared, nb)) == 1
    # Blocks not outermost inside a buffer: a block's bytes are scattered.
    scattered = {"l0": torch.zeros(32, nb, 2, 128).transpose(0, 1)}
    with pytest.raises(UnsupportedConfig, match=r"not contiguous|cannot be cut"):
        page_buffers(scattered, nb)
    with pytest.raises(UnsupportedConfig, match="no dimension"):
        page_buffers({"l0": torch.zeros(3, 5)}, nb)


def test_staging_round_trip_moves_exactly_the_named_blocks(tmp_path):
    nb = 16
    src = {"l0": torch.randn(nb, 2, 32, 64), "l1": torch.randn(nb, 2, 32, 64)}
    dst = {k: torch.zeros_like(v) for k, v in src.items()}
    out = Staging.create(str(tmp_path / "p"), page_buffers(src, nb), 8)
    into = Staging.create(str(tmp_path / "d"), page_buffers(dst, nb), 8)
    blocks_src, blocks_dst = [5, 2, 9], [1, 7, 3]
    out.stage_out(blocks_src, [0, 1, 2])  # a run of slots
    for view_in, view_out in zip(into.views, out.views, strict=True):
        view_in[[6, 3, 4]] = view_out[[0, 1, 2]]  # decoded's write, scattered slots
    into.stage_in([6, 3, 4], blocks_dst)
    for k in src:
        assert torch.equal(dst[k][blocks_dst], src[k][blocks_src])
        untouched = [b for b in range(nb) if b not in blocks_dst]
        assert not dst[k][untouched].any()
    out.close()
    into.close()
