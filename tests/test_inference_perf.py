"""inference-perf configs read as they are (`jaxroute.workloads.inference_perf`): the mapping and the refusals;
multi-turn chat, the load timers, the client's cap and timeouts against plain re-derivations of inference-perf's
rules (7de5ef2, cited per test); every measured run's config in ../shared/data reads."""

import json
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import yaml

from jaxroute.errors import JaxrouteError
from jaxroute.experiments.requests import stage_of
from jaxroute.workloads import inference_perf as ip
from jaxroute.workloads import timed_stages as ts
from tests.data_paths import SHARED_DATA, require

STAGES = {"type": "constant", "stages": [{"rate": 2, "duration": 10}, {"rate": 6.5, "duration": 4}]}


def test_shared_prefix_config_maps_to_the_shared_prefix_workload_and_its_stages():
    cfg = {"load": dict(STAGES, num_workers=2, worker_max_concurrency=5), "api": {"type": "completion"},
           "server": {"type": "vllm"},
           "data": {"type": "shared_prefix", "shared_prefix": {"num_unique_system_prompts": 3,
                                                                "num_users_per_system_prompt": 4,
                                                                "system_prompt_len": 200, "question_len": 40,
                                                                "output_len": 30}}}
    load = ip.load(cfg)
    assert load.stages == ((2.0, 10.0), (6.5, 4.0)) and load.stage_requests == (20, 26) and load.requests == 46
    assert load.concurrency_cap == 10 and load.load_type == "constant"
    assert load.flags() == {"workload": "shared-prefix", "rate_stages": [(2.0, 10.0), (6.5, 4.0)], "requests": 46,
                            "sp_groups": 3, "sp_prompts_per_group": 4, "sp_system_len": 200, "sp_question_len": 40,
                            "sp_output_len": 30}
    assert any("drain" in n for n in load.notes)
    wl = ip.workload(load)
    assert wl.n_requests == 46 and wl.rate_stages == ((2.0, 10.0), (6.5, 4.0))
    # the legacy names of inference-perf's fields are read too (config/datagen/config.py AliasChoices)
    legacy = ip.load({"load": STAGES, "data": {"type": "shared_prefix", "shared_prefix": {"num_groups": 3,
                                                                                      "num_prompts_per_group": 4}}})
    assert legacy.shared_prefix["groups"] == 3 and legacy.shared_prefix["prompts_per_group"] == 4


def test_length_distributions_are_sampled_in_inference_perfs_order():
    dist = {"type": "normal", "min": 10, "max": 100, "mean": 50, "std_dev": 20}
    cfg = {"load": STAGES, "data": {"type": "shared_prefix", "shared_prefix": {
        "num_groups": 2, "num_prompts_per_group": 3, "system_prompt_len": 100, "question_len": dist,
        "output_len": {"type": "uniform", "min": 5, "max": 9}, "seed": 7}}}
    sp = ip.load(cfg).shared_prefix
    # shared_prefix_datagen.py lines 100-114: system lengths, then per group its questions and its outputs
    rng = np.random.default_rng(7)
    q, o = [], []
    for _ in range(2):
        q.append(np.clip(np.round(np.clip(rng.normal(50, 20, 3), 10, 100)), 10, 100))
        o.append(np.clip(np.round(np.clip(rng.uniform(5, 10, 3), 5, 9)), 5, 9))
    assert np.array_equal(sp["question_tokens"], np.concatenate(q)) and np.array_equal(sp["output_tokens"], np.concatenate(o))
    assert np.array_equal(sp["system_tokens"], [100, 100])
    assert ip.load(cfg).flags()["sp_question_len"] is None  # not one number: no flag form
    wl = ip.workload(ip.load(cfg))
    assert sorted({int(t) for s in wl.request_shapes for t in [s[1]]}) == sorted(set(np.concatenate(o).tolist()))


def test_random_data_gives_private_prompts_with_generated_lengths():
    cfg = {"load": {"stages": [{"rate": 1, "duration": 5}]},
           "data": {"type": "random", "input_distribution": {"min": 20, "max": 80, "mean": 50, "std_dev": 10,
                                                             "total_count": 8},
                    "output_distribution": {"type": "fixed", "mean": 12, "total_count": 8}}}
    load = ip.load(cfg, seed=3)
    assert load.shared_prefix is None and len(load.prompt_tokens) == 8 and set(load.output_tokens) == {12}
    assert load.prompt_tokens.min() >= 20 and load.prompt_tokens.max() <= 80
    wl = ip.workload(load)
    assert wl.n_shared == 0 and wl.n_requests == 5  # nothing shared: every prompt private


