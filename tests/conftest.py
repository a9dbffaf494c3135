"""Test set-up: four simulated CPU devices, so sharding is exercised on any machine; no compile cache."""

import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("JAXROUTE_NO_PROGRESS", "1")
os.environ["JAXROUTE_NO_COMPILE_CACHE"] = "1"  # the CLI under test must not write to the user's cache

import jax  # noqa: E402

jax.config.update("jax_num_cpu_devices", 4)
jax.config.update("jax_enable_x64", False)
