"""scripts/pd_study.py (the P/D reproduction's wrapper): a quick run of one experiment, and a refusal."""

import json

import pytest

from tests.cli_helpers import resume_from
from tests.test_production_routers_cli import check_report, run_wrapper


@pytest.mark.slow
def test_wrapper_quick_cache_aware(tmp_path, monkeypatch, quick_report):
    resume_from(quick_report, tmp_path, ["production-routers.pd_cache_aware"])  # the suite's `reproduce all --quick` ran it; the wrapper resumes
    assert run_wrapper("pd_study", ["--quick", "--only", "pd_cache_aware", "--out", str(tmp_path), "--no-progress"],
                       monkeypatch) == 0
    check_report(tmp_path, "Cache-aware BalanceRoute on decode DP ranks with prefix caches")
    data = json.loads((tmp_path / "results.json").read_text())
    exp = data["experiments"]["production-routers.pd_cache_aware"]
    assert set(exp) == {"poisson", "saturated"}
    for arrival in exp.values():
        by = {r["policy"]: r["metrics"] for r in arrival["records"]}
        assert set(by) == {"jsq", "br0", "br_cache", "cache"}
        assert all(0 <= m["hit_rate"]["mean"] <= 1 and m["throughput_tok_s"]["mean"] > 0 for m in by.values())
    # the same requests on every policy: cache-only routing hits at least what load-only routing does
    po = {r["policy"]: r["metrics"] for r in exp["poisson"]["records"]}
    assert po["cache"]["hit_rate"]["mean"] >= po["jsq"]["hit_rate"]["mean"]
    claims = [r for r in data["results"] if r["policy"] == "production-routers.pd_cache_aware"]
    assert len(claims) == 3


def test_unknown_experiment_is_a_usage_error(monkeypatch, capsys):
    assert run_wrapper("pd_study", ["--only", "nope"], monkeypatch) == 2
    assert "unknown experiment(s) nope" in capsys.readouterr().err
