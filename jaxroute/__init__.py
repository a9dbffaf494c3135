"""jaxroute: a JAX simulator for routing and load balancing in LLM serving."""

from jaxroute import fast_prng as _fast_prng  # noqa: F401  (Threefry unrolled on CPU: same bits, no loop)

__version__ = "0.1.0"
