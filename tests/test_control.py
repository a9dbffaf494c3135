"""The control plane (clusters/replicas/control.py): autoscalers with provisioning delays and drains, and
gateway admission, matched request by request and event by event against the plain-Python reference
(tests/reference_control.py driven by tests/reference_replicas.py); conservation with shed requests; one
compiled program for every policy and threshold; one-line errors for bad settings."""

import jax
import numpy as np
import pytest

from jaxroute import sim
from jaxroute.clusters import replicas as R
from jaxroute.clusters.replicas import control as C
from jaxroute.errors import JaxrouteError
from jaxroute.workloads import prefix as W
from tests import reference_control as refc
from tests import reference_replicas as ref

G, B, Q, CAP = 4, 8, 128, 6000
_WL = {}


def _workload():
    if "wl" not in _WL:  # 160 requests over a cache-heavy toolbench: queues build at 1 replica, drain at 4
        _WL["wl"] = W.toolbench(160, n_tools=8, tool_mean=1500)
    return _WL["wl"]


MODEL = R.ReplicaModel(n_replicas=G, max_running=B, max_queue=Q, router_modules=("dynamo",), control=True,
                       control_ticks=600, control_history=64, control_log=128, gateway_queue=160)

# (router, rate, control settings): every scaler, metric and gate, drains with requests in flight, a
# scale-up during provisioning, KPA's panic, tenant budgets
ROWS = [
    ("least_load", 20.0, dict(scaler="hpa", metric="in_flight", target=4.0, interval_s=2.0, down_window_s=8.0,
                              provision_s=3.0)),
    ("rr", 20.0, dict(scaler="hpa", metric="waiting", target=2.0, interval_s=1.5, down_window_s=6.0, provision_s=2.5,
                      max_replicas=3)),
    ("affinity", 14.0, dict(scaler="hpa", metric="kv_usage", target=0.3, interval_s=2.0, down_window_s=4.0,
                            provision_s=1.0, initial=2)),
    ("least_tokens", 20.0, dict(scaler="hpa", metric="running", target=3.0, interval_s=1.0, down_window_s=3.0,
                                provision_s=4.0)),
    ("least_load", 20.0, dict(scaler="kpa", target=3.0, interval_s=1.0, stable_window_s=10.0, panic_window_s=2.0,
                              provision_s=2.0)),
    ("affinity", 18.0, dict(scaler="kpa", target=6.0, stable_window_s=8.0, panic_window_s=4.0, provision_s=5.0,
                            initial=2, min_replicas=2)),
    ("rr", 20.0, dict(scaler="sla", capacity_rps=6.0, interval_s=3.0, provision_s=2.0)),
    ("least_load", 30.0, dict(scaler="sla", capacity_rps=9.0, interval_s=2.0, provision_s=0.0, gate="token_bucket",
                              bucket_tokens=20000.0, bucket_refill=30000.0)),
    ("least_load", 25.0, dict(scaler="fixed", initial=2, gate="tier_shed", tier_threshold=6.0,
                              class_mix=(0.2, 0.4, 0.2, 0.1, 0.1))),
    ("affinity", 25.0, dict(scaler="hpa", target=4.0, interval_s=2.0, down_window_s=6.0, provision_s=3.0,
                            gate="saturation", qd_threshold=3.0, kv_threshold=0.5, class_mix=(0.0, 0.5, 0.5, 0.0, 0.0))),
    ("rr", 25.0, dict(scaler="fixed", initial=2, tenant_budget=0.3, class_mix=(0.0, 0.3, 0.7, 0.0, 0.0),
                      tenant_mix=(0.7, 0.2, 0.1))),
    # the flow-control gateway: requests wait by band and tenant while the pool is saturated
    ("least_load", 30.0, dict(scaler="fixed", initial=2, gate="flow_control", qd_threshold=2.0,
                              class_mix=(0.3, 0.3, 0.4, 0.0, 0.0), tenant_mix=(0.6, 0.4))),
    ("affinity", 30.0, dict(scaler="hpa", target=4.0, interval_s=2.0, down_window_s=6.0, provision_s=3.0,
                            gate="flow_control", fairness="round_robin", qd_threshold=3.0, kv_threshold=0.6,
                            class_mix=(0.0, 0.5, 0.5, 0.0, 0.0), tenant_mix=(0.5, 0.3, 0.2))),
]
SHEDDING = (7, 8, 9, 10)  # the rows whose gate or budget sheds


