"""BurstGPT trace loader: relative times, lengths and the model column; the model filter; failed requests dropped
with a warning; every bad input a one-line error naming the problem; `load_trace` tells the CSVs apart by header;
and `jaxroute cluster --workload burstgpt` end to end."""

import json

import numpy as np
import pytest

from jaxroute.errors import JaxrouteError
from jaxroute.workloads.traces import load_burstgpt_csv, load_trace
from tests.cli_helpers import cli

HEADER = "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n"
# BurstGPT_1.csv's first rows (HPMLL/BurstGPT), then a failed request (0 response tokens) and a 0-token prompt
GOOD = HEADER + ("5,ChatGPT,472,18,490,Conversation log\n"
                 "45,ChatGPT,1087,230,1317,Conversation log\n"
                 "118,GPT-4,417,276,693,Conversation log\n")
FAILS = GOOD + ("1106,ChatGPT,0,0,0,Conversation log\n"
                "1200,GPT-4,0,5,5,API log\n"
                "1300,GPT-4,90,0,90,API log\n")


def _write(tmp_path, text, name="b.csv"):
    p = tmp_path / name
    p.write_text(text)
    return p


def test_loads_relative_times_lengths_and_models(tmp_path, capsys):
    t = load_burstgpt_csv(_write(tmp_path, GOOD))
    np.testing.assert_allclose(t.arrival_s, [0.0, 40.0, 113.0])
    assert t.prompt_tokens.tolist() == [472, 1087, 417] and t.output_tokens.tolist() == [18, 230, 276]
    assert t.prompt_tokens.dtype == np.int64 and t.block_ids is None
    assert t.model.tolist() == ["ChatGPT", "ChatGPT", "GPT-4"]
    assert t.head(2).model.tolist() == ["ChatGPT", "ChatGPT"] and len(t.head(2)) == 2
    assert capsys.readouterr().err == ""  # nothing dropped, nothing said
    # BurstGPT_3's extra columns are read past
    b3 = "Timestamp,Session ID,Elapsed time,Model,Request tokens,Response tokens,Total tokens,Log Type\n" \
         "0.5,s1,3.2,GPT-4,10,20,30,Conversation log\n2.0,,1.0,ChatGPT,5,6,11,API log\n"
    t3 = load_burstgpt_csv(_write(tmp_path, b3, "b3.csv"))
    np.testing.assert_allclose(t3.arrival_s, [0.0, 1.5])
    assert t3.model.tolist() == ["GPT-4", "ChatGPT"]


def test_model_filter(tmp_path):
    t = load_burstgpt_csv(_write(tmp_path, GOOD), model="GPT-4")
    assert t.model.tolist() == ["GPT-4"] and t.prompt_tokens.tolist() == [417]
    np.testing.assert_allclose(t.arrival_s, [0.0])  # relative to the first request kept
    chat = load_burstgpt_csv(_write(tmp_path, GOOD), model="ChatGPT")
    np.testing.assert_allclose(chat.arrival_s, [0.0, 40.0])


def test_failed_and_empty_requests_are_dropped_with_one_warning(tmp_path, capsys):
    t = load_burstgpt_csv(_write(tmp_path, FAILS))
    assert t.prompt_tokens.tolist() == [472, 1087, 417] and t.output_tokens.min() >= 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert "dropped 3 of its 6 requests: 2 failed (0 response tokens) and 1 with 0 request tokens" in err
    gpt4 = load_burstgpt_csv(_write(tmp_path, FAILS), model="GPT-4")
    assert gpt4.prompt_tokens.tolist() == [417]
    assert "dropped 2 of its 3 requests of model 'GPT-4'" in capsys.readouterr().err


