"""A shared smoke check every cluster model must pass (jumanji's `env_not_smoke` idea).

`check_model(model, workload, params_rows)` runs the rows (several policies) through the
engine exactly as the commands do (`sim.run_grid`: jit + vmap + sharding) and asserts:

- exactly one compilation for the whole multi-policy grid, and none more for the same rows
  in another order (policies are data, not Python branches);
- every floating metric is finite, `conservation_error` is 0 in every row;
- a batch of one equals the unbatched `sim.run` bit for bit (same seed key);
- rows of the multi-row grid equal their own unbatched runs (to float rounding).
"""

from __future__ import annotations

from collections.abc import Sequence

import jax
import numpy as np

from jaxroute import sim


def _host(tree):
    return jax.tree.map(np.asarray, tree)


def check_model(model: sim.Model, workload, params_rows: Sequence, n_seeds: int = 2, *, key=None,
                chunk: int | None = None, allow_nonfinite: Sequence[str] = (), rtol: float = 1e-5,
                rows_checked: int = 4) -> sim.GridResult:
    """Run the smoke checks; returns the grid of `params_rows` x `n_seeds` for further checks."""
    assert isinstance(model, sim.Model), f"{type(model).__name__} must subclass jaxroute.sim.Model"
    assert len(params_rows) >= 2, "give several rows (policies) so the one-compilation check means something"
    key = jax.random.key(0) if key is None else key
    sim.clear_compiled(model)

    grid = sim.run_grid(model, key, workload, sim.stack_params(list(params_rows)), n_seeds, chunk=chunk)
    assert sim.compile_count(model, "advance") == 1, f"{sim.compile_count(model, 'advance')} compilations"
    sim.run_grid(model, jax.random.fold_in(key, 1), workload, sim.stack_params(list(params_rows)[::-1]), n_seeds,
                 chunk=chunk)
    assert sim.compile_count(model, "advance") == 1, "reordering the policies recompiled"

    for name, value in grid.metrics.items():
        value = np.asarray(value)
        assert value.shape[:2] == (len(params_rows), n_seeds), name
        if np.issubdtype(value.dtype, np.floating) and name not in allow_nonfinite:
            assert np.isfinite(value).all(), f"metric {name} is not finite: {value}"
    assert "conservation_error" in grid.metrics, "every model reports conservation_error"
    np.testing.assert_array_equal(grid.metrics["conservation_error"], 0, err_msg="conservation_error")
    assert "overflow" in grid.metrics, "every model reports overflow"

    single = jax.jit(lambda k, w, p: sim.run(model, k, w, p))
    # A batch of one (one row, one seed) equals the unbatched call with that seed's key: counts exactly, floats to
    # the last bit or two (XLA may fuse a float sum differently in the batched and the plain program).
    one = sim.run_grid(model, key, workload, sim.stack_params([params_rows[0]]), 1)  # whole scan: one compile
    plain = _host(single(jax.random.split(key, 1)[0], workload, params_rows[0]))
    for name, value in plain.items():
        got = np.asarray(one.metrics[name][0, 0])
        if np.issubdtype(value.dtype, np.floating):
            np.testing.assert_array_equal(np.isfinite(got), np.isfinite(value), err_msg=f"batch of one: {name}")
            finite = np.isfinite(value)
            np.testing.assert_array_max_ulp(got[finite], value[finite], maxulp=2)
        else:
            np.testing.assert_array_equal(got, value, err_msg=f"batch of one: {name}")
    # Rows of the multi-policy grid (first, last and evenly between: `rows_checked` of them) equal their own
    # unbatched runs (seed s uses split(key, S)[s]).
    seed_keys = jax.random.split(key, n_seeds)
    picked = np.unique(np.linspace(0, len(params_rows) - 1, min(rows_checked, len(params_rows))).round().astype(int))
    for c in picked:
        row = params_rows[c]
        plain = _host(single(seed_keys[n_seeds - 1], workload, row))
        for name, value in plain.items():
            got = np.asarray(grid.metrics[name][c, n_seeds - 1])
            if np.issubdtype(value.dtype, np.floating):
                np.testing.assert_allclose(got, value, rtol=rtol, atol=1e-6, err_msg=f"row {c}: {name}")
            else:
                np.testing.assert_array_equal(got, value, err_msg=f"row {c}: {name}")
    return grid
