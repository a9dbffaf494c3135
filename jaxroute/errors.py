"""The one exception type users see: a short, actionable message naming the problem."""


class JaxrouteError(ValueError):
    """Bad input or an impossible configuration. The CLI prints it as `error: ...` and exits 2."""

