"""Routers: dispatch policies as pure functions (classic dispatch, prefix-aware replica routers, balance).

Replica-cluster routers (`prefix.py`) are built from parts, as real routers are (llm-d's scheduler
config, SGLang, Dynamo): filters (`[G]` masks), scorers (`[G]` scores), traced weights, and a picker
(`parts.py`). A named policy (preset) is registered in `prefix.PRESETS`; its position is the traced
policy id selected with `lax.switch`. Its name is also in `names.PREFIX_POLICIES` (same order; checked on
import), which the command line reads without importing JAX.

Adding a stateless router = one function + one registry entry (+ its name in `names.py`)::

    # routers/presets.py
    def shortest_prompt_queue(view, req, p, key):
        \"\"\"Fewest tokens in flight, ties -> fewest requests (source: ...).\"\"\"
        return parts.argmax(parts.fewest_tokens(view, req), tie=parts.fewest_requests(view, req))

    # routers/prefix.py, PRESETS (append: existing ids stay; defaults= sets its weights, picker, ...)
    "shortest_prompt_queue": Preset(presets.shortest_prompt_queue),
    # routers/names.py, PREFIX_POLICIES (appended likewise)
    ..., "shortest_prompt_queue",

Adding a stateful router = one module + one registry entry (+ its name in `names.py` and its reference in tests/). The module
owns its state and defines, with `view: RouterView`, `req: Request`, `g` the chosen replica and
`active` a traced bool (update only where true, so a vmapped step stays O(row))::

    # routers/recent.py: prefer the replica that served this prompt's first segment most recently
    @jax.tree_util.register_dataclass
    @dataclasses.dataclass(frozen=True)
    class Params:
        recent_s: jax.Array  # [] float32 how long a dispatch counts as recent

    def make_params(recent_s=10.0) -> Params:         # keywords reach it through make_params(**kw)
        return Params(jnp.float32(recent_s))

    def init(static: RouterStatic):                   # -> its state pytree (shapes from static)
        return jnp.full((static.n_replicas, static.n_segments), -jnp.inf)

    def choose(state, view, req, p, key):             # -> replica index
        fresh = view.now - state[:, req.segs[0]] < p.recent_s
        return parts.argmax(fresh.astype(jnp.float32), tie=parts.fewest_requests(view, req))

    def on_dispatch(state, view, req, g, active, p):  # optional hooks: on_refresh, on_finish, check, flags
        return state.at[g, req.segs[0]].set(jnp.where(active, view.now, state[g, req.segs[0]]))

    # routers/prefix.py, PRESETS (`_stateful(module, rule=..., **default settings)` for more presets
    # on the same module and state)
    "recent": _stateful(recent),

A stateful rule's `p` is the row's `RouterParams` (weights, picker, and every module's settings by
name, e.g. `p.recent_s`); the hooks get the module's own Params. Optional hooks: `on_refresh(state,
view, active, p)` runs before every decision (expire windows), `on_arrival(state, view, req, active, p)`
after it with the request (keep what both `choose` and `on_dispatch` read), `on_admit(state, view, g, rids, admitted,
cached, p)`, `on_first_token(state, view, g, rids, first, p)` and `on_finish(state, view, g, rids,
finished, p)` after an iteration on replica g (`view.now` is the iteration's start for on_admit, its
end for the other two),
`check(static)` refuses static sizes on the host, `flags(state) -> {name: bool}` adds capacity
flags to the metrics (OR-ed into overflow), and `stats(state) -> {name: scalar}` adds decision statistics. A grid keeps only the modules its rows use
(`ReplicaModel.router_modules`).
"""
