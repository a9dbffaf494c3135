"""Outputs are whole or absent (`output_paths.atomic`): an error or Ctrl-C while writing leaves the old file (or
none) and no temporary file behind; a finished write replaces the file at once and keeps the usual mode."""

import os
import stat

import pytest

from jaxroute import output_paths, report


def test_a_failed_write_leaves_the_old_file_and_no_temporary(tmp_path):
    path = tmp_path / "sub" / "r.json"
    output_paths.write_text(path, "old")
    for interrupt in (RuntimeError("disk full"), KeyboardInterrupt()):
        with pytest.raises(type(interrupt)):
            with output_paths.atomic(path) as f:
                f.write("half of the new")
                raise interrupt
        assert path.read_text() == "old" and os.listdir(path.parent) == ["r.json"]
    with pytest.raises(RuntimeError):
        with output_paths.atomic(tmp_path / "never.csv") as f:
            raise RuntimeError
    assert not (tmp_path / "never.csv").exists()


def test_a_finished_write_replaces_the_file_with_the_usual_mode(tmp_path):
    path = tmp_path / "r.json"
    report.write_json(path, {"a": 1})
    report.write_json(path, {"a": 2})
    assert path.read_text().replace(" ", "").replace("\n", "") == '{"a":2}'
    umask = os.umask(0)
    os.umask(umask)
    assert stat.S_IMODE(path.stat().st_mode) == 0o666 & ~umask and os.listdir(tmp_path) == ["r.json"]


def test_a_figure_is_written_whole_in_its_suffix_format(tmp_path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots()
    ax.plot([0, 1], [0, 1])
    png, svg = output_paths.save_figure(fig, tmp_path / "a.png"), output_paths.save_figure(fig, tmp_path / "a.svg")
    plt.close(fig)
    assert png.read_bytes()[:4] == b"\x89PNG" and b"<svg" in svg.read_bytes()[:400]
    assert sorted(os.listdir(tmp_path)) == ["a.png", "a.svg"]
