"""radixlink as a vLLM v1 KV connector; vLLM loads ``RadixlinkConnector`` from this package."""

from radixlink.integrations.vllm.connector import RadixlinkConnector

__all__ = ["RadixlinkConnector"]
