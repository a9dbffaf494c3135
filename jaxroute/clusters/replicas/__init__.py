"""Replicas with prefix caches behind a router: `model` (event loop, metrics), `iteration` (one replica
iteration and the event leap), `types` (params and state);
`jaxroute.clusters.prefix_cache` has the cache rules (leading match, LRU order) it shares with routers."""

from jaxroute.clusters.prefix_cache import leading_match
from jaxroute.clusters.replicas.cache import SlotTable, cached_mask, slot_bound
from jaxroute.clusters.replicas.model import (
    METRICS,
    ReplicaModel,
    default_max_queue,
    make_params,
    records,
    run_single,
)
from jaxroute.clusters.replicas.types import (
    Replica,
    ReplicaParams,
    ReplicaState,
    Snapshot,
)

__all__ = ["METRICS", "Replica", "ReplicaModel", "ReplicaParams", "ReplicaState", "Snapshot",
           "default_max_queue", "leading_match", "make_params", "records", "run_single", "SlotTable", "cached_mask", "slot_bound"]
