"""Per-stage results: a metric over no requests is missing (NaN, "–"), not zero, and says how many seeds it is over."""

import math

import numpy as np

from jaxroute import report
from jaxroute.experiments import requests as req_lib
from jaxroute.metrics import Summary, summarize_present


def _table(arrival, finish):
    """[1 row, seeds, N] request records with TTFT 0.1 s and E2E = finish - arrival."""
    arrival, finish = (np.asarray(x, np.float64)[None] for x in (arrival, finish))
    e2e = finish - arrival
    ones = np.ones_like(arrival)
    return {"arrival_s": arrival, "finish_s": finish, "ttft_s": 0.1 * ones, "e2e_s": e2e, "tpot_s": 0.01 * ones,
            "output_tokens": 10 * ones, "prompt_tokens": 100 * ones, "cached_tokens": 50 * ones}


def test_a_stage_a_seed_got_no_request_is_missing_for_that_seed_not_zero():
    """--rate-stages 4:5,0.01:5,4:5: seed 0 gets a request in the quiet middle stage, seed 1 none (it recorded
    0.0 there, halving the stage's mean)."""
    stages = [(4.0, 5.0), (0.01, 5.0), (4.0, 5.0)]
    arrival = [[1.0, 6.0, 11.0], [1.0, 2.0, 11.0]]  # seed 1: nothing in [5, 10)
    finish = [[2.0, 8.0, 12.0], [2.0, 3.0, 12.0]]
    per = req_lib.stage_summaries(_table(arrival, finish), stages)[0]
    mid = per[1]["e2e_mean_s"]
    assert mid.mean == 2.0 and mid.seeds == 1 and math.isnan(mid.per_seed[1])
    assert per[1]["requests"].mean == 0.5 and per[1]["requests"].seeds == 2  # a count of none is a real 0
    assert per[0]["e2e_mean_s"].seeds == 2 and "seeds" not in per[0]["e2e_mean_s"].as_json()
    doc = mid.as_json()
    assert doc["seeds"] == 1 and doc["per_seed"] == [2.0, None]
    assert report.fmt_ci(mid).endswith("(1/2 seeds)")
    # a stage no seed got a request in: no value at all
    none = req_lib.stage_summaries(_table([[1.0, 11.0], [2.0, 12.0]], [[2.0, 12.0], [3.0, 13.0]]), stages)[0][1]
    assert math.isnan(none["ttft_mean_s"].mean) and report.fmt_ci(none["ttft_mean_s"]) == "–"
    assert math.isnan(none["hit_rate"].mean)


def test_summarize_present_is_summarize_when_every_seed_has_a_value():
    v = np.array([1.0, 2.0, 4.0])
    s = summarize_present(v)
    assert isinstance(s, Summary) and s.mean == v.mean() and s.seeds == 3 and s.lo < s.mean < s.hi
