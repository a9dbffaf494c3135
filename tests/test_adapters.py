"""LoRA adapters (clusters/replicas/adapters.py): adapter slots per replica, loads, the batch's cost and llm-d's
lora-affinity scorer, matched request by request against the plain-Python reference (tests/reference_replicas.py
with `lora`): which replica, admit / first-token / finish times (loads and the step overhead included), loads
and hits; one compiled program for adapter counts and skews; one-line errors for bad settings."""

import jax
import numpy as np
import pytest

from jaxroute import sim
from jaxroute.clusters import replicas as R
from jaxroute.clusters.names import REPLICA_GPU, REPLICA_MODEL
from jaxroute.clusters.replicas import adapters as A
from jaxroute.clusters.replicas import tiers as T
from jaxroute.errors import JaxrouteError
from jaxroute.workloads import prefix as W
from tests import reference_replicas as ref

G, B, Q, CAP, L, K = 4, 8, 160, 6000, 2, 16
_WL = {}


def _model(admission="reserve", tiers=False):
    return R.ReplicaModel(n_replicas=G, max_running=B, max_queue=Q, admission=admission, lora_slots=L, adapter_ids=K,
                          router_modules=(), kv_tiers=tiers)


MODELS = {adm: _model(adm) for adm in ("reserve", "on-demand")}

# (router, admission, rate, adapter settings, extra router settings): skews and counts, base-model requests,
# on-demand preemptions, the lora scorer in a weighted preset, llm-d's preset
ROWS = [
    ("least_load", "reserve", 20.0, dict(n_adapters=4, zipf_s=1.0), {}),
    ("llmd_lora", "reserve", 20.0, dict(n_adapters=16, zipf_s=0.5), {}),
    ("rr", "on-demand", 20.0, dict(n_adapters=8, zipf_s=1.2, base_share=0.3, load_ms=20.0), {}),
    ("weighted", "reserve", 25.0, dict(n_adapters=12, zipf_s=0.8, step_overhead=0.1),
     dict(weights=dict(prefix=1.0, inflight=1.0, lora=2.0))),
    ("llmd_lora", "on-demand", 20.0, dict(n_adapters=6, zipf_s=1.5, load_ms=50.0), {}),
]


def _workload():
    if "wl" not in _WL:
        _WL["wl"] = W.toolbench(160, n_tools=8, tool_mean=1500)
    return _WL["wl"]


def _lora(settings):
    return A.make(REPLICA_GPU, REPLICA_MODEL, **settings)


def _reference(st, p, policy, admission, router=None, tiers=None):
    lp = p.lora
    want, violations = ref.simulate(st.req, G=G, cap=CAP, policy=policy, cost=p.cost, B=B, Q=Q, admission=admission,
                                    router=router, router_key=jax.random.key(1), tiers=tiers,
                                    lora=dict(slots=L, load_s=np.float32(lp.load_s),
                                              step_overhead=np.float32(lp.step_overhead)))
    assert violations == []
    return want


def _check(st, want):
    got = R.records(st)
    np.testing.assert_array_equal(got["replica"], want["replica"])
    np.testing.assert_array_equal(got["cached_tokens"], want["cached"])
    for a, b in (("admit_s", "admit"), ("first_token_s", "first"), ("finish_s", "finish")):
        np.testing.assert_allclose(got[a], want[b], rtol=1e-6)
    lo = st.lora
    assert (int(lo.loads), int(lo.hits), int(lo.asks)) == (want["lora"]["loads"], want["lora"]["hits"],
                                                            want["lora"]["asks"])


@pytest.mark.parametrize("row", range(len(ROWS)))
def test_adapters_match_reference(row):
    policy, admission, rate, settings, router = ROWS[row]
    wl = _workload()
    p = R.make_params(policy, rate=rate, kv_capacity=CAP, lora=_lora(settings), **router)
    st = R.run_single(MODELS[admission], jax.random.key(1), wl, p)
    _check(st, _reference(st, p, policy, admission, router))
    m = {k: np.asarray(v) for k, v in MODELS[admission].metrics(st, wl, p).items()}
    assert int(m["conservation_error"]) == 0 and not bool(m["overflow"])
    adapters = np.asarray(st.req.adapter)
    assert int(m["adapter_loads"]) > 0 and adapters.max() < settings["n_adapters"]
    assert ((adapters < 0).mean() > 0.15) == (settings.get("base_share", 0) > 0)


def test_adapters_with_tiers_match_reference():
    """Both loads in one iteration (KV from the tiers, then the adapter) and the step overhead, exactly."""
    wl = _workload()
    tiers = T.make(REPLICA_GPU, REPLICA_MODEL, cpu_gib=0.5, shared_gib=1.0)
    p = R.make_params("llmd_lora", rate=20.0, kv_capacity=CAP, lora=_lora(dict(n_adapters=6)), tiers=tiers)
    st = R.run_single(_model(tiers=True), jax.random.key(1), wl, p)
    want = _reference(st, p, "llmd_lora", "reserve", tiers=dict(
        cpu_tokens=int(tiers.cpu_tokens), cpu_s_per_token=np.float32(tiers.cpu_s_per_token),
        shared_tokens=int(tiers.shared_tokens), shared_s_per_token=np.float32(tiers.shared_s_per_token),
        shared_latency_s=np.float32(tiers.shared_latency_s)))
    _check(st, want)
    assert want["tier"].sum() > 0


