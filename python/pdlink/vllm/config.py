"""PdlinkConnector's settings and the configurations it refuses at start.

Settings come from kv_transfer_config.kv_connector_extra_config, each key
falling back to the environment the SGLang backend reads, so one daemon
deployment serves both engines:

  extra config key     environment                   meaning
  prefilld_addr        PDLINK_PREFILLD_ADDR          prefilld's gRPC address (prefill role)
  decoded_addr         PDLINK_DECODED_ADDR           decoded's gRPC address (decode role)
  prefill_bootstrap    PDLINK_PREFILL_BOOTSTRAP      prefilld's --bootstrap-listen, handed
                                                     to decode in kv_transfer_params
  region_dir           PDLINK_REGION_DIR             the daemon's --region-dir (both roles;
                                                     prefill_region_dir / decode_region_dir
                                                     when one server runs beside both)
  staging_slots        PDLINK_STAGING_SLOTS          staging pages (vLLM blocks) per side
  daemon_lost_timeout  PDLINK_DAEMON_LOST_TIMEOUT    seconds without the daemon before the
                                                     requests it carried fail (default 5)

kv_role decides the sides: kv_producer prefills (needs prefilld),
kv_consumer decodes (needs decoded), kv_both takes the sides whose daemon is
configured (at least one).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

DEFAULT_STAGING_SLOTS = 512
DEFAULT_DAEMON_LOST_TIMEOUT = 5.0


class UnsupportedConfig(ValueError):
    """A vLLM configuration the connector cannot carry; raised at start."""


def _get(extra: dict[str, Any], key: str, env: str, default: str = "") -> str:
    value = extra.get(key)
    if value is None or value == "":
        value = os.environ.get(env, default)
    return str(value)


@dataclass(frozen=True)
class Settings:
    prefilld_addr: str
    decoded_addr: str
    prefill_bootstrap: str
    prefill_region_dir: str
    decode_region_dir: str
    staging_slots: int
    daemon_lost_timeout: float
    prefill: bool
    decode: bool

    @classmethod
    def from_transfer_config(cls, kv_transfer_config: Any) -> Settings:
        extra = dict(kv_transfer_config.kv_connector_extra_config or {})
        role = kv_transfer_config.kv_role
        prefilld = _get(extra, "prefilld_addr", "PDLINK_PREFILLD_ADDR")
        decoded = _get(extra, "decoded_addr", "PDLINK_DECODED_ADDR")
        region_dir = _get(extra, "region_dir", "PDLINK_REGION_DIR")
        if role == "kv_producer":
            prefill, decode = True, False
        elif role == "kv_consumer":
            prefill, decode = False, True
        elif role == "kv_both":
            prefill, decode = bool(prefilld), bool(decoded)
            if not (prefill or decode):
                raise UnsupportedConfig(
                    "PdlinkConnector with kv_role kv_both needs prefilld_addr or decoded_addr "
                    "(kv_connector_extra_config, or PDLINK_PREFILLD_ADDR / PDLINK_DECODED_ADDR)"
                )
        else:
            raise UnsupportedConfig(f"PdlinkConnector: kv_role {role!r} is not supported")
        s = cls(
            prefilld_addr=prefilld,
            decoded_addr=decoded,
            prefill_bootstrap=_get(extra, "prefill_bootstrap", "PDLINK_PREFILL_BOOTSTRAP"),
            prefill_region_dir=str(extra.get("prefill_region_dir") or region_dir),
            decode_region_dir=str(extra.get("decode_region_dir") or region_dir),
            staging_slots=int(
                _get(extra, "staging_slots", "PDLINK_STAGING_SLOTS", str(DEFAULT_STAGING_SLOTS))
            ),
            daemon_lost_timeout=float(
                _get(
                    extra,
                    "daemon_lost_timeout",
                    "PDLINK_DAEMON_LOST_TIMEOUT",
                    str(DEFAULT_DAEMON_LOST_TIMEOUT),
                )
            ),
            prefill=prefill,
            decode=decode,
        )
        s._validate()
        return s

    def _validate(self) -> None:
        missing = []
        if self.prefill:
            if not self.prefilld_addr:
                missing.append("prefilld_addr (PDLINK_PREFILLD_ADDR)")
            if not self.prefill_bootstrap:
                missing.append("prefill_bootstrap (PDLINK_PREFILL_BOOTSTRAP)")
            if not self.prefill_region_dir:
                missing.append("region_dir (PDLINK_REGION_DIR)")
        if self.decode:
            if not self.decoded_addr:
                missing.append("decoded_addr (PDLINK_DECODED_ADDR)")
            if not self.decode_region_dir:
                missing.append("region_dir (PDLINK_REGION_DIR)")
        if missing:
            raise UnsupportedConfig("PdlinkConnector needs " + ", ".join(missing))
        if self.staging_slots < 1:
            raise UnsupportedConfig(f"PdlinkConnector: staging_slots {self.staging_slots} < 1")


def refuse_unsupported(vllm_config: Any, kv_cache_config: Any) -> None:
    """Raise UnsupportedConfig naming the first thing the connector cannot carry.

    pdlink moves one request's blocks of one full-attention KV cache group
    between equal-TP engines; anything else would move the wrong bytes or
    only some of them, so it is refused before the engine serves.
    """
    par = vllm_config.parallel_config
    if int(getattr(par, "pipeline_parallel_size", 1) or 1) > 1:
        raise UnsupportedConfig(
            "PdlinkConnector does not support pipeline parallelism "
            f"(pipeline_parallel_size={par.pipeline_parallel_size})"
        )
    for name in ("decode_context_parallel_size", "prefill_context_parallel_size"):
        if int(getattr(par, name, 1) or 1) > 1:
            raise UnsupportedConfig(
                f"PdlinkConnector does not support context parallelism ({name}="
                f"{getattr(par, name)})"
            )
    if int(getattr(par, "data_parallel_size", 1) or 1) > 1:
        raise UnsupportedConfig(
            "PdlinkConnector does not support data parallelism within one server "
            f"(data_parallel_size={par.data_parallel_size}); run one server per replica"
        )
    model = vllm_config.model_config
    if model is not None:
        if getattr(model, "is_hybrid", False) or getattr(model, "has_inner_state", False):
            raise UnsupportedConfig(
                "PdlinkConnector does not support hybrid / Mamba / state-space models: "
                "pdlink carries attention KV blocks only"
            )
        if getattr(model, "is_attention_free", False):
            raise UnsupportedConfig("PdlinkConnector: the model has no attention KV to move")
        window = model.get_sliding_window() if hasattr(model, "get_sliding_window") else None
        if window:
            raise UnsupportedConfig(
                f"PdlinkConnector does not support sliding-window attention (window {window}): "
                "decode would receive blocks vLLM's sliding-window manager never allocated"
            )
    if kv_cache_config is None:
        return
    from vllm.v1.kv_cache_interface import FullAttentionSpec, MLAAttentionSpec

    groups = list(kv_cache_config.kv_cache_groups)
    if len(groups) != 1:
        raise UnsupportedConfig(
            f"PdlinkConnector carries one KV cache group, the model has {len(groups)} "
            "(hybrid attention)"
        )
    spec = groups[0].kv_cache_spec
    if type(spec) not in (FullAttentionSpec, MLAAttentionSpec):
        raise UnsupportedConfig(
            f"PdlinkConnector carries full-attention KV only, not {type(spec).__name__}"
        )
