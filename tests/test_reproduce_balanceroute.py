"""scripts/reproduce_balanceroute.py --quick runs every part end to end (same code paths as the paper-size run)."""

import pytest

from tests.cli_helpers import load_script, run_quick


def _load():
    return load_script("reproduce_balanceroute")


@pytest.mark.slow
def test_quick_reproduction_writes_every_part(tmp_path, capsys):
    out = tmp_path / "br.json"
    text, data = run_quick("reproduce_balanceroute", out, capsys)
    for heading in ("== ladder", "== main table, synthetic-prod", "== scaling", "== sensitivity"):
        assert heading in text
    assert data["quick"] is True
    steps = [s["step"] for s in data["ladder"]]
    assert len(steps) == 3 and steps[0].startswith("before") and "Little" in steps[-1]
    assert data["ladder"][0]["deployment"]["cap_immediate"] is True
    assert data["ladder"][1]["deployment"]["parallel"] == "dp_ep"
    main = data["main"]["synthetic-prod"]
    assert main["conservation_error"] == 0
    labels = {v["label"] for v in main["verdicts"]}
    assert {"jsq", "br0", "brh[oracle]", "brh[survival]", "brh[exact]"} <= labels
    assert 0.0 < main["kv_share"] < 1.0
    assert set(data["scaling"]) == {"4", "8"}
    assert len(data["sensitivity"]["gains_pct"]) == 2
    png = out.with_suffix(".imbalance.png")
    assert png.exists() and png.stat().st_size > 1000
    capsys.readouterr()
    assert _load().main(["--verdicts", str(out)]) == 0  # the verdicts again, from the JSON alone
    again = capsys.readouterr().out
    assert "verdict on the whole-run gain" in again and "brh[oracle]" in again


def test_unknown_part_is_a_usage_error(capsys):
    mod = _load()
    with pytest.raises(SystemExit):
        mod.main(["--only", "ladder,plots"])
    assert "unknown part(s) plots" in capsys.readouterr().err


def test_calibration_script_quick(tmp_path, capsys):
    text, data = run_quick("calibrate_decode_workloads", tmp_path / "cal.json", capsys)
    assert "synthetic-azure24" in text and "synthetic-prod" in text and "chosen" in text
    assert data
