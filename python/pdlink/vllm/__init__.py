"""pdlink as a vLLM v1 KV connector, loaded out of tree:

  --kv-transfer-config '{"kv_connector": "PdlinkConnector",
                         "kv_connector_module_path": "pdlink.vllm",
                         "kv_role": "kv_producer" | "kv_consumer" | "kv_both",
                         "kv_connector_extra_config": {...}}'

The flow is vLLM's documented disaggregated one (NixlConnector's): the
prefill request carries kv_transfer_params {"do_remote_decode": true} and
max_tokens 1; its answer's kv_transfer_params go unchanged to the decode
request. The concurrent flow (pdlink.vllm.proxy --flow concurrent) asks both
at once and sends prefill's pages per layer: pdlink.vllm.layerwise.
Settings: pdlink.vllm.config; the params: pdlink.vllm.metadata; why staging:
pdlink.vllm.staging.
"""

from pdlink.vllm.connector import PdlinkConnector

__all__ = ["PdlinkConnector"]
