"""The gateway's flow-control queue (gate `flow_control`; llm-d's flow control in the Gateway API Inference
Extension, `pkg/epp/flowcontrol`, cited in docs/control.md).

Every arriving request waits in the queue of its priority band (its class) and flow (its tenant). While the
gateway holds requests and the pool's saturation (`control.saturation`, GAIE's detector) is below the band
ceiling (1.0 by default, the same for every band), the gateway dispatches one request per event: from the
highest-priority non-empty band (lower bands wait: no priority inversion), the flow chosen by the band's
fairness policy: `global_strict` (the oldest head request across its flows: FCFS over the band, GAIE's
default) or `round_robin` (the next flow with requests after the last one served). A dispatch is a routing
event at that time (the request's TTFT counts its wait from its arrival); it comes after a control event and
before arrivals and iterations at the same time.

While the gateway holds requests a replica does not leap over iterations: each iteration is an event, after
which the gateway may dispatch (at that iteration's start, as every event sees an iteration's results).

The queues are rings of `size` request ids per (band, flow); a push into a full one is refused (`full`: the
request is dropped and the run flagged, like a full local queue: grow `gateway_queue` and rerun). Pushes and
pops are point updates: an event never touches the whole [K, T, size] array.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from jaxroute.clusters.names import CLASSES, FAIRNESS

ROUND_ROBIN = FAIRNESS.index("round_robin")


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Gateway:
    ids: jax.Array  # [K, T, size] int32 request ids (rings per band and flow)
    head: jax.Array  # [K, T] int32 ring position of each queue's front
    count: jax.Array  # [K, T] int32 requests waiting
    last: jax.Array  # [K] int32 round_robin: the flow a band served last
    full: jax.Array  # [] bool a push found its ring full

    @staticmethod
    def empty(tenants: int, size: int) -> Gateway:
        K = len(CLASSES)
        return Gateway(jnp.zeros((K, tenants, size), jnp.int32), jnp.zeros((K, tenants), jnp.int32),
                       jnp.zeros((K, tenants), jnp.int32), jnp.full((K,), tenants - 1, jnp.int32), jnp.bool_(False))

    @property
    def waiting(self) -> jax.Array:
        return jnp.sum(self.count)

    def push(self, rid, band, flow, when) -> tuple[Gateway, jax.Array]:
        """(gateway, refused): request `rid` joins the tail of (band, flow) where `when`."""
        size = self.ids.shape[2]
        fits = self.count[band, flow] < size
        go = when & fits
        pos = (self.head[band, flow] + self.count[band, flow]) % size
        at = jnp.where(go, band, self.ids.shape[0])  # out of range: no write
        return dataclasses.replace(self, ids=self.ids.at[at, flow, pos].set(rid, mode="drop"),
                                   count=self.count.at[band, flow].add(go.astype(jnp.int32)),
                                   full=self.full | (when & ~fits)), when & ~fits

    def pop(self, fairness, when) -> tuple[Gateway, jax.Array]:
        """(gateway, request id) of the next dispatch (where `when`; the gateway must hold a request)."""
        K, T, size = self.ids.shape
        band = jnp.argmax(jnp.sum(self.count, axis=1) > 0)  # bands in CLASSES order: highest priority first
        has = self.count[band] > 0  # [T]
        heads = self.ids[band, jnp.arange(T), self.head[band]]  # [T] each flow's front request
        oldest = jnp.argmin(jnp.where(has, heads, jnp.iinfo(jnp.int32).max))  # ids follow arrival order
        order = (self.last[band] + 1 + jnp.arange(T)) % T
        next_rr = order[jnp.argmax(has[order])]
        flow = jnp.where(fairness == ROUND_ROBIN, next_rr, oldest)
        rid = heads[flow]
        step = when.astype(jnp.int32)
        return dataclasses.replace(
            self, head=self.head.at[band, flow].set((self.head[band, flow] + step) % size),
            count=self.count.at[band, flow].add(-step),
            last=self.last.at[band].set(jnp.where(when, flow, self.last[band]))), rid
