"""What users see when something is wrong: one exception type (a short, actionable message naming the
problem) and warnings on stderr."""

import sys


class JaxrouteError(ValueError):
    """Bad input or an impossible configuration. The CLI prints it as `error: ...` and exits 2."""


class LostRequests(JaxrouteError):
    """A run lost or invented requests: arrived != completed + in flight + dropped by a full capacity. Always a
    simulator bug (a full capacity is an overflow, counted apart), so no flag silences it."""

    def __init__(self, what: str, rows: list, worst: int) -> None:
        self.what, self.rows, self.worst = what, rows, worst
        super().__init__(f"{what} lost or invented requests (conservation error up to {worst}) in rows "
                         f"{', '.join(map(str, rows))}: arrived != completed + in flight + dropped by a full "
                         "capacity. This is a simulator bug, not a capacity; please report it")


class Interrupted(KeyboardInterrupt):
    """Ctrl-C, with what was kept (e.g. "interrupted; 7 of 21 experiments saved, rerun to resume"). The CLI prints
    it in one line and exits 130."""


def warn(msg: str) -> None:
    """Print a warning on stderr (library code and commands alike)."""
    print(f"warning: {msg}", file=sys.stderr)
