"""`python -m jaxroute ...` is `jaxroute ...`."""

from jaxroute.cli import main

raise SystemExit(main())
