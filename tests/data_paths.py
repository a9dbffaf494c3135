"""Where the tests find the public traces: ../shared/data beside the repository, found from this file.

The traces are part of the project's test data: a missing file is a failure with a clear
message (not a skip), and tests pass whatever the current directory is.
"""

from __future__ import annotations

from pathlib import Path

import pytest

SHARED_DATA = Path(__file__).resolve().parents[2] / "shared" / "data"
AZURE_CONV = SHARED_DATA / "azure_llm_2023_conv.csv"
AZURE_CODE = SHARED_DATA / "azure_llm_2023_code.csv"
MOONCAKE = SHARED_DATA / "mooncake_synthetic_trace.jsonl"


def require(path: Path) -> Path:
    """`path` if it exists; otherwise fail the test naming the file and where it should be."""
    path = Path(path)
    if not path.exists():
        pytest.fail(f"test data {path.name} not found at {path}: the public traces live in ../shared/data "
                    f"beside the repository ({SHARED_DATA})", pytrace=False)
    return path
