"""The one exception type users see: a short, actionable message naming the problem."""


class JaxrouteError(ValueError):
    """Bad input or an impossible configuration. The CLI prints it as `error: ...` and exits 2."""


class OverflowError_(JaxrouteError):
    """A fixed capacity was exceeded in a run (the CLI refuses to print its table)."""
