"""What users see when something is wrong: one exception type (a short, actionable message naming the
problem) and warnings on stderr."""

import sys


class JaxrouteError(ValueError):
    """Bad input or an impossible configuration. The CLI prints it as `error: ...` and exits 2."""


def warn(msg: str) -> None:
    """Print a warning on stderr (library code and commands alike)."""
    print(f"warning: {msg}", file=sys.stderr)
