"""Prefix workloads: documented parameters, per-seed draws, and the trace adapters."""

import json

import jax
import numpy as np
import pytest

from jaxroute.errors import JaxrouteError
from jaxroute.workloads import prefix as W
from jaxroute.workloads import traces


def _np(table):
    return jax.tree.map(np.asarray, table)


def test_zipf_top3_matches_design_facts():
    np.testing.assert_allclose(W.zipf_top_shares(300, 1.1, 3), [0.203, 0.095, 0.061], atol=1.5e-3)


def test_longdoc_parameters():
    wl = W.longdoc(3000)
    shared = np.asarray(wl.shared_len)
    assert shared[0] == 13 and len(shared) == 301
    assert abs(shared[1:].mean() - 21_000) / 21_000 < 0.05
    t = _np(wl.realize(jax.random.key(0), 1.0))
    prompt = t.seg_tok.sum(1)
    q_frac = t.seg_tok[:, 2] / prompt
    assert abs(q_frac.mean() - 0.09) < 0.01
    assert (t.out_tok == 45).all()
    assert (t.seg_ids[:, 0] == 0).all() and ((t.seg_ids[:, 1] >= 1) & (t.seg_ids[:, 1] <= 300)).all()
    assert len(np.unique(t.seg_ids[:, 2])) == len(t.seg_ids)  # questions are private
    assert (np.diff(t.arrival_s) >= 0).all()
    assert abs(np.diff(t.arrival_s).mean() - 1.0) < 0.08  # Poisson at 1 req/s
    top = np.bincount(t.seg_ids[:, 1], minlength=301)[1:4] / len(t.seg_ids)
    np.testing.assert_allclose(top, [0.203, 0.095, 0.061], atol=0.025)


def test_seeds_differ_and_repeat():
    wl = W.videoqa(200)
    a, b = _np(wl.realize(jax.random.key(0), 2.0)), _np(wl.realize(jax.random.key(1), 2.0))
    c = _np(wl.realize(jax.random.key(0), 2.0))
    assert not np.array_equal(a.seg_ids, b.seg_ids)
    np.testing.assert_array_equal(a.seg_ids, c.seg_ids)
    np.testing.assert_array_equal(a.arrival_s, c.arrival_s)


def test_hot_tool_share():
    t = _np(W.toolbench(4000, hot_tool_share=0.4).realize(jax.random.key(0), 10.0))
    assert abs((t.seg_ids[:, 1] == 1).mean() - 0.4) < 0.03
    with pytest.raises(JaxrouteError):
        W.toolbench(10, hot_tool_share=1.5)


def test_programming_parallel_samples_arrive_together():
    t = _np(W.programming(64, samples=8).realize(jax.random.key(0), 4.0))
    for k in range(0, 64, 8):
        assert len(set(t.arrival_s[k:k + 8])) == 1
        assert len(set(t.seg_ids[k:k + 8, 1])) == 1  # same problem
        assert len(set(t.seg_ids[k:k + 8, 2])) == 8  # private sample tags
    assert (t.out_tok == 190).all()


def test_agent_turns_extend_the_previous_prompt():
    wl = W.agent(60, n_envs=3, turns=3, think_s=100.0)  # sessions never overlap in time order here
    t = _np(wl.realize(jax.random.key(0), 0.01))
    dummy = len(t.seg_len) - 1
    later_turns = 0
    for i in range(len(t.seg_ids)):
        ids = t.seg_ids[i][t.seg_tok[i] > 0]
        assert t.out_seg[i] != dummy and t.seg_len[t.out_seg[i]] == t.out_tok[i]
        if len(ids) > 3:  # turn >= 2: prompt = the previous turn's prompt + its output + a new observation
            prev = np.nonzero(t.out_seg == ids[-2])[0]
            assert len(prev) == 1
            j = prev[0]
            np.testing.assert_array_equal(t.seg_ids[j][t.seg_tok[j] > 0], ids[:-2])
            assert t.arrival_s[j] < t.arrival_s[i]
            later_turns += 1
    assert later_turns > 0


def _write_jsonl(path, rows):
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    return path


def test_mooncake_adapter(tmp_path):
    rows = [{"timestamp": 0, "input_length": 1100, "output_length": 5, "hash_ids": [1, 2, 3]},
            {"timestamp": 500, "input_length": 1024, "output_length": 7, "hash_ids": [1, 2]},
            {"timestamp": 1000, "input_length": 600, "output_length": 3, "hash_ids": [9, 2]}]
    wl = W.from_mooncake(traces.load_mooncake_jsonl(_write_jsonl(tmp_path / "m.jsonl", rows)))
    t = _np(wl.table)
    np.testing.assert_array_equal(t.seg_tok[0], [512, 512, 76])
    np.testing.assert_array_equal(t.seg_tok[1, :2], [512, 512])
    assert t.seg_ids[0, 0] == t.seg_ids[1, 0] and t.seg_ids[0, 1] == t.seg_ids[1, 1]  # shared prefix
    assert t.seg_ids[2, 1] != t.seg_ids[0, 1]  # same hash id under another parent is another node
    np.testing.assert_allclose(t.arrival_s, [0.0, 0.5, 1.0])
    assert wl.n_segments == 5
    scaled = _np(wl.realize(jax.random.key(0), 4.0))  # recorded rate 2 req/s -> 4 req/s
    np.testing.assert_allclose(scaled.arrival_s, [0.0, 0.25, 0.5])
    bad = [{"timestamp": 0, "input_length": 2000, "output_length": 5, "hash_ids": [1, 2]}]
    with pytest.raises(JaxrouteError, match="hash_ids|does not match"):
        W.from_mooncake(traces.load_mooncake_jsonl(_write_jsonl(tmp_path / "b.jsonl", bad)))


