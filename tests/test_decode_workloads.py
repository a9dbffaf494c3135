"""Decode workloads: target means, template structure, trace loading, bad input."""

import numpy as np
import pytest
from data_paths import AZURE_CONV, require

from jaxroute.errors import JaxrouteError
from jaxroute.workloads import decode


def test_clipped_lognormal_solver_hits_mean():
    mu = decode.solve_lognormal_mu(1052.0, 1.0, 1, 8192)
    assert decode.clipped_lognormal_mean(mu, 1.0, 1, 8192) == pytest.approx(1052.0, rel=1e-9)
    x = np.clip(np.random.default_rng(0).lognormal(mu, 1.0, 400_000), 1, 8192)
    assert x.mean() == pytest.approx(1052.0, rel=0.01)


@pytest.mark.parametrize("name,prompt,output", [("synthetic-azure24", 4652, 1052), ("synthetic-prod", 3197, 1185)])
def test_synthetic_means_and_heavy_tails(name, prompt, output):
    r = decode.make_decode_requests(name, 20000, seed=1)
    assert len(r) == 20000 and r.name == name
    assert r.prompt_tokens.mean() == pytest.approx(prompt, rel=0.05)
    assert r.output_tokens.mean() == pytest.approx(output, rel=0.06)
    assert r.prompt_tokens.min() >= 1 and r.output_tokens.min() >= 1
    # heavy tails: the P99 is several times the median
    assert np.percentile(r.output_tokens, 99) > 5 * np.median(r.output_tokens)
    assert np.all(np.diff(r.arrival_s) >= 0) and r.arrival_s[0] == 0


def test_same_seed_same_requests_and_time_scale():
    a = decode.make_decode_requests("synthetic-prod", 500, seed=3)
    b = decode.make_decode_requests("synthetic-prod", 500, seed=3, time_scale=0.5)
    np.testing.assert_array_equal(a.output_tokens, b.output_tokens)
    np.testing.assert_allclose(b.arrival_s, a.arrival_s * 0.5)
    c = decode.make_decode_requests("synthetic-prod", 500, seed=4)
    assert not np.array_equal(a.output_tokens, c.output_tokens)


def test_prod_templates_make_outputs_predictable():
    r = decode.make_decode_requests("synthetic-prod", 20000, seed=2)
    templ = r.key_id < decode.PROD_TEMPLATES
    assert 0.75 < templ.mean() < 0.85
    # one-off prompts never repeat their key
    assert len(np.unique(r.key_id[~templ])) == int((~templ).sum())
    # within a popular template the output spread is small compared with the global spread
    global_cv = r.output_tokens.std() / r.output_tokens.mean()
    for t in range(5):
        o = r.output_tokens[r.key_id == t]
        assert len(o) > 50
        assert o.std() / o.mean() < 0.2 < global_cv
    assert np.all(r.key_id[templ] >= 0)
    azure = decode.make_decode_requests("synthetic-azure24", 100, seed=0)
    assert np.all(azure.key_id == -1)


def test_azure_trace_workload(tmp_path):
    p = tmp_path / "t.csv"
    p.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n"
                 "2023-11-16 18:15:46.0000000,374,44\n"
                 "2023-11-16 18:15:48.0000000,396,109\n"
                 "2023-11-16 18:15:49.0000000,10,3\n")
    r = decode.make_decode_requests("azure-conv", 2, trace_path=p, time_scale=0.5)
    np.testing.assert_array_equal(r.prompt_tokens, [374, 396])
    np.testing.assert_array_equal(r.output_tokens, [44, 109])
    np.testing.assert_allclose(r.arrival_s, [0.0, 1.0])
    assert np.all(r.key_id == -1)
    with pytest.raises(JaxrouteError, match="only 3 requests"):
        decode.make_decode_requests("azure-conv", 4, trace_path=p)


def test_shared_azure_trace():
    r = decode.make_decode_requests("azure-conv", 1000, trace_path=require(AZURE_CONV))
    assert len(r) == 1000 and r.output_tokens.mean() > 10


def test_bad_inputs(tmp_path, monkeypatch):
    with pytest.raises(JaxrouteError, match="unknown decode workload"):
        decode.make_decode_requests("nope", 10)
    for bad in (0, -3, 2.5, True):
        with pytest.raises(JaxrouteError, match="positive integer"):
            decode.make_decode_requests("synthetic-prod", bad)
    for bad in (0.0, -1.0, float("nan"), float("inf")):
        with pytest.raises(JaxrouteError, match="time scale"):
            decode.make_decode_requests("synthetic-prod", 5, time_scale=bad)
    with pytest.raises(JaxrouteError, match="trace file not found"):
        decode.make_decode_requests("azure-code", 5, trace_path=tmp_path / "missing.csv")
    monkeypatch.chdir(tmp_path)  # the default ../shared/data path does not exist from here
    with pytest.raises(JaxrouteError, match="--trace"):
        decode.make_decode_requests("azure-conv", 5)
    bad = tmp_path / "bad.csv"
    bad.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.0,-4,3\n")
    with pytest.raises(JaxrouteError, match="negative"):
        decode.make_decode_requests("azure-conv", 1, trace_path=bad)
