"""Threefry without a rolled loop on CPU: JAX's own unrolled lowering, registered for the CPU backend.

JAX lowers the Threefry-2x32 hash as a 5-step `fori_loop` on CPU (unrolled on GPU and TPU). Inside
a simulation step each random draw then becomes a while loop of tiny kernels whose per-iteration
overhead dominated the draw (profile of the replica cluster at 64 seeds: 18 such loops per event,
about a fifth of the step). With the unrolled lowering XLA fuses the hash into its neighbours.
The hash is the same, so every random bit is the same; only the compiled program differs.

`install()` runs when this module is imported: `jaxroute.sim` imports it at its top, so every grid
program is built with it, and so do the few modules that jit programs of their own without `sim`
(`selector.world`, `predictors.bank`, `predictors.training`, `bench.decision`). `import jaxroute` alone
does not (it imports no JAX, so `jaxroute --help` stays fast). `JAXROUTE_ROLLED_THREEFRY=1` keeps JAX's
default. It uses a private JAX hook: on a JAX without it nothing changes (install() returns False).
"""

from __future__ import annotations

import os

OPT_OUT_ENV = "JAXROUTE_ROLLED_THREEFRY"


def install() -> bool:
    """Lower Threefry unrolled on CPU; True when the hook was found and set."""
    if os.environ.get(OPT_OUT_ENV, "") not in ("", "0"):
        return False
    try:
        from jax._src.random import threefry2x32 as threefry  # jax >= 0.7
    except ImportError:
        try:
            from jax._src import prng as threefry  # older jax
        except ImportError:
            return False
    from jax.interpreters import mlir

    primitive = getattr(threefry, "threefry2x32_p", None)
    unrolled = getattr(threefry, "_threefry2x32_lowering_rule", None)
    if primitive is None or unrolled is None:
        return False
    mlir.register_lowering(primitive, unrolled, platform="cpu")
    return True


INSTALLED = install()
