"""What pdlink v1 does not carry, refused at start with the option named.

Pure: reads a ServerArgs-like record and a KVArgs-like record, imports
nothing from SGLang, so the refusals are testable on their own.
"""

from __future__ import annotations

from importlib import metadata
from typing import Any

from pdlink.sglang import BACKEND_NAME, TESTED_SGLANG_VERSION


class UnsupportedSGLang(RuntimeError):
    """The installed SGLang is not the release the backend is tested against."""


class UnsupportedConfig(ValueError):
    """An SGLang option pdlink v1 cannot carry; the message names the option."""


def installed_sglang_version() -> str:
    """The installed SGLang's version, from its package metadata (no import of it)."""
    return metadata.version("sglang")


def check_version(installed: str) -> None:
    """Raise UnsupportedSGLang unless installed is the tested release."""
    if installed != TESTED_SGLANG_VERSION:
        raise UnsupportedSGLang(
            f"--disaggregation-transfer-backend {BACKEND_NAME} is tested with sglang=="
            f"{TESTED_SGLANG_VERSION} only; this is sglang {installed}. Install "
            f"sglang=={TESTED_SGLANG_VERSION} (pip install 'pdlink[sglang]') or pick "
            "another transfer backend."
        )


def _get(args: Any, name: str, default: Any) -> Any:
    value = getattr(args, name, default)
    return default if value is None else value


# (option, field, the value pdlink v1 carries, why): each row refuses a
# server whose field differs from that value.
_SCALAR_LIMITS = (
    ("--pp-size", "pp_size", 1, "pipeline parallelism: a room has no PP stage"),
    (
        "--attn-cp-size",
        "attn_cp_size",
        1,
        "attention context parallelism: a room's pages come from one rank",
    ),
    ("--dcp-size", "dcp_size", 1, "decode context parallelism: no token-granular relayout"),
    ("--attn-dp-size", "attn_dp_size", 1, "DP attention: a Rank has no DP rank"),
    (
        "--enable-dp-attention",
        "enable_dp_attention",
        False,
        "DP attention: a Rank has no DP rank",
    ),
    (
        "--disaggregation-decode-allocation-policy",
        "disaggregation_decode_allocation_policy",
        "early",
        "prefill_complete allocation: pdlink's rooms bootstrap when decode allocates",
    ),
    (
        "--enable-pd-role-switch",
        "enable_pd_role_switch",
        False,
        "role switch: the backend has no teardown",
    ),
    (
        "--disaggregation-decode-host-receive-threshold",
        "disaggregation_decode_host_receive_threshold",
        1.0,
        "host receive: the backend writes device pages only",
    ),
)


def check_server_args(args: Any) -> None:
    """Raise UnsupportedConfig for the first option pdlink v1 cannot carry."""
    if _get(args, "disaggregation_transfer_backend", "") != BACKEND_NAME:
        return
    for option, field, carried, why in _SCALAR_LIMITS:
        value = _get(args, field, carried)
        if value != carried:
            raise UnsupportedConfig(
                f"{option}={value} is not supported by --disaggregation-transfer-backend "
                f"{BACKEND_NAME} (v1 carries only {option}={carried}): {why}"
            )
    dp_size = _get(args, "dp_size", 1)
    if dp_size > 1 and _get(args, "enable_dp_attention", False):
        raise UnsupportedConfig(
            f"--dp-size={dp_size} with DP attention is not supported by "
            f"--disaggregation-transfer-backend {BACKEND_NAME}: a Rank has no DP rank"
        )


def check_kv_args(kv_args: Any) -> None:
    """Raise UnsupportedConfig when the model needs state beyond KV pages.

    Mamba, SWA, DSA and the other state components live in pools of their
    own index spaces, which a pdlink region does not describe yet.
    """
    state_types = list(getattr(kv_args, "state_types", None) or [])
    if state_types:
        names = ", ".join(getattr(s, "value", str(s)) for s in state_types)
        raise UnsupportedConfig(
            f"the model's state components ({names}: Mamba/SWA/DSA state) are not "
            f"supported by --disaggregation-transfer-backend {BACKEND_NAME}, which "
            "carries KV pages and aux rows only; serve it with another backend"
        )
