"""External page stores (memory, directory, Redis, Redis Cluster, tiered, faults) and the codec."""

from radixlink.stores.base import Store
from radixlink.stores.codec import PageCodec
from radixlink.stores.directory import default_store_url
from radixlink.stores.keys import page_key, parse_key
from radixlink.stores.registry import open_store, parse_size

__all__ = [
    "PageCodec",
    "Store",
    "default_store_url",
    "open_store",
    "page_key",
    "parse_key",
    "parse_size",
]