def test_azure_adapter_has_no_sharing(tmp_path):
    p = tmp_path / "a.csv"
    p.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n0.0,100,10\n1.0,200,20\n2.5,100,5\n")
    wl = W.from_azure(traces.load_azure_csv(p))
    t = _np(wl.table)
    assert len(set(t.seg_ids[:, 0])) == 3
    np.testing.assert_array_equal(t.seg_tok[:, 0], [100, 200, 100])
    with pytest.raises(JaxrouteError):
        W.from_mooncake(traces.load_azure_csv(p))


def test_unknown_workload_and_empty():
    with pytest.raises(JaxrouteError, match="unknown prefix workload"):
        W.synthetic("chat", 10)
    with pytest.raises(JaxrouteError, match="at least 1"):
        W.synthetic("longdoc", 0)


def test_step_bound_uses_the_chunk():
    wl = W.toolbench(50)
    assert wl.step_bound(256) > wl.step_bound(512) > wl.step_bound(1 << 20)
    worst = max(W.request_steps(p, o, 512) for p, o in wl.request_shapes)
    assert wl.step_bound(512) == 50 * (1 + worst)
    assert W.request_steps(1025, 10, 512) == 3 + 9


def test_trace_step_bound_sums_per_request(tmp_path):
    p = tmp_path / "a.csv"
    p.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n0.0,100,10\n1.0,600,20\n2.5,100,5\n")
    wl = W.from_azure(traces.load_azure_csv(p))
    assert wl.step_bound(512) == 3 + (1 + 9) + (2 + 19) + (1 + 4)
    assert wl.step_bound(100) == 3 + (1 + 9) + (6 + 19) + (1 + 4)
    assert wl.max_request_tokens() == 620


# --------------------------------------------------------------------------- shared-prefix (inference-perf)


