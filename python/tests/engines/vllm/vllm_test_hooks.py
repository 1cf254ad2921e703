"""Test-only: PdlinkConnector with a switchable fault in decode's copy out of staging.

Loaded by the suite's decode server (kv_connector_module_path
"vllm_test_hooks", this directory on its PYTHONPATH), never shipped. With no
flag file it is PdlinkConnector unchanged. The flag file (its path in the
extra config key "test_fault_file") holds the fault for the next loads:
  corrupt  adds 1.0 to every float of the first staged block before the copy
  shuffle  copies the staged blocks into the request's blocks in reverse order
so the suite proves that a wrong page or a wrong block mapping changes the
tokens (the oracle comparison can fail).
"""

from __future__ import annotations

from typing import Any

import torch

from pdlink.vllm import PdlinkConnector


class PdlinkTestConnector(PdlinkConnector):
    def register_kv_caches(self, kv_caches: dict[str, Any]) -> None:
        super().register_kv_caches(kv_caches)
        flag = self._kv_transfer_config.kv_connector_extra_config.get("test_fault_file", "")
        side = self._worker.decode if self._worker is not None else None
        if not flag or side is None:
            return
        staging = side.staging
        real_stage_in = staging.stage_in

        def stage_in(slots: Any, blocks: Any) -> None:
            try:
                with open(flag) as f:
                    fault = f.read().strip()
            except FileNotFoundError:
                fault = ""
            blocks = list(blocks)
            if fault == "shuffle" and len(blocks) > 1:
                blocks = blocks[::-1]
            if fault == "corrupt" and len(slots):
                first = int(slots[0])
                for view in staging.views:
                    page = view[first].view(torch.float32)
                    page += 1.0
            real_stage_in(slots, blocks)

        staging.stage_in = stage_in
