"""Reading a settings file (YAML, or JSON, which YAML reads too) into a mapping, with one-line errors."""

from __future__ import annotations

from pathlib import Path


def read_mapping(path: str | Path, what: str, expected: str) -> dict:
    """The mapping in file `path`: a missing file, bad YAML/JSON or a non-mapping is a one-line JaxrouteError
    naming `what` the file is and, for a non-mapping, what it was `expected` to hold."""
    import yaml

    from jaxroute.errors import JaxrouteError

    p = Path(path)
    if p.is_dir():
        raise JaxrouteError(f"{what} {p} is a folder; name the file")
    if not p.is_file():
        raise JaxrouteError(f"{what} not found: {p}")
    try:
        loaded = yaml.safe_load(p.read_text())
    except yaml.YAMLError as e:
        raise JaxrouteError(f"{p.name}: not valid YAML or JSON ({str(e).splitlines()[0]})") from None
    if not isinstance(loaded, dict):
        raise JaxrouteError(f"{p.name}: expected {expected}")
    return loaded
