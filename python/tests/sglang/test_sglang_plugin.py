"""The plugin through SGLang's own loader: the option parses and resolves, the gates fire."""

from __future__ import annotations

import pytest
from sglang_harness import require_sglang

require_sglang()

from sglang.srt.disaggregation.base.conn import StateType  # noqa: E402
from sglang.srt.plugins import load_plugins  # noqa: E402
from sglang.srt.server_args import prepare_server_args  # noqa: E402

from pdlink.sglang import TESTED_SGLANG_VERSION, checks, conn, plugin  # noqa: E402

load_plugins()


def _args(*extra: str):
    return prepare_server_args(
        ["--model-path", "dummy", "--disaggregation-transfer-backend", "pdlink", *extra]
    )


def test_backend_option_resolves_to_pdlink_classes_through_the_plugin():
    # Loaded by SGLang's load_plugins() from the installed entry point, not
    # by calling register() here.
    from sglang.srt.disaggregation import decode, prefill, utils

    sa = _args("--disaggregation-mode", "prefill")
    assert sa.disaggregation_transfer_backend == "pdlink"
    backend = utils.TransferBackend(sa.disaggregation_transfer_backend)
    assert backend.name == "PDLINK"
    want = {
        utils.KVClassType.MANAGER: conn.PdlinkKVManager,
        utils.KVClassType.SENDER: conn.PdlinkKVSender,
        utils.KVClassType.RECEIVER: conn.PdlinkKVReceiver,
        utils.KVClassType.BOOTSTRAP_SERVER: conn.PdlinkKVBootstrapServer,
    }
    # The bindings the prefill and decode schedulers call, too (the
    # registry rewrites their `from utils import get_kv_class`).
    for get_kv_class in (utils.get_kv_class, prefill.get_kv_class, decode.get_kv_class):
        for class_type, cls in want.items():
            assert get_kv_class(backend, class_type) is cls
    # Other backends are untouched: warmup requests still get SGLang's fake.
    from sglang.srt.disaggregation.fake.conn import FakeKVSender

    fake = utils.TransferBackend("fake")
    assert utils.get_kv_class(fake, utils.KVClassType.SENDER) is FakeKVSender


def test_unknown_backend_still_refused_by_argparse():
    with pytest.raises(SystemExit):
        prepare_server_args(
            ["--model-path", "dummy", "--disaggregation-transfer-backend", "pdlinq"]
        )


def test_version_gate_refuses_other_sglang_naming_the_tested_one(monkeypatch):
    from sglang.srt.disaggregation import utils

    monkeypatch.setattr(checks, "installed_sglang_version", lambda: "0.5.22")
    backend = utils.TransferBackend("pdlink")
    with pytest.raises(checks.UnsupportedSGLang) as err:
        utils.get_kv_class(backend, utils.KVClassType.MANAGER)
    msg = str(err.value)
    assert f"sglang=={TESTED_SGLANG_VERSION}" in msg and "0.5.22" in msg
    # The tested version passes.
    checks.check_version(TESTED_SGLANG_VERSION)


@pytest.mark.parametrize(
    ("argv", "option"),
    [
        (["--pp-size", "2"], "--pp-size"),
        (["--attn-cp-size", "2"], "--attn-cp-size"),
        (["--dcp-size", "2"], "--dcp-size"),
        (["--attn-dp-size", "2"], "--attn-dp-size"),
        (
            ["--disaggregation-decode-allocation-policy", "prefill_complete"],
            "--disaggregation-decode-allocation-policy",
        ),
    ],
)
def test_refuses_at_start_what_v1_does_not_carry_naming_the_option(argv, option):
    sa = _args(*argv)
    with pytest.raises(checks.UnsupportedConfig, match=option):
        checks.check_server_args(sa)


def test_plain_tp1_server_args_pass_the_checks():
    checks.check_server_args(_args("--disaggregation-mode", "prefill"))
    checks.check_server_args(_args("--disaggregation-mode", "decode"))


def test_decode_radix_cache_and_tp_pass_the_checks():
    # decode_prefix_len goes to decoded as SendMetadata's prefix_len, and
    # ranks as each scheduler's rank: neither is refused any more.
    checks.check_server_args(
        _args("--disaggregation-mode", "decode", "--disaggregation-decode-enable-radix-cache")
    )
    checks.check_server_args(_args("--disaggregation-mode", "prefill", "--tp-size", "2"))


def test_check_server_args_hook_refuses_through_sglang():
    # SGLang's Engine calls ServerArgs.check_server_args at start; the
    # plugin's AFTER hook refuses there.
    sa = _args("--pp-size", "2")
    with pytest.raises(checks.UnsupportedConfig, match="--pp-size"):
        plugin._check_server_args(None, sa)
    from sglang.srt.server_args import ServerArgs

    assert getattr(ServerArgs.check_server_args, "__wrapped__", None) is not None


@pytest.mark.parametrize("state", [StateType.MAMBA, StateType.SWA, StateType.DSA])
def test_refuses_models_with_state_components(state):
    from types import SimpleNamespace

    with pytest.raises(checks.UnsupportedConfig, match=state.value):
        checks.check_kv_args(SimpleNamespace(state_types=[state]))


def _kv_args(item_len: int, **heads):
    from types import SimpleNamespace

    return SimpleNamespace(
        kv_item_lens=[item_len, item_len],
        aux_item_lens=[64, 8],
        aux_data_lens=[64 * 16, 8 * 16],
        page_size=4,
        **heads,
    )


def test_region_layout_carries_the_heads_the_daemons_map_tp_sizes_with():
    from pdlink.sglang.conn import region_layout

    # MHA prefill: SGLang's kv_head_num and total_kv_head_num (8 heads over TP 2).
    mha = region_layout(_kv_args(4 * 4 * 32, kv_head_num=4, total_kv_head_num=8), 10, False, 2)
    assert mha.attention == "mha"
    assert {(b.page_tokens, b.total_heads, b.rank_heads, b.head_bytes) for b in mha.buffers} == {
        (4, 8, 4, 32)
    }
    assert mha.aux.rows == 16 and mha.aux.row_len == 72
    # MHA decode: no heads in KVArgs; PDLINK_TOTAL_KV_HEADS split over its TP 4.
    dec = region_layout(_kv_args(4 * 2 * 32), 10, False, 4, total_heads=8)
    assert (dec.attention, dec.buffers[0].rank_heads, dec.buffers[0].head_bytes) == ("mha", 2, 32)
    # MLA: one latent head, whole on every rank.
    mla = region_layout(_kv_args(4 * 576), 10, True, 4)
    assert (mla.attention, mla.buffers[0].total_heads, mla.buffers[0].head_bytes) == ("mla", 1, 576)
    # Heads unknown, or not dividing the page: opaque (equal TP only).
    assert region_layout(_kv_args(4 * 2 * 32), 10, False, 4).attention is None
    assert (
        region_layout(_kv_args(100, kv_head_num=3, total_kv_head_num=6), 10, False, 2).attention
        is None
    )


def test_the_backend_imports_without_the_plugin():
    """conn.py took the version helper from plugin.py, whose get_kv_class hook
    imports conn: a circle that worked only by import order. The helper is in
    checks.py; the backend imports without the plugin module."""
    import subprocess
    import sys

    out = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys, pdlink.sglang.conn; print('pdlink.sglang.plugin' in sys.modules)",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    assert out.stdout.strip().splitlines()[-1] == "False", out.stderr[-2000:]
