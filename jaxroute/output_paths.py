"""Output paths checked before a run starts, so a bad one costs a second, not a whole simulation. No JAX."""

from __future__ import annotations

import os
from pathlib import Path

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
        if not parent.is_dir() or not os.access(parent, os.W_OK | os.X_OK):
            raise JaxrouteError(f"output {p}: cannot write in {parent}")
        if p.exists() and not os.access(p, os.W_OK):
            raise JaxrouteError(f"output {p}: the file is not writable")