@pytest.mark.parametrize("config, message", [
    ({"load": STAGES, "data": {"type": "shareGPT"}}, "data.type 'shareGPT' is not modelled"),
    ({"load": {"type": "concurrent", "stages": [{"num_requests": 5, "concurrency_level": 2}]},
      "data": {"type": "shared_prefix"}}, "load.stages.0.rate"),
    ({"load": {"type": "trace_replay", "stages": [{"rate": 1, "duration": 2}]}, "data": {"type": "shared_prefix"}},
     "load.type 'trace_replay' is not modelled"),
    ({"load": {"stages": [], "sweep": {"type": "linear"}}, "data": {"type": "shared_prefix"}}, "load.sweep"),
    ({"load": {"stages": []}, "data": {"type": "shared_prefix"}}, "load.stages is empty"),
    ({"load": {"stages": [{"rate": 0, "duration": 5}]}, "data": {"type": "shared_prefix"}},
     "load.stages.0.rate: Input should be greater than 0"),
    ({"load": {"stages": [{"rate": 0.1, "duration": 5}]}, "data": {"type": "shared_prefix"}}, "sends int(rate x duration) = 0"),
    ({"load": {"stages": [{"rate": float("inf"), "duration": 10}]}, "data": {"type": "shared_prefix"}},
     "load.stages.0.rate: Input should be a finite number"),
    ({"load": {"stages": [{"rate": 1e6, "duration": 1000000}]}, "data": {"type": "shared_prefix"}},
     "load.stages send 1,000,000,000,000 requests; a run holds at most 2,147,483,647"),
    ({"load": STAGES, "data": {"type": "shared_prefix", "shared_prefix": {"question_len": -3}}},
     "question_len must be >= 1 token, got -3"),
    ({"load": STAGES, "data": {"type": "shared_prefix", "shared_prefix": {"num_groups": "many"}}},
     "data.shared_prefix.num_groups: Input should be a valid integer"),
    ({"load": dict(STAGES, num_workers=-1), "data": {"type": "shared_prefix"}},
     "load.num_workers: Input should be greater than or equal to 0"),
    ({"load": STAGES, "data": {"type": "shared_prefix", "shared_prefix": {"groupz": 3}}}, "groupz: Extra inputs"),
    ({"load": dict(STAGES, lora_traffic_split=[{"name": "a", "split": 1.0}]), "data": {"type": "shared_prefix"}},
     "LoRA adapters are not modelled"),
    ({"load": STAGES, "data": {"type": "random"}}, "data.input_distribution with a total_count is required"),
    ({"load": STAGES, "data": {"type": "random", "input_distribution": {"total_count": 5},
                               "output_distribution": {"total_count": 5}}}, "a stage sends 26 requests but"),
    ({"load": STAGES, "data": {"type": "shared_prefix", "shared_prefix": {
        "question_len": {"min": 50, "max": 10}}}}, "min (50) is greater than max (10)"),
    ({"load": STAGES, "data": {"type": "shared_prefix"}, "loadgen": {}}, "loadgen: Extra inputs are not permitted"),
    ({"load": STAGES}, "no `data` section; the config says what it sends under `data`"),  # was "'mock' not modelled"
    ({"data": {"type": "shared_prefix"}}, "no `load` section"),
])
def test_what_it_cannot_model_is_refused_in_one_line(config, message):
    with pytest.raises(JaxrouteError) as e:
        ip.load(config)
    assert message in str(e.value) and "\n" not in str(e.value), str(e.value)


def test_bad_files_are_refused(tmp_path):
    with pytest.raises(JaxrouteError, match="not found"):
        ip.load(tmp_path / "missing.yml")
    with pytest.raises(JaxrouteError, match="inference-perf config .* is a folder; name the file"):
        ip.load(tmp_path)
    (tmp_path / "bad.yml").write_text("load: [unclosed\n")
    with pytest.raises(JaxrouteError, match="bad.yml: not valid YAML"):
        ip.load(tmp_path / "bad.yml")
    (tmp_path / "list.yml").write_text(yaml.safe_dump([1, 2]))
    with pytest.raises(JaxrouteError, match="expected a mapping"):
        ip.load(tmp_path / "list.yml")