def test_shared_prefix_defaults_are_inference_perfs():
    assert W.SP_DEFAULTS == {"groups": 10, "prompts_per_group": 10, "system_tokens": 100, "question_tokens": 50,
                             "output_tokens": 50}
    wl = W.synthetic("shared-prefix", 250)
    assert wl.name == "shared-prefix" and "shared-prefix" in W.PREFIX_WORKLOADS
    np.testing.assert_array_equal(np.asarray(wl.shared_len), [100] * 10 + [50] * 100)
    t = _np(wl.realize(jax.random.key(0), 2.0))
    dummy = len(t.seg_len) - 1
    assert (t.seg_tok == [100, 50]).all() and (t.out_tok == 50).all() and (t.out_seg == dummy).all()
    assert (t.seg_ids[:, 0] < 10).all()
    # the question of prompt slot (g, p) is id 10 + 10 g + p: it always follows its group's system prompt
    np.testing.assert_array_equal((t.seg_ids[:, 1] - 10) // 10, t.seg_ids[:, 0])
    # one cycle sends each of the 100 prompts once (a shuffle), and the next cycle repeats it in order
    assert sorted(t.seg_ids[:100, 1]) == list(range(10, 110))
    np.testing.assert_array_equal(t.seg_ids[100:200], t.seg_ids[:100])
    np.testing.assert_array_equal(t.seg_ids[200:], t.seg_ids[:50])
    np.testing.assert_array_equal(t.session, np.arange(250))
    other = _np(wl.realize(jax.random.key(1), 2.0))
    assert not np.array_equal(other.seg_ids[:100], t.seg_ids[:100])  # the shuffle is per seed


def test_shared_prefix_settings_and_private_questions():
    wl = W.shared_prefix(60, groups=3, prompts_per_group=4, system_tokens=7, question_tokens=5, output_tokens=2)
    t = _np(wl.realize(jax.random.key(0), 1.0))
    assert (t.seg_tok == [7, 5]).all() and (t.out_tok == 2).all()
    assert np.bincount(t.seg_ids[:12, 0], minlength=3).tolist() == [4, 4, 4]
    assert wl.max_request_tokens() == 14
    fresh = _np(W.shared_prefix(60, groups=3, prompts_per_group=4, private_questions=True).realize(jax.random.key(0), 1.0))
    assert len(set(fresh.seg_ids[:, 1])) == 60  # no question recurs
    with pytest.raises(JaxrouteError, match="groups must be a positive integer"):
        W.shared_prefix(10, groups=0)


# --------------------------------------------------------------------------- staged Poisson load


STAGES = [(5.0, 20.0), (20.0, 20.0), (10.0, 20.0)]  # 100, 400 and 200 expected arrivals


def _stage_counts(arrivals, stages):
    edges = np.concatenate([[0.0], np.cumsum([d for _, d in stages])])
    # the first unit is put at t = 0 (as without stages); count the Poisson points after it
    return np.stack([((arrivals > lo) & (arrivals < hi)).sum(-1) for lo, hi in zip(edges[:-1], edges[1:], strict=True)], -1)


def test_rate_stages_give_poisson_counts_per_stage():
    # 1700 requests: every seed covers the three stages (700 expected) even at twice the rate
    wl = W.with_rate_stages(W.videoqa(1700, n_videos=3), STAGES)
    assert wl.stage_mean_rate == pytest.approx(700 / 60) and wl.stage_requests == 700
    seeds = 64
    keys = jax.random.split(jax.random.key(7), seeds)
    arrivals = jax.jit(jax.vmap(lambda k, r: wl.realize(k, r).arrival_s, in_axes=(0, None)))
    arr = np.asarray(arrivals(keys, wl.stage_mean_rate))
    counts = _stage_counts(arr, STAGES)
    want = np.array([r * d for r, d in STAGES])
    # Poisson: mean rate x seconds, variance the same; the mean over seeds within 4 standard errors
    assert (np.abs(counts.mean(0) - want) < 4 * np.sqrt(want / seeds)).all(), counts.mean(0)
    assert (0.5 < counts.var(0, ddof=1) / want).all() and (counts.var(0, ddof=1) / want < 1.8).all()
    # past the last stage its rate (10/s) continues
    tail = ((arr > 60.0) & (arr < 70.0)).sum(1)
    assert abs(tail.mean() - 100) < 4 * np.sqrt(100 / seeds)
    # the rate argument scales every stage's rate (durations stay): twice the reference rate, twice the counts
    c2 = _stage_counts(np.asarray(arrivals(keys, 2 * wl.stage_mean_rate)), STAGES)
    assert (np.abs(c2.mean(0) - 2 * want) < 4 * np.sqrt(2 * want / seeds)).all(), c2.mean(0)


def test_no_stages_is_the_homogeneous_process_and_stages_validate():
    base = W.videoqa(300)
    one = W.with_rate_stages(base, [(3.0, 1000.0)])
    a = _np(base.realize(jax.random.key(2), 3.0)).arrival_s
    b = _np(one.realize(jax.random.key(2), one.stage_mean_rate)).arrival_s
    np.testing.assert_allclose(a, b, rtol=1e-6)
    for bad in ([], [(0.0, 10.0)], [(1.0, -1.0)], [(float("inf"), 1.0)]):
        with pytest.raises(JaxrouteError, match="stage"):
            W.with_rate_stages(base, bad)


def test_shared_prefix_cycle_restarts_at_each_stage():
    wl = W.with_rate_stages(W.shared_prefix(200), [(10.0, 5.0), (10.0, 5.0)])
    t = _np(wl.realize(jax.random.key(3), wl.stage_mean_rate))
    second = int(np.argmax(t.arrival_s >= 5.0))  # inference-perf calls get_data() anew per stage
    assert 20 < second < 80
    np.testing.assert_array_equal(t.seg_ids[second:second + 20], t.seg_ids[:20])


def test_trace_arrivals_warp_to_load_stages(tmp_path):
    """A trace's arrivals follow the stages' rates (time-warped; the recorded gaps scale with the stage), in
    order, and replay as warped at `stage_mean_rate`; a bad stage gets one line."""
    p = tmp_path / "a.csv"
    times = np.cumsum(np.random.default_rng(0).exponential(0.5, 600))  # 2 req/s as recorded
    p.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n" + "".join(f"{t:.6f},100,10\n" for t in times))
    wl = W.from_azure(traces.load_azure_csv(p))
    stages = [(10.0, 20.0), (40.0, 5.0), (10.0, 10.0)]
    warped = W.with_rate_stages(wl, stages)
    assert warped.stage_mean_rate == pytest.approx((200 + 200 + 100) / 35)
    t = _np(warped.realize(jax.random.key(0), warped.stage_mean_rate)).arrival_s
    assert (np.diff(t) >= 0).all() and t[0] == 0
    counts = [np.sum((t >= a) & (t < b)) for a, b in ((0, 20), (20, 25), (25, 35))]
    assert abs(counts[0] - 200) < 40 and abs(counts[1] - 200) < 40 and abs(counts[2] - 100) < 30
    # past the stages the last rate continues: 600 requests need (600 - 500) / 10 s more
    assert t[-1] == pytest.approx(35 + (600 - 500) / 10, rel=0.1)
    with pytest.raises(JaxrouteError, match="a load stage needs a rate > 0"):
        W.with_rate_stages(wl, [(1.0, 0.0)])
