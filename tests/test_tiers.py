"""KV offload tiers (clusters/replicas/tiers.py): a CPU tier per replica and a shared tier, matched request by
request against the plain-Python reference (tests/reference_replicas.py with `tiers`): which replica, the
tokens found on the GPU and loaded from each tier, admit / first-token / finish times (the load time
included), and the tokens moved; a model with empty tiers runs as the plain model; one-line errors."""

import jax
import numpy as np
import pytest

from jaxroute import sim
from jaxroute.clusters import replicas as R
from jaxroute.clusters.names import REPLICA_GPU, REPLICA_MODEL
from jaxroute.clusters.replicas import tiers as T
from jaxroute.errors import JaxrouteError
from jaxroute.workloads import prefix as W
from tests import reference_replicas as ref

G, B, Q, CAP = 4, 8, 160, 6000
MODELS = {adm: R.ReplicaModel(n_replicas=G, max_running=B, max_queue=Q, kv_tiers=True, admission=adm,
                              router_modules=("dynamo",)) for adm in ("reserve", "on-demand")}
_WL = {}

# (router, admission, rate, tier settings): a CPU tier, a shared tier, both (slow links, a latency), on-demand
ROWS = [
    ("least_load", "reserve", 20.0, dict(cpu_gib=0.5)),
    ("affinity", "reserve", 20.0, dict(shared_gib=2.0)),
    ("rr", "reserve", 25.0, dict(cpu_gib=0.25, shared_gib=1.0, cpu_gbps=4.0, shared_gbps=2.0, shared_latency_ms=5.0)),
    ("least_load", "on-demand", 20.0, dict(cpu_gib=0.5, shared_gib=2.0)),
    ("llmd_precise", "reserve", 20.0, dict(cpu_gib=0.5, shared_gib=1.0)),
    ("dynamo_kv", "reserve", 20.0, dict(cpu_gib=0.5, shared_gib=1.0)),
]


def _workload():
    if "wl" not in _WL:  # 160 requests over 8 tools of ~1,500 tokens: the GPU (6,000 tokens) holds few at once
        _WL["wl"] = W.toolbench(160, n_tools=8, tool_mean=1500)
    return _WL["wl"]


def _tiers(settings):
    return T.make(REPLICA_GPU, REPLICA_MODEL, **settings)


def _run(policy, admission, rate, settings, key=1):
    wl = _workload()
    p = R.make_params(policy, rate=rate, kv_capacity=CAP, tiers=_tiers(settings))
    return wl, p, R.run_single(MODELS[admission], jax.random.key(key), wl, p)


def _reference(st, p, policy, admission):
    tp = p.tiers
    tiers = dict(cpu_tokens=int(tp.cpu_tokens), cpu_s_per_token=np.float32(tp.cpu_s_per_token),
                 shared_tokens=int(tp.shared_tokens), shared_s_per_token=np.float32(tp.shared_s_per_token),
                 shared_latency_s=np.float32(tp.shared_latency_s))
    want, violations = ref.simulate(st.req, G=G, cap=CAP, policy=policy, cost=p.cost, B=B, Q=Q, admission=admission,
                                    tiers=tiers, router_key=jax.random.key(1))
    assert violations == []
    return want


@pytest.mark.parametrize("row", range(len(ROWS)))
def test_tiers_match_reference(row):
    policy, admission, rate, settings = ROWS[row]
    wl, p, st = _run(policy, admission, rate, settings)
    want = _reference(st, p, policy, admission)
    got = R.records(st)
    np.testing.assert_array_equal(got["replica"], want["replica"])
    np.testing.assert_array_equal(got["cached_tokens"], want["cached"])
    np.testing.assert_array_equal(got["cpu_tier_tokens"], want["tier"][:, 0])
    np.testing.assert_array_equal(got["shared_tier_tokens"], want["tier"][:, 1])
    for a, b in (("admit_s", "admit"), ("first_token_s", "first"), ("finish_s", "finish")):
        np.testing.assert_allclose(got[a], want[b], rtol=1e-6)
    np.testing.assert_allclose(np.asarray(st.tiers.loaded), want["loaded"])
    np.testing.assert_allclose(np.asarray(st.tiers.offloaded), want["offloaded"])
    m = {k: np.asarray(v) for k, v in MODELS[admission].metrics(st, wl, p).items()}
    assert int(m["conservation_error"]) == 0 and not bool(m["overflow"])
    # every configured tier is used: the row tests what it claims
    if settings.get("cpu_gib"):
        assert want["tier"][:, 0].sum() > 0 and want["offloaded"][0] > 0
    if settings.get("shared_gib"):
        assert want["tier"][:, 1].sum() > 0 and want["offloaded"][1] > 0


def test_router_tier_weights_change_decisions():
    """llm-d's CPU-block weight and Dynamo's host/disk credits are what the tiered rows above matched: with
    them at 0 the routers see the GPU caches only, and route differently."""
    for policy, zero in (("llmd_precise", dict(llmd_cpu_weight=0.0)),
                         ("dynamo_kv", dict(dyn_host_weight=0.0, dyn_disk_weight=0.0))):
        wl = _workload()
        tiers = _tiers(dict(cpu_gib=0.5, shared_gib=1.0))
        runs = [R.records(R.run_single(MODELS["reserve"], jax.random.key(1), wl,
                                       R.make_params(policy, rate=20.0, kv_capacity=CAP, tiers=tiers, **kw)))
                for kw in ({}, zero)]
        assert (runs[0]["replica"] != runs[1]["replica"]).any(), policy