@pytest.mark.parametrize("body, needle", [
    ("", "trace file is empty"),
    ("Timestamp,Model,Request tokens,Total tokens\n5,ChatGPT,3,4\n", "missing column(s) Response tokens"),
    (HEADER, "has a header but no requests"),
    (HEADER + "5,ChatGPT,,18,18,API log\n", "line 2: empty value in column(s) Request tokens"),
    (HEADER + "5,ChatGPT,nan,18,18,API log\n", "'Request tokens' is 'nan'; lengths must be finite"),
    (HEADER + "5,ChatGPT,3,-4,-1,API log\n", "'Response tokens' is negative (-4)"),
    (HEADER + "5,ChatGPT,3,abc,3,API log\n", "'Response tokens' is not a number: 'abc'"),
    (HEADER + "5,ChatGPT,3,2.5,5.5,API log\n", "lengths must be whole numbers >= 0"),
    (HEADER + "5,ChatGPT,3,4,7,API log\n4,ChatGPT,3,4,7,API log\n", "line 3: timestamps are not sorted"),
    (HEADER + "yesterday,ChatGPT,3,4,7,API log\n", "'Timestamp' is not a number: 'yesterday'"),
    (HEADER + "inf,ChatGPT,3,4,7,API log\n", "timestamp is not finite"),
    (HEADER + "5,ChatGPT,0,0,0,API log\n6,GPT-4,0,7,7,API log\n",
     "nothing is left of its 2 requests once the 1 failed (0 response tokens) and 1 with 0 request tokens"),
])
def test_bad_input_gets_one_line_naming_the_problem(tmp_path, body, needle):
    with pytest.raises(JaxrouteError) as e:
        load_burstgpt_csv(_write(tmp_path, body))
    assert needle in str(e.value) and "\n" not in str(e.value)


def test_bad_paths_and_unknown_model(tmp_path):
    with pytest.raises(JaxrouteError, match="not found"):
        load_burstgpt_csv(tmp_path / "nope.csv")
    with pytest.raises(JaxrouteError, match="is a folder; name a file"):
        load_burstgpt_csv(tmp_path)
    with pytest.raises(JaxrouteError) as e:
        load_burstgpt_csv(_write(tmp_path, GOOD), model="gpt-4")
    assert str(e.value) == "b.csv: no requests of model 'gpt-4'; the trace has: ChatGPT, GPT-4"
    with pytest.raises(JaxrouteError, match="nothing is left of its 1 requests of model 'GPT-4'"):
        load_burstgpt_csv(_write(tmp_path, HEADER + "5,ChatGPT,3,4,7,API log\n6,GPT-4,5,0,5,API log\n"), model="GPT-4")


def test_load_trace_tells_the_csvs_apart_by_header(tmp_path):
    burst = load_trace(_write(tmp_path, GOOD))
    assert burst.model is not None and burst.prompt_tokens.tolist() == [472, 1087, 417]
    azure = load_trace(_write(tmp_path, "TIMESTAMP,ContextTokens,GeneratedTokens\n"
                              "2023-11-16 18:15:46.5000000,374,44\n", "a.csv"))
    assert azure.model is None and azure.prompt_tokens.tolist() == [374]
    # a partial header goes to the format it belongs to, which names what is missing
    with pytest.raises(JaxrouteError, match="missing column.s. Model; a BurstGPT trace needs"):
        load_trace(_write(tmp_path, "Timestamp,Request tokens,Response tokens\n5,3,4\n", "p.csv"))
    with pytest.raises(JaxrouteError) as e:
        load_trace(_write(tmp_path, "time,input,output\n5,3,4\n", "x.csv"))
    msg = str(e.value)
    assert "neither an Azure trace's (TIMESTAMP,ContextTokens,GeneratedTokens)" in msg
    assert "nor a BurstGPT trace's (Timestamp,Model,Request tokens,Response tokens" in msg and "\n" not in msg
    with pytest.raises(JaxrouteError, match="empty"):
        load_trace(_write(tmp_path, "", "e.csv"))


def test_cluster_runs_burstgpt(tmp_path, capsys):
    rng = np.random.default_rng(0)
    rows = [f"{5 + 3 * i},{'GPT-4' if i % 3 == 0 else 'ChatGPT'},{rng.integers(20, 400)},{rng.integers(5, 60)},0,"
            "Conversation log\n" for i in range(24)]
    rows[4] = "17,ChatGPT,300,0,300,Conversation log\n"  # a failed request, dropped before the first 20 are taken
    trace, out = _write(tmp_path, HEADER + "".join(rows), "tiny.csv"), tmp_path / "r.json"
    assert cli(["cluster", "--workload", "burstgpt", "--trace", str(trace), "--replicas", "2", "--seeds", "2",
                "--requests", "20", "--policies", "rr,least_load", "--no-progress", "--out", str(out)]) == 0
    text, err = capsys.readouterr()
    assert "least_load" in text and "dropped 1 of its 24 requests: 1 failed" in err
    res = json.loads(out.read_text())
    assert res["config"]["requests"] == 20 and len(res["results"]) == 2
    assert res["results"][0]["metrics"]["hit_rate"]["mean"] == 0.0  # private prompts: no sharing
    assert cli(["cluster", "--workload", "burstgpt", "--trace", str(tmp_path / "none.csv"), "--requests", "5",
                "--seeds", "1"]) == 2
    assert "trace file not found" in capsys.readouterr().err