def _run(policy, rate, settings, key=1):
    wl = _workload()
    p = R.make_params(policy, rate=rate, kv_capacity=CAP, control=C.make(G, **settings))
    st = R.run_single(MODEL, jax.random.key(key), wl, p)
    return wl, p, st


def _reference(st, p, policy, settings):
    full = {**C.DEFAULTS, "max_replicas": G, "initial": settings.get("min_replicas", 1),
            "interval_s": C.INTERVAL_S[settings.get("scaler", "fixed")], **settings}
    ctl = refc.Control(full, G, np.asarray(st.req.klass), np.asarray(st.req.tenant), C.TENANTS, B)
    want, violations = ref.simulate(st.req, G=G, cap=CAP, policy=policy, cost=p.cost, B=B, Q=Q, control=ctl)
    assert violations == []
    return want, ctl


@pytest.mark.parametrize("row", range(len(ROWS)))
def test_control_plane_matches_reference(row):
    policy, rate, settings = ROWS[row]
    wl, p, st = _run(policy, rate, settings)
    want, ctl = _reference(st, p, policy, settings)
    got = R.records(st)
    np.testing.assert_array_equal(got["replica"], want["replica"])
    np.testing.assert_array_equal(got["cached_tokens"], want["cached"])
    for a, b in (("admit_s", "admit"), ("first_token_s", "first"), ("finish_s", "finish")):
        np.testing.assert_allclose(got[a], want[b], rtol=1e-6)
    m = {k: np.asarray(v) for k, v in MODEL.metrics(st, wl, p).items()}
    n = int(m["scale.log_n"])
    assert n == len(ctl.log)
    np.testing.assert_allclose(m["scale.log_t"][:n], [e[0] for e in ctl.log], rtol=1e-6)
    np.testing.assert_array_equal(m["scale.log_ready"][:n], [e[1] for e in ctl.log])
    np.testing.assert_array_equal(m["scale.log_billed"][:n], [e[2] for e in ctl.log])
    assert (int(m["scale_ups"]), int(m["scale_downs"]), int(m["shed"])) == (ctl.ups, ctl.downs, ctl.shed)
    np.testing.assert_allclose(m["replica_seconds"], ctl.replica_seconds(want["end"]), rtol=1e-5)
    np.testing.assert_allclose(m["mean_ready"] * float(want["end"]), want["ready_area"], rtol=1e-5)
    assert int(m["conservation_error"]) == 0 and not bool(m["overflow"])
    # the shed requests are exactly those never routed; the others all completed
    shed = got["replica"] < 0
    assert shed.sum() == ctl.shed and np.isfinite(got["finish_s"][~shed]).all()


def test_the_rows_exercise_what_they_claim():
    """Every autoscaler scales up and down, KPA panics, the gateways and budgets shed (in the reference)."""
    by = {}
    for policy, rate, settings in ROWS:
        _, p, st = _run(policy, rate, settings)
        _, ctl = _reference(st, p, policy, settings)
        u, d, pt, sh = by.get(settings.get("scaler", "fixed"), (0, 0, 0, 0))
        by[settings.get("scaler", "fixed")] = (u + ctl.ups, d + ctl.downs, pt + ctl.panic_ticks, sh + ctl.shed)
    assert all(by[s][0] > 0 and by[s][1] > 0 for s in ("hpa", "kpa", "sla")), by
    assert by["kpa"][2] > 0 and by["fixed"][3] > 0, by
    # the gateway held requests back (their dispatch came after their arrival) and dispatched by band
    for row in (11, 12):
        policy, rate, settings = ROWS[row]
        _, p, st = _run(policy, rate, settings)
        _, ctl = _reference(st, p, policy, settings)
        assert ctl.max_waiting > 5, (row, ctl.max_waiting)


def _grid_rows():
    return [R.make_params(policy, rate=rate, kv_capacity=CAP, control=C.make(G, **settings))
            for policy, rate, settings in ROWS]