def test_affinity_routing_loads_fewer_adapters():
    """llm-d's lora-affinity preset keeps adapters where they run: fewer loads and a higher hit rate than least
    load on the same seeds (16 adapters, 2 slots per replica)."""
    wl = _workload()
    lp = _lora(dict(n_adapters=16, zipf_s=1.0))
    rows = [R.make_params(pol, rate=20.0, kv_capacity=CAP, lora=lp) for pol in ("least_load", "llmd_lora")]
    res = sim.run_grid(MODELS["reserve"], jax.random.key(5), wl, sim.stack_params(rows), n_seeds=4, progress=False)
    m = res.metrics
    assert (m["adapter_loads"][1] < m["adapter_loads"][0]).all()
    assert (m["adapter_hit_rate"][1] > m["adapter_hit_rate"][0]).all()


def test_adapter_counts_and_skews_are_rows_of_one_program():
    wl = _workload()
    model = MODELS["reserve"]
    rows = [R.make_params("llmd_lora", rate=20.0, kv_capacity=CAP, lora=_lora(dict(n_adapters=k, zipf_s=s)))
            for k in (2, 8, 16) for s in (0.5, 1.5)]
    before = sim.compile_count(model)
    res = sim.run_grid(model, jax.random.key(3), wl, sim.stack_params(rows), n_seeds=2, progress=False)
    assert sim.compile_count(model) - before <= 1
    res.check_conserved("adapter grid")
    m = res.metrics
    assert (m["conservation_error"] == 0).all() and not m["overflow"].any()
    # two adapters fit every replica's two slots: at most one load per replica and adapter; more adapters and a
    # flatter popularity: more loads (means over seeds)
    loads = m["adapter_loads"].mean(axis=1).reshape(3, 2)
    assert (loads[0] <= 2 * G).all() and (loads[2] > loads[1]).all() and (loads[1:, 0] > loads[1:, 1]).all()


def test_the_adapter_draw_follows_zipf():
    """The synthetic draw: P(k) proportional to (k + 1)^-s over n_adapters ids, base_share on the base model."""
    lp = _lora(dict(n_adapters=5, zipf_s=1.2, base_share=0.2))
    draws = np.asarray(A.draw(jax.random.key(0), lp, None, 200_000, 8))
    assert abs((draws < 0).mean() - 0.2) < 0.01 and draws.max() == 4
    want = (np.arange(1, 6) ** -1.2) / np.sum(np.arange(1, 6) ** -1.2)
    got = np.bincount(draws[draws >= 0], minlength=5) / (draws >= 0).sum()
    np.testing.assert_allclose(got, want, atol=0.005)


@pytest.mark.parametrize("settings, message", [
    (dict(adapters=4), "unknown adapter setting 'adapters'"),
    (dict(n_adapters=0), "n_adapters must be a whole number >= 1"),
    (dict(rank=2.5), "rank must be a whole number >= 1"),
    (dict(base_share=1.0), r"base_share must be in \[0, 1\)"),
    (dict(zipf_s=float("nan")), "zipf_s must be a finite number >= 0"),
    (dict(load_ms=-1.0), "load_ms must be a finite number >= 0"),
])
def test_bad_adapter_settings_are_one_line_errors(settings, message):
    with pytest.raises(JaxrouteError, match=message):
        _lora(settings)


def test_adapters_need_a_model_with_slots_for_every_id():
    wl = _workload()
    plain = R.ReplicaModel(n_replicas=G, max_running=B, max_queue=Q)
    with pytest.raises(JaxrouteError, match="lora_slots > 0"):
        plain.check_params(R.make_params("rr", kv_capacity=CAP, lora=_lora({})), wl)
    with pytest.raises(JaxrouteError, match="needs adapter settings"):
        MODELS["reserve"].check_params(R.make_params("rr", kv_capacity=CAP), wl)
    with pytest.raises(JaxrouteError, match="adapter_ids >= 32"):
        MODELS["reserve"].check_params(R.make_params("rr", kv_capacity=CAP, lora=_lora(dict(n_adapters=32))), wl)
    with pytest.raises(JaxrouteError, match="both be >= 1"):
        R.ReplicaModel(lora_slots=2)


def test_replica_leaving_unloads_its_adapters():
    """Under an autoscaler (Dynamo's SLA planner) a replica that drains and leaves comes back with no adapter
    loaded: matched request by request and load by load against the reference."""
    from jaxroute.clusters.replicas import control as C
    from tests import reference_control as refc

    wl = _workload()
    model = R.ReplicaModel(n_replicas=G, max_running=B, max_queue=Q, router_modules=(), lora_slots=L, adapter_ids=K,
                           control=True, control_ticks=600, control_history=64, control_log=128)
    settings = dict(scaler="sla", capacity_rps=6.0, interval_s=3.0, provision_s=2.0)
    p = R.make_params("least_load", rate=20.0, kv_capacity=CAP, control=C.make(G, **settings),
                      lora=_lora(dict(n_adapters=8)))
    st = R.run_single(model, jax.random.key(1), wl, p)
    full = {**C.DEFAULTS, "max_replicas": G, "initial": 1, "interval_s": C.INTERVAL_S["sla"], **settings}
    ctl = refc.Control(full, G, np.asarray(st.req.klass), np.asarray(st.req.tenant), C.TENANTS, B)
    want, violations = ref.simulate(st.req, G=G, cap=CAP, policy="least_load", cost=p.cost, B=B, Q=Q, control=ctl,
                                    lora=dict(slots=L, load_s=np.float32(p.lora.load_s),
                                              step_overhead=np.float32(p.lora.step_overhead)))
    assert violations == [] and ctl.downs > 0
    _check(st, want)
    off = np.asarray(st.ctl.status) == C.OFF
    assert off.any() and (np.asarray(st.lora.slot)[off] == -1).all()
