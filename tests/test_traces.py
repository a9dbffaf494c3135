"""Trace loaders: real files parse, and every kind of bad input gets a clear error naming the problem."""

import numpy as np
import pytest
from data_paths import AZURE_CONV, MOONCAKE, require

from jaxroute.errors import JaxrouteError
from jaxroute.workloads.traces import load_azure_csv, load_mooncake_jsonl, load_trace


def _write(tmp_path, name, text):
    p = tmp_path / name
    p.write_text(text)
    return p


def test_azure_csv_parses(tmp_path):
    p = _write(tmp_path, "a.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\n"
               "2023-11-16 18:15:46.5000000,374,44\n2023-11-16 18:15:48.0000000,396,109\n")
    t = load_azure_csv(p)
    np.testing.assert_allclose(t.arrival_s, [0.0, 1.5])
    assert t.prompt_tokens.tolist() == [374, 396] and t.output_tokens.tolist() == [44, 109]
    assert t.block_ids is None and len(t.head(1)) == 1


@pytest.mark.parametrize(
    "body, needle",
    [
        ("", "empty"),
        ("TIMESTAMP,ContextTokens\n2023-11-16 18:15:46.5,3\n", "missing column(s) GeneratedTokens"),
        ("TIMESTAMP,ContextTokens,GeneratedTokens\n", "no requests"),
        ("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.5,-3,4\n", "negative"),
        ("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.5,nan,4\n", "finite"),
        ("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.5,3,abc\n", "not a number"),
        ("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:47,3,4\n2023-11-16 18:15:46,3,4\n", "not sorted"),
        ("TIMESTAMP,ContextTokens,GeneratedTokens\nyesterday,3,4\n", "cannot parse timestamp"),
    ],
)
def test_azure_bad_input(tmp_path, body, needle):
    p = _write(tmp_path, "bad.csv", body)
    with pytest.raises(JaxrouteError, match=needle.replace("(", r"\(").replace(")", r"\)")):
        load_azure_csv(p)


def test_mooncake_parses_and_validates(tmp_path):
    good = '{"timestamp": 0, "input_length": 600, "output_length": 5, "hash_ids": [1, 2]}\n' \
           '{"timestamp": 1500, "input_length": 100, "output_length": 2, "hash_ids": [1]}\n'
    t = load_mooncake_jsonl(_write(tmp_path, "m.jsonl", good))
    np.testing.assert_allclose(t.arrival_s, [0.0, 1.5])
    assert [b.tolist() for b in t.block_ids] == [[1, 2], [1]]
    cases = {
        '{"timestamp": 0, "input_length": 600, "output_length": 5}\n': "missing key",
        '{"timestamp": 0, "input_length": 600, "output_length": 5, "hash_ids": [1]}\n': "expected 2",
        '{"timestamp": 0, "input_length": 600, "output_length": -5, "hash_ids": [1, 2]}\n': "negative",
        "not json\n": "not valid JSON",
        '{"timestamp": 5, "input_length": 1, "output_length": 1, "hash_ids": [1]}\n'
        '{"timestamp": 1, "input_length": 1, "output_length": 1, "hash_ids": [1]}\n': "not sorted",
        "\n": "no requests",
    }
    for body, needle in cases.items():
        with pytest.raises(JaxrouteError, match=needle):
            load_mooncake_jsonl(_write(tmp_path, "bad.jsonl", body))


def test_missing_file_and_unknown_format(tmp_path):
    with pytest.raises(JaxrouteError, match="not found"):
        load_trace(tmp_path / "nope.csv")
    with pytest.raises(JaxrouteError, match="unknown trace format"):
        load_trace(_write(tmp_path, "x.parquet", "x"))


def test_real_traces_load():
    conv = load_trace(require(AZURE_CONV))
    moon = load_trace(require(MOONCAKE))
    assert len(conv) > 10_000 and conv.prompt_tokens.min() >= 1
    assert len(moon) > 1_000 and moon.block_ids is not None


def test_azure_2024_timestamps_with_a_utc_offset(tmp_path):
    """The 2024 one-week traces (Azure/AzurePublicDataset, dataset-llm-2024): same columns, a UTC offset."""
    from jaxroute.errors import JaxrouteError
    from jaxroute.workloads.traces import load_azure_csv

    p = tmp_path / "AzureLLMInferenceTrace_conv_1week.csv"
    p.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n"
                 "2024-05-10 00:00:00.009930+00:00,100,10\n"
                 "2024-05-10 00:00:01.509930+00:00,200,20\n"
                 "2024-05-10 02:00:02.009930+02:00,300,30\n")  # 00:00:02.00993 UTC
    t = load_azure_csv(p)
    assert t.arrival_s.tolist() == pytest.approx([0.0, 1.5, 2.0]) and t.prompt_tokens.tolist() == [100, 200, 300]
    p.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n2024-05-10 00:00:00.00x930+00:00,100,10\n")
    with pytest.raises(JaxrouteError, match="cannot parse timestamp"):
        load_azure_csv(p)


def test_gzipped_traces_read_as_their_text_and_bad_bytes_get_one_line(tmp_path):
    """The public traces ship compressed: `.csv.gz` and `.jsonl.gz` read as the text inside; a truncated gzip or
    bytes that are not UTF-8 are one-line errors, not a UnicodeDecodeError."""
    import gzip

    csv_text = "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.5,374,44\n2023-11-16 18:15:48,396,109\n"
    plain = load_trace(_write(tmp_path, "conv.csv", csv_text))
    packed = tmp_path / "conv.csv.gz"
    packed.write_bytes(gzip.compress(csv_text.encode()))
    t = load_trace(packed)
    assert t.name == plain.name == "conv" and t.prompt_tokens.tolist() == plain.prompt_tokens.tolist()
    np.testing.assert_allclose(t.arrival_s, plain.arrival_s)
    line = '{"timestamp": 0, "input_length": 600, "output_length": 5, "hash_ids": [1, 2]}\n'
    (tmp_path / "m.jsonl.gz").write_bytes(gzip.compress(line.encode()))
    assert load_trace(tmp_path / "m.jsonl.gz").prompt_tokens.tolist() == [600]
    (tmp_path / "cut.csv.gz").write_bytes(gzip.compress(csv_text.encode())[:30])
    with pytest.raises(JaxrouteError, match="cut.csv.gz: not a whole gzip file") as e:
        load_trace(tmp_path / "cut.csv.gz")
    assert "\n" not in str(e.value)
    (tmp_path / "bin.csv").write_bytes(b"TIMESTAMP,ContextTokens,GeneratedTokens\n\xff\xfe,1,2\n")
    with pytest.raises(JaxrouteError, match="bin.csv: not a UTF-8 text file"):
        load_trace(tmp_path / "bin.csv")
