"""The object-store and broadcast transports pass the transport kit."""

from rlhf_plugin_torch_sync.broadcast import GlooBroadcast, NcclBroadcast
from rlhf_plugin_torch_sync.object_store import ObjectStoreTransport

from rlhf.testing.conformance import WeightSyncTransportKit


class TestObjectStore(WeightSyncTransportKit):
    component = ObjectStoreTransport
    plugin_module = "rlhf_plugin_torch_sync"
    registered_name = "object_store"


class TestGloo(WeightSyncTransportKit):
    component = GlooBroadcast
    plugin_module = "rlhf_plugin_torch_sync"
    registered_name = "gloo"


class TestNccl(WeightSyncTransportKit):
    component = NcclBroadcast
    plugin_module = "rlhf_plugin_torch_sync"
    registered_name = "nccl"
