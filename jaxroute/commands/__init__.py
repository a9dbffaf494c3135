"""CLI subcommands, one module each (see jaxroute/cli.py)."""