def test_policies_and_thresholds_are_rows_of_one_program_and_conserve_requests():
    wl = _workload()
    before = sim.compile_count(MODEL)
    res = sim.run_grid(MODEL, jax.random.key(3), wl, sim.stack_params(_grid_rows()), n_seeds=2, progress=False)
    assert sim.compile_count(MODEL) - before <= 1
    res.check_conserved("control grid")
    m = res.metrics
    arrived = m["completed"] + m["shed"] + m["dropped"]
    assert (arrived == wl.n_requests).all() and (m["conservation_error"] == 0).all()
    sheds = np.isin(np.arange(len(ROWS)), SHEDDING)
    assert (m["shed"][sheds] > 0).all() and (m["shed"][~sheds] == 0).all()  # gates shed; the others never
    assert (m["replica_seconds"] > 0).all() and (m["mean_ready"] >= 1).all()
    # the grid holds a finished run (no autoscaler ticks after the last request): each row and seed is the
    # single run with its key
    keys = jax.random.split(jax.random.key(3), 2)
    for row in (0, 4, 6):
        policy, rate, settings = ROWS[row]
        p = R.make_params(policy, rate=rate, kv_capacity=CAP, control=C.make(G, **settings))
        one = MODEL.metrics(R.run_single(MODEL, keys[1], wl, p), wl, p)
        for k in ("end_s", "replica_seconds", "ttft_p90_s", "scale_downs"):
            np.testing.assert_allclose(m[k][row, 1], np.asarray(one[k]), rtol=1e-6, err_msg=k)


@pytest.mark.parametrize("kw, message", [
    (dict(scaler="vpa"), "unknown scaler 'vpa'"),
    (dict(metric="gpu"), "unknown metric 'gpu'"),
    (dict(gate="queue"), "unknown gate 'queue'"),
    (dict(min_replicas=3, max_replicas=2), "1 <= min (3) <= initial (3) <= max (2)"),
    (dict(max_replicas=9), "<= max (9) <= the model's replica slots (4)"),
    (dict(min_replicas=0), "1 <= min (0)"),
    (dict(min_replicas=1.5), "min_replicas must be a whole number"),
    (dict(interval_s=0.0), "interval_s must be a positive number"),
    (dict(target=float("nan")), "target must be a positive number"),
    (dict(provision_s=-1.0), "provision_s must be a number >= 0"),
    (dict(kv_threshold=1.5), "kv_threshold must be in (0, 1]"),
    (dict(tenant_budget=2.0), "tenant_budget must be in [0, 1]"),
    (dict(class_mix=(1.0, 0.0)), "class_mix needs 5 shares"),
    (dict(class_mix=(0.0,) * 5), "class_mix shares must be >= 0 with a positive sum"),
    (dict(tenant_mix=(1.0,) * 9), "tenant_mix needs 1 to 8 shares"),
    (dict(slo_ttft_s=0.0), "slo_ttft_s must be > 0"),
    (dict(panic_window="x"), "unknown control setting 'panic_window'"),
])
def test_bad_settings_get_one_line(kw, message):
    with pytest.raises(JaxrouteError) as e:
        C.make(G, **kw)
    assert message in str(e.value) and "\n" not in str(e.value)


def test_models_and_params_must_agree():
    wl = _workload()
    plain = R.ReplicaModel(n_replicas=G, max_running=B, max_queue=Q)
    with pytest.raises(JaxrouteError, match="need a model built with control=True"):
        plain.check_params(R.make_params("rr", kv_capacity=CAP, control=C.make(G)), wl)
    with pytest.raises(JaxrouteError, match="needs control settings"):
        MODEL.check_params(R.make_params("rr", kv_capacity=CAP), wl)
    with pytest.raises(JaxrouteError, match="router 'cache_guard' cannot run with an autoscaler"):
        MODEL.check_params(R.make_params("cache_guard", kv_capacity=CAP, control=C.make(G)), wl)
    with pytest.raises(JaxrouteError, match="n_active and an autoscaler"):
        MODEL.check_params(R.make_params("rr", kv_capacity=CAP, n_active=2, control=C.make(G)), wl)
    with pytest.raises(JaxrouteError, match="window of 300 ticks does not fit the autoscaler's history of 64"):
        MODEL.check_params(R.make_params("rr", kv_capacity=CAP, control=C.make(G, scaler="hpa", interval_s=1.0)), wl)


