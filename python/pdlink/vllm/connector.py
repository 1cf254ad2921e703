"""PdlinkConnector: the KVConnectorBase_V1 vLLM loads, split by role.

vLLM builds one instance per role: in the scheduler process
(KVConnectorRole.SCHEDULER, the methods below marked scheduler) and in each
worker (KVConnectorRole.WORKER). Each instance delegates to its side
(pdlink.vllm.scheduler / pdlink.vllm.worker); the configuration is checked
by both, so an unsupported one fails the server at start.
"""

from __future__ import annotations

from typing import Any

from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorBase_V1,
    KVConnectorRole,
    KVConnectorTransferResults,
)

from pdlink.vllm.config import Settings, refuse_unsupported
from pdlink.vllm.metadata import PdlinkMetadata


class PdlinkConnector(KVConnectorBase_V1):
    """Prefill -> decode KV through pdlink's daemons; see pdlink.vllm."""

    def __init__(self, vllm_config: Any, role: KVConnectorRole, kv_cache_config: Any = None):
        super().__init__(vllm_config, role, kv_cache_config)
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
        meta = self._get_connector_metadata()
        assert isinstance(meta, PdlinkMetadata)
        self._worker.start_load_kv(meta)

    def wait_for_layer_load(self, layer_name: str) -> None:
        # Loads land before the request is scheduled (async, whole request).
        return

    def save_kv_layer(self, layer_name: str, kv_layer: Any, attn_metadata: Any, **kw: Any) -> None:
        # Pages leave after the request finished (request_finished holds them).
        return

    def wait_for_save(self) -> None:
        return

    def get_transfer_results(self, finished_req_ids: set[str]) -> KVConnectorTransferResults:
        assert self._worker is not None
        sending, recving, failed = self._worker.get_transfer_results(finished_req_ids)
        return KVConnectorTransferResults(
            finished_sending=sending, finished_recving=recving, failed_recving=failed
        )

    def get_finished(self, finished_req_ids: set[str]) -> tuple[set[str] | None, set[str] | None]:
        r = self.get_transfer_results(finished_req_ids)
        return r.finished_sending or None, r.finished_recving or None

    # -- scheduler --------------------------------------------------------

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
