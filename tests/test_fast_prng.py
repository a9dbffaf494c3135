"""The unrolled CPU Threefry (jaxroute.fast_prng) gives JAX's bits without a loop in the program."""

import os
import subprocess
import sys

import jax

from jaxroute import fast_prng

DRAWS = """
import jax, numpy as np, jaxroute.sim  # jaxroute.sim installs the unrolled lowering (jaxroute alone does not)
key = jax.random.key(2024)
f = jax.jit(lambda k: (jax.random.uniform(jax.random.fold_in(k, 7), (5,)), jax.random.randint(k, (3,), 0, 9),
                       jax.random.categorical(k, jax.numpy.arange(6.0)), jax.random.split(k, 2)))
u, i, c, s = f(key)
print("while" in f.lower(key).compile().as_text())
print(np.asarray(u).view(np.uint32).tolist(), np.asarray(i).tolist(), int(c), jax.random.key_data(s).tolist())
"""


def _draws(rolled: bool) -> tuple[str, str]:
    env = dict(os.environ, JAX_PLATFORMS="cpu", **({fast_prng.OPT_OUT_ENV: "1"} if rolled else {}))
    env.pop("XLA_FLAGS", None)
    out = subprocess.run([sys.executable, "-c", DRAWS], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    has_loop, bits = out.stdout.split("\n", 1)
    return has_loop, bits


def test_unrolled_threefry_is_installed_and_has_no_loop():
    assert fast_prng.INSTALLED
    f = jax.jit(lambda k: jax.random.uniform(jax.random.fold_in(k, 3), (4,)))
    assert "while" not in f.lower(jax.random.key(0)).compile().as_text()


def test_unrolled_threefry_draws_the_same_bits_as_jax():
    (loop_u, unrolled), (loop_r, rolled) = _draws(rolled=False), _draws(rolled=True)
    assert (loop_u, loop_r) == ("False", "True")  # the opt-out really compiles JAX's rolled loop
    assert unrolled == rolled and len(unrolled) > 20
