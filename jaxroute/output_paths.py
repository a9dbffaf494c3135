"""Output files: their paths checked before a run starts, so a bad one costs a second, not a whole simulation,
and every file written whole or not at all (`atomic`: a temporary file beside it, renamed over it). No JAX."""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import IO

from jaxroute.errors import JaxrouteError


def check(*paths: str | Path | None) -> None:
    """Refuse, in one line, an output path that names a directory or lies where nothing can be written (its
    nearest existing parent is not a writable directory). None entries are skipped."""
    for raw in paths:
        if raw is None:
            continue
        p = Path(raw)
        if p.is_dir():
            raise JaxrouteError(f"output {p} is a directory; name a file")
        parent = p.parent if str(p.parent) else Path(".")
        while not parent.exists() and parent != parent.parent:
            parent = parent.parent
        if not parent.is_dir() or not _writable_dir(parent):
            raise JaxrouteError(f"output {p}: cannot write in {parent}")
        if p.exists() and not _writable_file(p):
            raise JaxrouteError(f"output {p}: the file is not writable")


@contextlib.contextmanager
def atomic(path: str | Path, mode: str = "w", **open_kwargs) -> Iterator[IO]:
    """Open `path` for writing so that it appears whole or not at all: the writes go to a temporary file in the
    same folder (parents created), renamed over `path` when the block ends without an error, removed otherwise
    (an error, Ctrl-C). `mode` is "w" or "wb"."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".part", dir=path.parent)
    try:
        with os.fdopen(fd, mode, **open_kwargs) as f:
            yield f
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp's 0600 would make results private to their writer
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def write_text(path: str | Path, text: str) -> Path:
    """`path` holds `text`, written whole (`atomic`)."""
    with atomic(path) as f:
        f.write(text)
    return Path(path)


def save_figure(fig, path: str | Path, **savefig_kwargs) -> Path:
    """A matplotlib figure written whole (`atomic`), its format from the suffix."""
    path = Path(path)
    with atomic(path, "wb") as f:
        fig.savefig(f, format=path.suffix.lstrip(".").lower() or "png", **savefig_kwargs)
    return path


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _writable_dir(d: Path) -> bool:
    """Whether a file can be made in `d`: tried (os.access says yes to root even on /proc and read-only mounts)."""
    try:
        with tempfile.TemporaryFile(dir=d):
            return True
    except OSError:
        return False


def _writable_file(p: Path) -> bool:
    try:
        with p.open("ab"):  # opened for appending, nothing written: the file is unchanged
            return True
    except OSError:
        return False


# the file outputs a command line may name (argparse dests), and the image formats matplotlib writes
FILE_OUTPUTS = ("out", "plot", "requests_out", "save_spec", "cost_params_out", "params_out", "fit_plot")
PLOTS = ("plot", "fit_plot")
IMAGE_SUFFIXES = (".png", ".pdf", ".svg", ".svgz", ".eps", ".ps", ".jpg", ".jpeg", ".tif", ".tiff", ".webp", ".pgf")


def check_args(args) -> None:
    """Every output a parsed command line names, checked before the command runs (`spec.run_parsed`): a file
    output is `check`ed, a plot must have a suffix matplotlib writes; a command whose output is a folder lists
    its dest in `output_dirs` (set by its parser), checked as a folder."""
    folders = set(getattr(args, "output_dirs", ()))
    for dest in FILE_OUTPUTS:
        raw = getattr(args, dest, None)
        if raw is None or not isinstance(raw, str | os.PathLike):
            continue
        if dest in folders:
            p = Path(raw)
            if p.exists() and not p.is_dir():
                raise JaxrouteError(f"output folder {p} is a file; name a folder")
            check(p / "x")
            continue
        check(raw)
        if dest in PLOTS and Path(raw).suffix.lower() not in IMAGE_SUFFIXES:
            raise JaxrouteError(f"--{dest.replace('_', '-')} {raw}: matplotlib writes {', '.join(IMAGE_SUFFIXES)}; "
                                "name the file with one of them")
