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

    monkeypatch.setattr(plugin, "installed_sglang_version", lambda: "0.5.22")
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
