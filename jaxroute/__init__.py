"""jaxroute: a JAX simulator for routing and load balancing in LLM serving."""

__version__ = "0.1.0"
