"""PdlinkConnector: the KVConnectorBase_V1 vLLM loads, split by role.

vLLM builds one instance per role: in the scheduler process
(KVConnectorRole.SCHEDULER, the methods below marked scheduler) and in each
worker (KVConnectorRole.WORKER). Each instance delegates to its side
(pdlink.vllm.scheduler / pdlink.vllm.worker); the configuration is checked
by both, so an unsupported one fails the server at start.
"""

from __future__ import annotations

import logging
from typing import Any

from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorBase_V1,
    KVConnectorRole,
    KVConnectorTransferResults,
)

from pdlink.vllm.config import Settings, refuse_unsupported
from pdlink.vllm.metadata import PdlinkMetadata


def _log_like_vllm() -> None:
    """pdlink.vllm's log lines through vLLM's own handlers, at its level
    (VLLM_LOGGING_LEVEL): otherwise Python's defaults drop every line below
    WARNING, and those left come out without time or process."""
    ours, theirs = logging.getLogger("pdlink.vllm"), logging.getLogger("vllm")
    if ours.handlers or not theirs.handlers:
        return
    for handler in theirs.handlers:
        ours.addHandler(handler)
    ours.setLevel(theirs.level)
    ours.propagate = False


class PdlinkConnector(KVConnectorBase_V1):
    """Prefill -> decode KV through pdlink's daemons; see pdlink.vllm."""

    def __init__(self, vllm_config: Any, role: KVConnectorRole, kv_cache_config: Any = None):
        super().__init__(vllm_config, role, kv_cache_config)
        _log_like_vllm()
        refuse_unsupported(vllm_config, kv_cache_config)
        settings = Settings.from_transfer_config(vllm_config.kv_transfer_config)
        self._scheduler = None
        self._worker = None
        if role == KVConnectorRole.SCHEDULER:
            from pdlink.vllm.scheduler import SchedulerSide

            self._scheduler = SchedulerSide(settings, vllm_config, kv_cache_config)
        else:
            from pdlink.vllm.worker import WorkerSide

            self._worker = WorkerSide(settings, vllm_config, kv_cache_config)

    # -- worker -----------------------------------------------------------

    def register_kv_caches(self, kv_caches: dict[str, Any]) -> None:
        assert self._worker is not None
        self._worker.register_kv_caches(kv_caches)

    def start_load_kv(self, forward_context: Any, **kwargs: Any) -> None:
        assert self._worker is not None
        self._worker.start_load_kv(self._meta())

    def bind_connector_metadata(self, connector_metadata: Any) -> None:
        super().bind_connector_metadata(connector_metadata)
        if self._worker is not None:
            assert isinstance(connector_metadata, PdlinkMetadata)
            self._worker.begin_step(connector_metadata)

    def wait_for_layer_load(self, layer_name: str) -> None:
        # Loads land before the request is scheduled (async, whole request).
        return

    def save_kv_layer(self, layer_name: str, kv_layer: Any, attn_metadata: Any, **kw: Any) -> None:
        # The concurrent flow's pages leave per layer; the sequential flow's
        # after the request finished (request_finished holds them).
        assert self._worker is not None
        self._worker.save_kv_layer(layer_name, self._meta())

    def wait_for_save(self) -> None:
        if self._worker is not None and self.has_connector_metadata():
            self._worker.wait_for_save(self._meta())

    def _meta(self) -> PdlinkMetadata:
        meta = self._get_connector_metadata()
        assert isinstance(meta, PdlinkMetadata)
        return meta

    def get_transfer_results(self, finished_req_ids: set[str]) -> KVConnectorTransferResults:
        assert self._worker is not None
        sending, recving, failed = self._worker.get_transfer_results(finished_req_ids)
        return KVConnectorTransferResults(
            finished_sending=sending, finished_recving=recving, failed_recving=failed
        )

    def get_finished(self, finished_req_ids: set[str]) -> tuple[set[str] | None, set[str] | None]:
        r = self.get_transfer_results(finished_req_ids)
        return r.finished_sending or None, r.finished_recving or None

    def build_connector_worker_meta(self) -> Any:
        return self._worker.worker_meta() if self._worker is not None else None

    # -- scheduler --------------------------------------------------------

    def has_pending_push_work(self) -> bool:
        # The concurrent flow's rooms whose request finished: the engine keeps
        # stepping (each step polls them) until every rank saw them end.
        return self._scheduler is not None and self._scheduler.pushing()

    def on_new_request(self, request: Any) -> None:
        assert self._scheduler is not None
        self._scheduler.on_new_request(request)

    def get_num_new_matched_tokens(
        self, request: Any, num_computed_tokens: int
    ) -> tuple[int, bool]:
        assert self._scheduler is not None
        return self._scheduler.get_num_new_matched_tokens(request, num_computed_tokens)

    def update_state_after_alloc(self, request: Any, blocks: Any, num_external_tokens: int) -> None:
        assert self._scheduler is not None
        self._scheduler.update_state_after_alloc(request, blocks, num_external_tokens)

    def build_connector_meta(self, scheduler_output: Any) -> PdlinkMetadata:
        assert self._scheduler is not None
        return self._scheduler.build_connector_meta(scheduler_output)

    def update_connector_output(self, connector_output: Any) -> None:
        if self._scheduler is not None:
            self._scheduler.update_connector_output(connector_output)

    def request_finished(self, request: Any, block_ids: list[int]) -> tuple[bool, dict | None]:
        assert self._scheduler is not None
        return self._scheduler.request_finished(request, block_ids)

    def shutdown(self) -> None:
        if self._scheduler is not None:
            self._scheduler.shutdown()
        if self._worker is not None:
            self._worker.shutdown()
