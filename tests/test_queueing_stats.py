"""Statistical checks of the classic dispatch model against queueing theory and the lecture's claims.

Fixed keys (deterministic), enough seeds that the assertions have real margins.
"""

import math

import jax
import numpy as np
import pytest

from jaxroute import sim
from jaxroute.clusters import bins
from jaxroute.clusters.bins import BinsModel
from jaxroute.clusters.queueing import DispatchModel, default_ring, make_params


def _grid(model, rows, seeds, key=0):
    params = sim.stack_params([make_params(**r) for r in rows])
    grid = sim.run_grid(model, jax.random.key(key), None, params, seeds)
    assert not grid.overflow.any()
    assert not np.any(grid.metrics["conservation_error"])
    return grid


def _mean_se(x):
    x = np.asarray(x, dtype=np.float64)
    return x.mean(), x.std(ddof=1) / math.sqrt(len(x))


@pytest.mark.slow
def test_random_dispatch_is_mm1_and_md1():
    """Random split of Poisson arrivals: each server is M/M/1 (mean 1/(1-rho), P99 ln(100)/(1-rho));
    with deterministic service it is M/D/1 (Pollaczek-Khinchine: 1 + rho / (2 (1 - rho)))."""
    model = DispatchModel(n_servers=4, n_requests=40_000, warmup=4_000, ring=8)
    rows = [dict(policy="random", load=0.5, service="exp"), dict(policy="random", load=0.8, service="exp"),
            dict(policy="random", load=0.8, service="det")]
    g = _grid(model, rows, seeds=16)
    mean = g.metrics["mean_response"].mean(axis=1)
    p99 = g.metrics["p99_response"].mean(axis=1)
    assert mean[0] == pytest.approx(1 / (1 - 0.5), rel=0.03)
    assert mean[1] == pytest.approx(1 / (1 - 0.8), rel=0.04)
    assert p99[0] == pytest.approx(math.log(100) / (1 - 0.5), rel=0.04)
    assert p99[1] == pytest.approx(math.log(100) / (1 - 0.8), rel=0.05)
    assert mean[2] == pytest.approx(1 + 0.8 / (2 * (1 - 0.8)), rel=0.04)


@pytest.mark.slow
def test_balls_into_bins_at_1e5():
    """Random: E[max] ~ 7.7 at n = 1e5 (Poisson approximation); two choices: 3-4."""
    n, seeds = 100_000, 24
    grid = sim.run_grid(BinsModel(n=n, max_d=2), jax.random.key(0), None,
                        sim.stack_params([bins.make_params(1), bins.make_params(2)]), seeds)
    assert not np.any(grid.metrics["conservation_error"])
    max_load = grid.metrics["max_load"].astype(np.float64)
    # E[max of n iid Poisson(1)] = sum_k P(max >= k), P(max >= k) = 1 - (1 - P(X >= k))^n.
    tail = lambda k: 1 - sum(math.exp(-1) / math.factorial(j) for j in range(k))
    expect = sum(1 - (1 - tail(k)) ** n for k in range(1, 30))
    m, se = _mean_se(max_load[0])
    assert 7.0 <= m <= 9.0 and abs(m - expect) < 4 * se + 0.05, (m, se, expect)
    m2, _ = _mean_se(max_load[1])
    assert 3.0 <= m2 <= 4.0


@pytest.mark.slow
def test_stale_information_herds_jsq_but_not_p2c():
    """Mitzenmacher (2000): with the board refreshed every T = 4 service times, JSQ herds and is worse
    than random, while the two-choice rule barely moves."""
    model = DispatchModel(n_servers=16, n_requests=10_000, warmup=1_000, ring=default_ring(16, 0.9, 4.0))
    rows = [dict(policy="random", load=0.9), dict(policy="jsq", load=0.9),
            dict(policy="jsq", load=0.9, stale=4.0), dict(policy="pod", load=0.9),
            dict(policy="pod", load=0.9, stale=4.0)]
    g = _grid(model, rows, seeds=8)
    mean = g.metrics["mean_response"].astype(np.float64)
    random_, jsq, jsq_stale, p2c, p2c_stale = mean
    assert np.mean(jsq) < np.mean(p2c) < np.mean(random_)  # fresh ordering
    diff, se = _mean_se(jsq_stale - random_)
    assert diff > 3 * se, (np.mean(jsq_stale), np.mean(random_))
    assert np.mean(p2c_stale) / np.mean(p2c) < 1.5
    assert np.mean(jsq_stale) / np.mean(jsq) > 3.0


@pytest.mark.slow
def test_heavy_tails_erase_round_robin_gain_and_favour_least_work():
    """Exponential service: RR about halves random's mean. Bounded Pareto (CV 5.7): RR is within
    noise of random over 8 seeds (the lecture's setting), and LWL's P99 is below JSQ's."""
    model = DispatchModel(n_servers=16, n_requests=20_000, warmup=2_000, ring=32)
    rows = [dict(policy=p, load=0.9, service=law) for law in ("exp", "pareto") for p in ("random", "rr", "jsq", "lwl")]
    g = _grid(model, rows, seeds=8)
    mean = g.metrics["mean_response"].astype(np.float64)
    p99 = g.metrics["p99_response"].astype(np.float64)
    assert np.mean(mean[0]) / np.mean(mean[1]) > 1.5  # exp: RR clearly better than random
    diff, se = _mean_se(mean[4] - mean[5])  # pareto: random - rr
    assert abs(diff) < 3 * se or abs(diff) < 0.1 * np.mean(mean[4]), (diff, se)
    gap, se = _mean_se(p99[6] - p99[7])  # pareto: jsq P99 - lwl P99
    assert gap > 3 * se, (gap, se)


@pytest.mark.slow
def test_supermarket_model_tail_fractions():
    """Power-of-d at large N (Mitzenmacher / Vvedenskaya et al.): the fraction of servers with >= i jobs
    is rho^((d^i - 1) / (d - 1)); i = 1 is the utilisation rho for any policy."""
    rho, levels = 0.9, 5
    model = DispatchModel(n_servers=100, n_requests=40_000, warmup=8_000, ring=32, max_d=3, tail_levels=levels)
    g = _grid(model, [dict(policy="pod", load=rho, d=2), dict(policy="pod", load=rho, d=3)], seeds=2)
    for row, d in ((0, 2), (1, 3)):
        for i in range(1, levels + 1):
            theory = rho ** ((d**i - 1) / (d - 1))
            got = float(np.mean(g.metrics[f"frac_ge_{i}"][row]))
            assert got == pytest.approx(theory, abs=0.03), (d, i, got, theory)