def _trace_csv(tmp_path, rows, extra_header=",slo_class,tenant_id"):
    p = tmp_path / "t.csv"
    p.write_text("TIMESTAMP,ContextTokens,GeneratedTokens" + extra_header + "\n" + "".join(r + "\n" for r in rows))
    return p


def test_trace_classes_and_tenants_reach_the_gateway(tmp_path):
    """A trace's slo_class / tenant_id columns replace the mixes' draws: tier shedding sheds its batch rows only."""
    from jaxroute.workloads import traces

    classes = ["critical", "batch", "standard", "Batch"] * 15
    rows = [f"{0.05 * i:.3f},{600 + 7 * i},20,{c},{'a' if i % 3 else 'b'}" for i, c in enumerate(classes)]
    trace = traces.load_azure_csv(_trace_csv(tmp_path, rows))
    assert trace.tenant_names == ("b", "a") and list(trace.slo_class[:4]) == [0, 2, 1, 2]
    wl = W.from_azure(trace)
    model = MODEL
    p = R.make_params("least_load", rate=0.0, kv_capacity=CAP,
                      control=C.make(G, scaler="fixed", min_replicas=2, max_replicas=2, gate="tier_shed", tier_threshold=2.0))
    st = R.run_single(model, jax.random.key(0), wl, p)
    np.testing.assert_array_equal(np.asarray(st.req.klass), trace.slo_class)
    np.testing.assert_array_equal(np.asarray(st.req.tenant), trace.tenant)
    shed = np.asarray(st.rec_replica) < 0
    assert shed.any() and not shed[trace.slo_class != 2].any()  # only batch (priority -1 < 3) is shed
    m = model.metrics(st, wl, p)
    assert int(m["conservation_error"]) == 0 and int(m["shed"]) == shed.sum()


@pytest.mark.parametrize("rows, header, message", [
    (["0,10,5,gold,a"], ",slo_class,tenant_id", "line 2: slo_class 'gold' is not one of critical, standard"),
    (["0,10,5,batch,"], ",slo_class,tenant_id", "line 2: empty value in column tenant_id"),
    ([f"{i},10,5,t{i}" for i in range(9)], ",tenant_id", "9 tenants in column tenant_id; the gateway tells at most 8"),
])
def test_bad_trace_classes_get_one_line(tmp_path, rows, header, message):
    from jaxroute.workloads import traces

    with pytest.raises(JaxrouteError) as e:
        traces.load_azure_csv(_trace_csv(tmp_path, rows, header))
    assert message in str(e.value) and "\n" not in str(e.value)


def test_mooncake_lines_must_all_or_none_carry_a_class(tmp_path):
    from jaxroute.workloads import traces

    p = tmp_path / "m.jsonl"
    p.write_text('{"timestamp": 0, "input_length": 10, "output_length": 5, "hash_ids": [1], "slo_class": "batch"}\n'
                 '{"timestamp": 5, "input_length": 10, "output_length": 5, "hash_ids": [1]}\n')
    with pytest.raises(JaxrouteError, match="m.jsonl line 2: missing key slo_class"):
        traces.load_mooncake_jsonl(p)


@pytest.mark.parametrize("policy", ["llmd_precise", "rr"])
def test_a_fixed_cluster_behind_no_gate_runs_as_the_plain_model(policy):
    """The control plane with nothing to do (every replica ready, no gate, spare slots off) changes nothing: the
    records equal the plain model's request by request (random ties included; times to float32 rounding)."""
    wl = _workload()
    plain = R.ReplicaModel(n_replicas=G - 1, max_running=B, max_queue=Q, router_modules=("dynamo",))
    p0 = R.make_params(policy, rate=20.0, kv_capacity=CAP)
    p1 = R.make_params(policy, rate=20.0, kv_capacity=CAP, control=C.make(G, min_replicas=G - 1, max_replicas=G - 1))
    a = R.records(R.run_single(plain, jax.random.key(2), wl, p0))
    b = R.records(R.run_single(MODEL, jax.random.key(2), wl, p1))
    for k in ("replica", "cached_tokens"):
        np.testing.assert_array_equal(a[k], b[k], err_msg=k)
    for k in ("admit_s", "first_token_s", "finish_s"):  # autoscaler ticks split leaps: float32 sums to an ulp
        np.testing.assert_allclose(a[k], b[k], rtol=1e-6, err_msg=k)