def test_empty_tiers_run_as_the_plain_model():
    """Tiers of capacity 0 move nothing: the same records as a model without tiers, request by request."""
    wl = _workload()
    plain = R.ReplicaModel(n_replicas=G, max_running=B, max_queue=Q, router_modules=("dynamo",))
    for policy in ("least_load", "dynamo_kv"):
        a = R.records(R.run_single(plain, jax.random.key(2), wl, R.make_params(policy, rate=20.0, kv_capacity=CAP)))
        st = R.run_single(MODELS["reserve"], jax.random.key(2), wl,
                          R.make_params(policy, rate=20.0, kv_capacity=CAP, tiers=_tiers({})))
        b = R.records(st)
        for k in a:
            np.testing.assert_array_equal(a[k], b[k], err_msg=f"{policy} {k}")
        assert float(np.sum(np.asarray(st.tiers.loaded))) == 0 and float(np.sum(np.asarray(st.tiers.offloaded))) == 0


def test_tier_sizes_are_rows_of_one_program_and_conserve_requests():
    wl = _workload()
    model = MODELS["reserve"]
    rows = [R.make_params(policy, rate=rate, kv_capacity=CAP, tiers=_tiers(settings))
            for policy, admission, rate, settings in ROWS if admission == "reserve"]
    before = sim.compile_count(model)
    res = sim.run_grid(model, jax.random.key(3), wl, sim.stack_params(rows), n_seeds=2, progress=False)
    assert sim.compile_count(model) - before <= 1
    res.check_conserved("tier grid")
    m = res.metrics
    assert (m["conservation_error"] == 0).all() and not m["overflow"].any()
    assert (m["hit_rate_all"] >= m["hit_rate"]).all() and (m["kv_loaded_gb"] > 0).all()
    np.testing.assert_allclose(m["hit_rate_all"], m["hit_rate"] + m["hit_rate_cpu"] + m["hit_rate_shared"], rtol=1e-5)


def test_replica_leaving_clears_its_cpu_tier():
    """Under an autoscaler (Dynamo's SLA planner here) a replica that drains and leaves comes back with an empty
    cache and CPU tier (the
    shared tier keeps its segments): the reference's rule, matched request by request."""
    from jaxroute.clusters.replicas import control as C
    from tests import reference_control as refc

    wl = _workload()
    model = R.ReplicaModel(n_replicas=G, max_running=B, max_queue=Q, router_modules=(), kv_tiers=True, control=True,
                           control_ticks=600, control_history=64, control_log=128)
    settings = dict(scaler="sla", capacity_rps=6.0, interval_s=3.0, provision_s=2.0)
    p = R.make_params("least_load", rate=20.0, kv_capacity=CAP, control=C.make(G, **settings),
                      tiers=_tiers(dict(cpu_gib=0.5, shared_gib=1.0)))
    st = R.run_single(model, jax.random.key(1), wl, p)
    full = {**C.DEFAULTS, "max_replicas": G, "initial": 1, "interval_s": C.INTERVAL_S["sla"], **settings}
    ctl = refc.Control(full, G, np.asarray(st.req.klass), np.asarray(st.req.tenant), C.TENANTS, B)
    tp = p.tiers
    want, violations = ref.simulate(st.req, G=G, cap=CAP, policy="least_load", cost=p.cost, B=B, Q=Q, control=ctl,
                                    tiers=dict(cpu_tokens=int(tp.cpu_tokens), cpu_s_per_token=np.float32(tp.cpu_s_per_token),
                                               shared_tokens=int(tp.shared_tokens),
                                               shared_s_per_token=np.float32(tp.shared_s_per_token),
                                               shared_latency_s=np.float32(tp.shared_latency_s)))
    assert violations == [] and ctl.downs > 0
    got = R.records(st)
    np.testing.assert_array_equal(got["replica"], want["replica"])
    np.testing.assert_array_equal(got["cpu_tier_tokens"], want["tier"][:, 0])
    np.testing.assert_allclose(got["finish_s"], want["finish"], rtol=1e-6)
    # the replicas that left hold nothing in their CPU tiers; the shared tier still holds segments
    off = np.asarray(st.ctl.status) == C.OFF
    cpu_tok = np.asarray(st.tiers.cpu.tokens)
    assert off.any() and (cpu_tok[off] == 0).all() and int(st.tiers.shared.tokens) > 0
    assert int(np.asarray(st.tiers.offloaded)[0]) > 0


@pytest.mark.parametrize("settings, message", [
    (dict(cpu_gb=1.0), "unknown tier setting 'cpu_gb'"),
    (dict(cpu_gib=-1.0), "cpu_gib must be a finite number >= 0"),
    (dict(shared_gbps=0.0), "shared_gbps must be > 0"),
    (dict(cpu_gib=float("nan")), "cpu_gib must be a finite number"),
])
def test_bad_tier_settings_are_one_line_errors(settings, message):
    with pytest.raises(JaxrouteError, match=message):
        _tiers(settings)


def test_tiers_need_a_tiered_model_and_a_fresh_view():
    wl = _workload()
    plain = R.ReplicaModel(n_replicas=G, max_running=B, max_queue=Q)
    with pytest.raises(JaxrouteError, match="kv_tiers=True"):
        plain.check_params(R.make_params("rr", kv_capacity=CAP, tiers=_tiers({})), wl)
    with pytest.raises(JaxrouteError, match="needs tier settings"):
        MODELS["reserve"].check_params(R.make_params("rr", kv_capacity=CAP), wl)
    stale = R.ReplicaModel(n_replicas=G, max_running=B, max_queue=Q, kv_tiers=True, stale_view=True)
    with pytest.raises(JaxrouteError, match="stale router view"):
        stale.check_params(R.make_params("rr", kv_capacity=CAP, stale_s=1.0, tiers=_tiers({})), wl)
