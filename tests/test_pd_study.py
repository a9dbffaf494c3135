"""scripts/pd_study.py --quick runs both workloads end to end (same code paths as the full study)."""

from pathlib import Path

import pytest

from tests.cli_helpers import load_script, run_quick


@pytest.mark.slow
def test_quick_study_runs_both_workloads(tmp_path, capsys):
    text, data = run_quick("pd_study", tmp_path / "pd.json", capsys)
    for heading in ("[mooncake, tight SLOs]", "[mooncake, loose SLOs]", "[shared-prefix, tight SLOs]",
                    "[shared-prefix, loose SLOs]"):
        assert heading in text
    assert text.count("claim 1 on") == 2 and "claim 2:" in text
    assert data["config"]["quick"] is True
    for name in ("mooncake", "shared-prefix"):
        w = data["workloads"][name]
        assert w["rows"] == 2 * 2 * 3 + 2  # 2 prefill routers x 2 decode routers x 3 ratios + 2 colocated
        for kind in ("tight", "loose"):
            s = w["slos"][kind]
            assert Path(s["plot"]).stat().st_size > 5000
            assert s["goodput_colocated"] > 0 and s["best_colocated"].startswith("colocated")
            assert len(s["records"]) == w["rows"]
        assert {r["params"]["prefill_router"] for r in w["routers_at_best"]} == {"llmd_precise", "random"}
    assert "[cache-aware DP, poisson]" in text and "[cache-aware DP, saturated]" in text
    sat = {r["policy"]: r["metrics"] for r in data["cache_aware"]["saturated"]["records"]}
    assert set(sat) == {"jsq", "br0", "br_cache", "cache"}
    assert all(0 <= m["hit_rate"]["mean"] <= 1 for m in sat.values())


def test_unknown_part_is_a_usage_error(capsys):
    with pytest.raises(SystemExit):
        load_script("pd_study").main(["--parts", "nope"])
    assert "unknown part" in capsys.readouterr().err