# ----------------------------------------------------------------------------- multi-turn chat

MT = {"load": {"type": "constant", "stages": [{"rate": 3, "duration": 5}, {"rate": 2, "duration": 4}],
               "num_workers": 2, "worker_max_concurrency": 3},
      "data": {"type": "shared_prefix", "shared_prefix": {
          "num_groups": 2, "num_prompts_per_group": 3, "system_prompt_len": {"type": "uniform", "min": 20, "max": 40},
          "question_len": {"type": "uniform", "min": 3, "max": 9}, "output_len": {"type": "uniform", "min": 2, "max": 6},
          "seed": 5, "enable_multi_turn_chat": True}}}


def _realize(wl, key=0):
    t = jax.jit(wl.realize)(jax.random.key(key), jnp.float32(wl.stage_mean_rate))
    return {k: np.asarray(v) for k, v in vars(t).items() if v is not None}


def _reference_conversations(load, perm):
    """inference-perf's multi-turn rules, as token symbols: request i of a stage is round i // N of user slot
    i mod N (shared_prefix_datagen.py:174-182), slot u sends prompt perm[u] (the one shuffle, lines 290-296); its
    text is the system prompt + question (lines 265-268); the session starts empty (user_session.py:55-59), sends
    context + prompt (line 210) and keeps prompt + answer as the next context (lines 223, 113-114); sessions are
    cleared at each stage's end (load_generator.py:260)."""
    sp = load.shared_prefix
    G, ppg = sp["groups"], sp["prompts_per_group"]
    N = G * ppg
    text = {k: [("system", k // ppg)] * int(sp["system_tokens"][k // ppg]) + [("question", k)] * int(sp["question_tokens"][k])
            for k in range(N)}
    out = []
    for s, n in enumerate(load.stage_requests):
        context = {}
        for i in range(n):
            u, r, k = i % N, i // N, int(perm[i % N])
            prompt = context.get(u, []) + text[k]
            context[u] = prompt + [("answer", s, u, r)] * int(sp["output_tokens"][k])
            out.append({"stage": s, "slot": u, "round": r, "user": k, "prompt": prompt, "out": int(sp["output_tokens"][k])})
    return out


def _common(a, b):
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def test_multi_turn_chat_sends_each_users_growing_conversation_as_inference_perf_does():
    load = ip.load(MT)
    assert load.multi_turn and load.stage_requests == (15, 8) and load.flags()["workload"] is None
    wl = ip.workload(load)
    assert isinstance(wl, ts.TimedStagesWorkload) and wl.n_requests == 23
    t = _realize(wl)
    G, N = 2, 6
    # the send order: the first N requests of each stage are the N users once, the same permutation in every stage
    user = t["seg_ids"][:, 1] - G
    perm = user[:N]
    assert sorted(perm.tolist()) == list(range(N)) and np.array_equal(user[15:15 + N], perm)
    ref = _reference_conversations(load, perm)
    assert len(ref) == len(user) and [r["user"] for r in ref] == user.tolist()
    # request counts per stage, conversations per stage (sessions restart), rounds in order
    assert np.bincount(stage_of(t["arrival_s"], load.stages)).tolist() == [15, 8]
    assert t["session"].tolist() == [r["stage"] * N + r["slot"] for r in ref]
    # context growth: round k holds (k+1) x (system + question) + k x output tokens, its output as referenced
    assert t["prompt_tok"].tolist() == [len(r["prompt"]) for r in ref]
    assert t["out_tok"].tolist() == [r["out"] for r in ref]
    sp = load.shared_prefix
    for r, p in zip(ref, t["prompt_tok"], strict=True):
        k = r["user"]
        assert p == (r["round"] + 1) * (sp["system_tokens"][k // 3] + sp["question_tokens"][k]) + r["round"] * r["out"]
    # prefix sharing: the tokens two prompts share as a prefix are the leading segments they share, pair by pair
    for a in range(len(ref)):
        for b in range(len(ref)):
            same = np.cumprod(t["seg_ids"][a] == t["seg_ids"][b])
            shared = int(np.sum(np.where(same, np.minimum(t["seg_tok"][a], t["seg_tok"][b]), 0)))
            assert shared == _common(ref[a]["prompt"], ref[b]["prompt"]), (a, b)
    # the answer of round k is kept in the cache (out_seg) as the segment round k + 1 reads after round k's prompt
    for a in range(len(ref)):
        nxt = [b for b in range(len(ref)) if t["session"][b] == t["session"][a] and ref[b]["round"] == ref[a]["round"] + 1]
        if nxt:
            used = int(np.sum(t["seg_tok"][a] > 0))
            assert t["seg_ids"][nxt[0]][used] == t["out_seg"][a] and t["seg_len"][t["out_seg"][a]] == t["out_tok"][a]
            assert t["seg_depth"][t["out_seg"][a]] == used
    # the step bound and the largest request hold every realised request
    assert wl.max_request_tokens() >= int((t["prompt_tok"] + t["out_tok"]).max())
    lengths = wl.segment_lengths()
    assert len(lengths) == wl.n_segments and np.all(t["seg_len"][:-1] >= lengths)


def test_single_turn_timed_sends_cycle_the_shuffled_prompts_and_keep_no_answer():
    cfg = {"load": STAGES, "data": {"type": "shared_prefix", "shared_prefix": {"num_groups": 2, "num_prompts_per_group": 3}}}
    load = ip.load(cfg)
    assert type(ip.workload(load)).__name__ == "SyntheticPrefixWorkload"  # the default stays the Poisson process
    t = _realize(ip.workload(load, timer=True))
    q = t["seg_ids"][:, 1] - 2
    for first, n in ((0, 20), (20, 26)):  # each stage restarts the cycle (load_generator.py:777)
        assert all(sorted(q[first + j: first + j + 6].tolist()) == list(range(6)) for j in range(0, n - 5, 6))
        assert np.array_equal(q[first: first + n], np.resize(q[:6], n))  # prompt i mod N, one shuffle
    assert np.all(t["out_seg"] == t["seg_len"].shape[0] - 1) and set(t["prompt_tok"].tolist()) == {150}
    with pytest.raises(JaxrouteError, match="no Poisson-process form"):
        ip.workload(ip.load(MT), timer=False)


# ----------------------------------------------------------------------------- load timers


def _constant_by_hand(rng, rate, duration):
    """load_timer.py:48-65: int(rate x d) exponential(1 / rate) gaps, rescaled to sum to d, added one at a time."""
    gaps = rng.exponential(1 / rate, int(rate * duration))
    gaps = gaps * (duration / gaps.sum())
    t, out = 0.0, []
    for g in gaps:
        t += g
        out.append(t)
    return np.array(out)


def _poisson_by_hand(rng, rate, duration):
    """load_timer.py:78-97: a Poisson(rate) count per second; an empty second passes; a count c is spread over its
    second by a constant timer of rate c for 1 s; the stage takes the first int(rate x d) times."""
    n, t, out = int(rate * duration), 0.0, []
    while len(out) < n:
        c = rng.poisson(rate)
        if c < 1:
            t += 1.0
            continue
        gaps = rng.exponential(1 / c, c)
        for g in gaps * (1.0 / gaps.sum()):
            t += g
            out.append(t)
    return np.array(out[:n])


@pytest.mark.parametrize("load_type, by_hand", [("constant", _constant_by_hand), ("poisson", _poisson_by_hand)])
def test_stage_send_times_follow_the_timers(load_type, by_hand):
    for rate, duration in ((2.0, 10), (6.5, 4), (0.3, 7)):
        got = ip.stage_send_times(load_type, rate, duration, np.random.default_rng(11))
        want = by_hand(np.random.default_rng(11), rate, duration)
        assert len(got) == int(rate * duration) and np.array_equal(got, want)
        assert np.all(np.diff(got) > 0)
    const = ip.stage_send_times("constant", 3.0, 20, np.random.default_rng(1))
    assert const[-1] == pytest.approx(20.0, abs=1e-9) and const[0] > 0  # not evenly spaced; the last at the end
    assert np.std(np.diff(const)) > 0.3 * np.mean(np.diff(const))
    with pytest.raises(JaxrouteError, match="no timer here"):
        ip.stage_send_times("concurrent", 1.0, 5, np.random.default_rng(0))


def test_the_jax_timers_give_the_numpy_rule_on_the_same_draws():
    rng = np.random.default_rng(3)
    draws = rng.exponential(1.0, 40).astype(np.float32)
    got = np.asarray(ip.constant_offsets(jnp.asarray(draws), jnp.float32(10.0), jnp))
    np.testing.assert_allclose(got, np.cumsum(draws.astype(np.float64) / draws.astype(np.float64).sum() * 10), rtol=1e-5)
    counts = np.array([0, 3, 0, 0, 2, 4, 1])
    t, k, want = 0.0, 0, []
    for c in counts:  # by hand: each second's count spread over it with the next c draws
        if c == 0:
            t += 1.0
            continue
        g = draws[k: k + c].astype(np.float64)
        k += c
        for x in g / g.sum():
            t += x
            want.append(t)
    for xp in (np, jnp):
        got = np.asarray(ip.poisson_offsets(xp.asarray(counts), xp.asarray(draws), 7, 2.0, xp))
        np.testing.assert_allclose(got, want[:7], rtol=1e-5)
    # 10 sends drawn in 7 seconds: the 11th and 12th go on 1 / rate apart
    assert np.asarray(ip.poisson_offsets(counts, draws, 12, 2.0))[-2:].tolist() == pytest.approx([7.5, 8.0])


def test_realized_send_times_per_stage():
    seeds = 48
    for load_type in ("constant", "poisson"):
        cfg = {"load": {"type": load_type, "stages": [{"rate": 3, "duration": 6}, {"rate": 8, "duration": 3}]},
               "data": {"type": "random", "input_distribution": {"type": "fixed", "mean": 30, "total_count": 30},
                        "output_distribution": {"type": "fixed", "mean": 5, "total_count": 30}}}
        wl = ip.workload(ip.load(cfg), timer=True)
        times = np.asarray(jax.jit(jax.vmap(wl.send_times))(jax.random.split(jax.random.key(0), seeds)), np.float64)
        a, b = times[:, :18], times[:, 18:] - 6.0
        assert np.all(np.diff(a, axis=1) > 0) and np.all(np.diff(b, axis=1) > 0)
        if load_type == "constant":
            # all within their stage, the last at its end (one float32 step inside), the rest spread uniformly
            assert np.all(a > 0) and np.all(a[:, -1] < 6) and np.allclose(a[:, -1], 6, atol=1e-5)
            assert np.all(b > 0) and np.all(b[:, -1] < 3) and np.allclose(b[:, -1], 3, atol=1e-5)
            assert abs(np.mean(a[:, :-1]) / 6 - 0.5) < 0.05 and abs(np.mean(b[:, :-1]) / 3 - 0.5) < 0.05
        else:
            # each non-empty second ends with a send at its whole second; a stage takes about n / rate seconds
            whole = np.isclose(a, np.round(a), atol=1e-5) & (a > 0.5)
            assert np.all(whole.sum(axis=1) >= 1)
            assert abs(np.mean(np.ceil(a[:, -1] - 1e-5)) - 6.5) < 1.0
        t = _realize(wl)
        assert np.all(np.diff(t["arrival_s"]) >= 0) and t["arrival_s"].shape == (18 + 24,)


# ----------------------------------------------------------------------------- the client


def _held_by_hand(arrival, finish):
    """Requests held at each arrival, itself included, walking the events (a finish frees its slot first)."""
    events = sorted([(f, 0, i) for i, f in enumerate(finish)] + [(a, 1, i) for i, a in enumerate(arrival)])
    held, out = 0, {}
    for _, kind, i in events:
        held += 1 if kind else -1
        if kind:
            out[i] = held
    return np.array([out[i] for i in range(len(arrival))])


def test_the_client_cap_and_its_source():
    base = {"data": {"type": "shared_prefix", "shared_prefix": {"num_groups": 3}}}
    c = ip.load(dict(base, load=dict(STAGES, num_workers=2, worker_max_concurrency=5))).client
    assert c.cap == 10 and "num_workers 2 x worker_max_concurrency 5" in c.cap_source and "load_generator.py:131" in c.cap_source
    c = ip.load(dict(base, load=dict(STAGES, num_workers=2, worker_max_concurrency=5, worker_max_tcp_connections=3))).client
    assert c.cap == 6 and "worker_max_tcp_connections 3" in c.cap_source
    c = ip.load(dict(base, load=STAGES)).client
    assert c.cap is None and "CPU count" in c.cap_source
    c = ip.load(dict(base, load=dict(STAGES, num_workers=0))).client
    assert c.cap == 2500 and "single-process" in c.cap_source
    mt = dict(base, data={"type": "shared_prefix", "shared_prefix": {"num_groups": 3, "enable_multi_turn_chat": True}})
    c = ip.load(dict(mt, load=dict(STAGES, num_workers=2, worker_max_concurrency=4))).client
    assert c.cap == 8 and c.per_worker == 4 and c.worker_of(range(7)).tolist() == [0, 1, 0, 0, 1, 0, 0]
    c1 = ip.load(dict(mt, load=dict(STAGES, num_workers=8, worker_max_concurrency=4))).client
    assert c1.cap == 12 and "3 workers" in c1.cap_source  # only min(groups, workers) workers get requests
    # would the cap have held a request back? against the events walked by hand
    rng = np.random.default_rng(2)
    arrival = np.sort(rng.uniform(0, 10, 60))
    finish = arrival + rng.exponential(1.5, 60)
    finish[[5, 17]] = np.nan  # never finished: they hold their slot
    want = _held_by_hand(arrival, np.where(np.isnan(finish), np.inf, finish))
    assert np.array_equal(ip.in_flight_at_arrivals(arrival, finish), want)
    shared = ip.load(dict(base, load=dict(STAGES, num_workers=1, worker_max_concurrency=3))).client
    assert shared.over_cap(arrival, finish) == (int(np.sum(want > 3)), int(want.max()))
    per = np.zeros(60, np.int64)
    for w in (0, 1):
        on = c.worker_of(np.arange(60)) == w
        per[on] = _held_by_hand(arrival[on], np.where(np.isnan(finish), np.inf, finish)[on])
    assert c.over_cap(arrival, finish) == (int(np.sum(per > 4)), int(per.max()))
    # multi-turn: a round that arrives before its previous round's answer
    assert ip.turn_waits([0, 1, 2, 3], [5, 1.5, 2.5, 4], [7, 7, 9, 9]) == 1
    with pytest.raises(JaxrouteError, match="one length"):
        shared.over_cap([0, 1], [1])


# ----------------------------------------------------------------------------- request timeouts


def test_timeouts_bound_the_whole_request_as_aiohttp_and_the_report_count_them():
    base = {"data": {"type": "shared_prefix"}}
    assert ip.load(dict(base, load=STAGES)).client.request_timeout_s == 300  # aiohttp's default total
    assert ip.load(dict(base, load=dict(STAGES, request_timeout=0))).client.request_timeout_s == 300  # falsy
    assert ip.load(dict(base, load=dict(STAGES, request_timeout=12.5))).client.request_timeout_s == 12.5
    assert ip.load(dict(base, load=dict(STAGES, request_timeout=-1))).client.request_timeout_s == math.inf
    ttft = np.array([0.5, 2.0, 250.0, 0.1, np.nan, 301.0])
    e2e = np.array([1.0, 299.9, 300.0, 301.0, np.nan, np.nan])
    ok, failures = ip.apply_timeouts(ttft, e2e)  # whole request: the TTFT of 0.1 s does not save a 301 s request
    assert ok.tolist() == [True, True, False, False, False, False] and failures == 4
    # from 5 s up the deadline is rounded up to the loop clock's next whole second (aiohttp helpers.py:655-661)
    start = np.array([10.4, 10.4, 10.0])
    assert ip.request_deadlines(None, start).tolist() == pytest.approx([300.6, 300.6, 300.0])
    ok, failures = ip.apply_timeouts(np.zeros(3), np.array([300.5, 300.7, 300.0]), None, start)
    assert ok.tolist() == [True, False, False] and failures == 2
    assert ip.request_deadlines(3.0, start).tolist() == [3.0, 3.0, 3.0]  # below 5 s: not rounded
    assert ip.apply_timeouts(np.zeros(2), np.array([1e6, 2.0]), -1)[1] == 0  # no timeout at all
    grid = np.array([[[1.0, 40.0], [9.0, np.nan]]])  # [rows, seeds, requests], as experiments.requests gives them
    ok, failures = ip.apply_timeouts(np.zeros_like(grid), grid, 10.0)
    assert ok.tolist() == [[[True, False], [True, False]]] and failures == 2
    for bad, match in (((np.ones(2), np.ones(3)), "one shape"), ((np.array([2.0]), np.array([1.0])), "exceeds"),
                       ((np.ones(2), np.ones(2), None, np.ones(3)), "does not match")):
        with pytest.raises(JaxrouteError, match=match) as e:
            ip.apply_timeouts(*bad)
        assert "\n" not in str(e.value)


# ----------------------------------------------------------------------------- the measured runs' configs

RUNS = SHARED_DATA / "vllm-h100-inference-perf" / "runs"


def test_every_measured_runs_config_and_profile_read():
    runs = sorted(p for p in require(RUNS).iterdir() if p.is_dir())
    assert len(runs) == 16
    for run in runs:
        raw = yaml.safe_load(require(run / "results" / "config.yaml").read_text())
        written = ip.load(run / "results" / "config.yaml")  # as inference-perf wrote it: nulls and client keys
        ld = raw["load"]
        assert written.stage_requests == tuple(int(s["rate"] * s["duration"]) for s in ld["stages"])
        assert not written.multi_turn and written.load_type == "constant" and written.data_type == "shared_prefix"
        assert written.concurrency_cap == ld["num_workers"] * ld["worker_max_concurrency"] == written.client.cap
        assert written.client.request_timeout_s == 300
        profile = json.loads(require(run / "profile.yaml").read_text())  # one line of JSON
        sent = ip.load(run / "profile.yaml")
        sp = profile["data"]["shared_prefix"]
        assert sent.multi_turn and sent.shared_prefix["groups"] == sp["num_unique_system_prompts"]
        assert sent.shared_prefix["prompts_per_group"] == sp["num_users_per_system_prompt"]
        assert sent.concurrency_cap is None and any("multi-turn prompts grow" in n for n in sent.notes)
        # the measured failures are the default timeout's: each one's latency in [300, 301] s (the deadline rounded
        # up to the next whole second), and counted apart from the successes (reportgen/base.py:472-473, 711-719)
        for stage in sorted((run / "results").glob("stage_*_lifecycle_metrics.json")):
            m = json.loads(stage.read_text())
            assert m["successes"]["count"] + m["failures"]["count"] == m["load_summary"]["count"]
            if m["failures"]["count"]:
                lat = m["failures"]["request_latency"]
                assert 300.0 <= lat["min"] and lat["max"] <= 301.01 and 300.0 < lat["mean"] < 301.0
    # one profile's multi-turn workload, as sent: 44 users, 3,000 + 6,000 requests, 137 rounds at most
    wl = ip.workload(ip.load(runs[0] / "profile.yaml"))
    assert wl.n_requests == 9000 and wl.max_segments == 2 + 2 * (6000 // 44)


def test_a_config_as_inference_perf_7de5ef2_writes_it_reads():
    # reportgen/base.py:743-751: the whole model dumped (by alias), every field, nulls included
    dumped = {
        "api": {"type": "completion", "streaming": True, "headers": None},
        "data": {"type": "shared_prefix", "path": None, "corpus_file_path": None, "input_distribution": None,
                 "output_distribution": None, "shared_prefix": {
                     "num_unique_system_prompts": 4, "num_users_per_system_prompt": 2, "system_prompt_len": 100,
                     "question_len": {"min": 10, "max": 90, "mean": 50.0, "std_dev": 20.0, "total_count": None,
                                      "type": "normal", "variance": None, "skew": 0.0},
                     "output_len": 30, "seed": 3, "question_distribution": None, "output_distribution": None,
                     "enable_multi_turn_chat": True, "multimodal": None},
                 "multimodal": None, "trace": None, "otel_trace_replay": None, "weka_trace_replay": None,
                 "conversation_replay": None, "visionarena": None, "use_chat_template": False},
        "load": {"type": "poisson", "interval": 1.0,
                 "stages": [{"rate": 2.0, "duration": 5, "num_requests": None, "concurrency_level": None}],
                 "sweep": None, "num_workers": 16, "worker_max_concurrency": 100, "worker_max_tcp_connections": 2500,
                 "trace": None, "circuit_breakers": [], "request_timeout": 30.0, "lora_traffic_split": None,
                 "base_seed": 1739800000000},
        "metrics": None, "report": {"request_lifecycle": {"summary": True}},
        "storage": {"local_storage": {"path": "reports", "report_file_prefix": None}},
        "server": {"type": "vllm", "model_name": "m", "base_url": "http://x", "ignore_eos": True, "api_key": None},
        "tokenizer": {"pretrained_model_name_or_path": "m", "trust_remote_code": None, "token": None},
        "circuit_breakers": None,
    }
    load = ip.load(dumped)
    assert load.multi_turn and load.load_type == "poisson" and load.stage_requests == (10,)
    assert load.client.cap == 4 * 100 and load.client.request_timeout_s == 30.0  # 4 groups pin 4 of the 16 workers
    assert load.shared_prefix["groups"] == 4 and len(load.shared_prefix["question_tokens"]) == 8
