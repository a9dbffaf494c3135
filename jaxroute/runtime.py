"""JAX set-up shared by every entry point (the CLI, reproductions, scripts, the test suite): one CPU device per
core and the persistent compilation cache. Jax-free until used: an option set before JAX is imported goes
through its environment variable.

Compiled programs are kept in JAX's persistent compilation cache, in `$XDG_CACHE_HOME/jaxroute/jax` (default
`~/.cache/jaxroute/jax`), so a second run of the same command skips XLA compilation. `--no-compile-cache` or
`JAXROUTE_NO_COMPILE_CACHE=1` turns it off; a `JAX_COMPILATION_CACHE_DIR` set by the user is respected.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

NO_CACHE_ENV = "JAXROUTE_NO_COMPILE_CACHE"
# Programs that compile faster than this are not written to the cache. Every program is: JAX's default (1 s)
# missed most of ours, and a command's small helper programs (20 of dispatch's 21) compiled again on every
# run cost more (1.4 s under load) than loading them from the cache does (scripts/time_to_first_step.py).
CACHE_MIN_COMPILE_S = 0.0


def set_jax_option(option: str, value) -> None:
    """Set a JAX config option: at once when jax is imported, else through its environment variable (JAX reads
    it at import), so a command that stops on a bad argument before it needs JAX never imports it."""
    if "jax" in sys.modules:
        sys.modules["jax"].config.update(option, value)
    else:
        os.environ[option.upper()] = str(value)


def use_all_cpu_cores() -> None:
    """Expose one JAX CPU device per core so the grid's batch axis is sharded across cores.

    Set JAXROUTE_CPU_DEVICES to override. Must run before JAX initialises its backends.
    """
    if "JAXROUTE_CPU_DEVICES" not in os.environ:
        chosen = (sys.modules["jax"].config.jax_num_cpu_devices if "jax" in sys.modules
                  else int(os.environ.get("JAX_NUM_CPU_DEVICES", -1)))
        if chosen != -1:
            return  # the caller (e.g. the test suite) already chose a device count
    n = int(os.environ.get("JAXROUTE_CPU_DEVICES", os.cpu_count() or 1))
    try:
        set_jax_option("jax_num_cpu_devices", max(1, n))
    except RuntimeError:  # backends already initialised (e.g. called from a test): keep them
        pass


def env_flag(name: str, environ=None) -> bool:
    """Whether the environment variable `name` is set to something other than empty, 0, false or no."""
    env = os.environ if environ is None else environ
    return env.get(name, "").strip().lower() not in ("", "0", "false", "no")


def compile_cache_dir(environ=None) -> Path | None:
    """Where the CLI keeps compiled programs, or None when the cache is turned off."""
    env = os.environ if environ is None else environ
    if env_flag(NO_CACHE_ENV, env):
        return None
    if env.get("JAX_COMPILATION_CACHE_DIR"):
        return Path(env["JAX_COMPILATION_CACHE_DIR"])
    base = env.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "jaxroute" / "jax"


def use_compile_cache(enabled: bool = True) -> Path | None:
    """Turn JAX's persistent compilation cache on (in `compile_cache_dir()`), or off (a folder set through JAX's own
    variable included, and with it the executable store); returns the folder used."""
    path = compile_cache_dir() if enabled else None
    if path is None:
        set_jax_option("jax_enable_compilation_cache", False)
        return None
    set_jax_option("jax_enable_compilation_cache", True)
    set_jax_option("jax_compilation_cache_dir", str(path))
    # a threshold set by the user (JAX's own variable) is respected, as the folder is
    min_s = float(os.environ.get("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", CACHE_MIN_COMPILE_S))
    set_jax_option("jax_persistent_cache_min_compile_time_secs", min_s)
    return path
