"""`python -m jaxroute ...` is `jaxroute ...`."""

from jaxroute.cli import main

if __name__ == "__main__":  # not when a worker process (multiprocessing's spawn) imports this module
    raise SystemExit(main())
