"""Routers: dispatch policies as pure functions (classic dispatch, prefix-aware replica routers, balance).

Replica-cluster routers (`prefix.py`) are built from parts, as real routers are (llm-d's scheduler
config, SGLang, Dynamo): filters (`[G]` masks), scorers (`[G]` scores), traced weights, and a picker
(`parts.py`). Each router is declared once, as a `RouterSpec` in `spec.SPECS` (JAX-free: the command line,
the tuner and docs/routers.md read it); its position there is the traced policy id selected with `lax.switch`.

Adding a stateless router = one function + one spec (appended: existing ids stay)::

    # routers/presets.py
    def shortest_prompt_queue(view, req, p, key):
        \"\"\"Fewest tokens in flight, ties -> fewest requests (source: ...).\"\"\"
        return parts.argmax(parts.fewest_tokens(view, req), tie=parts.fewest_requests(view, req))

    # routers/spec.py, SPECS (defaults= sets its weights, picker, ...; tunable= what `jaxroute tune` searches)
    RouterSpec("shortest_prompt_queue", "fewest tokens in flight, ties -> fewest requests",
               "presets.shortest_prompt_queue", "the source it follows", partial_ok=False),

Adding a stateful router = one module + one spec (+ its reference in tests/). The module owns its state
and settings and declares its hooks in `MODULE`, with `view: RouterView`, `req: Request`, `g` the chosen
replica and `active` a traced bool (update only where true, so a vmapped step stays O(row))::

    # routers/recent.py: prefer the replica that served this prompt's first segment most recently
    @jax.tree_util.register_dataclass
    @dataclasses.dataclass(frozen=True)
    class Params:
        recent_s: jax.Array  # [] float32 how long a dispatch counts as recent

    def make_params(recent_s=10.0) -> Params:         # its keywords are its settings (unique across modules)
        return Params(jnp.float32(recent_s))

    def init(static: RouterStatic):                   # -> its state pytree (shapes from static)
        return jnp.full((static.n_replicas, static.n_segments), -jnp.inf)

    def choose(state, view, req, p, key):             # -> replica index
        fresh = view.now - state[:, req.segs[0]] < p.recent_s
        return parts.argmax(fresh.astype(jnp.float32), tie=parts.fewest_requests(view, req))

    def on_dispatch(state, view, req, g, active, p):
        return state.at[g, req.segs[0]].set(jnp.where(active, view.now, state[g, req.segs[0]]))

    MODULE = RouterModule(init=init, make_params=make_params, on_dispatch=on_dispatch)

    # routers/spec.py, SPECS (more specs may name the same module: one state, other default settings)
    RouterSpec("recent", "the replica that served the first segment most recently", "recent.choose",
               "the source it follows", module="recent", tunable=(Knob("recent_s", 1.0, 600.0, log=True),)),

A stateful rule's `p` is the row's `RouterParams` (weights, picker, and every module's settings by
name, e.g. `p.recent_s`); the hooks get the module's own Params. The hooks (`spec.RouterModule` says
when each runs): `on_refresh(state, view, active, p)` before every decision (expire windows),
`on_arrival(state, view, req, active, p)` after it with the request (keep what both the rule and
`on_dispatch` read), `on_dispatch`, and after an iteration on replica g `on_admit(state, view, g, rids,
admitted, cached, p)`, `on_first_token(state, view, g, rids, first, p)` and `on_finish(state, view, g,
rids, finished, p)` (`view.now` is the iteration's start for on_admit, its end for the other two);
`check(static)` refuses static sizes on the host, `flags(state) -> {name: bool}` adds capacity flags to
the metrics (OR-ed into overflow), and `stats(state) -> {name: scalar}` adds decision statistics. A grid
keeps only the modules its rows use (`ReplicaModel.router_modules`).
"""
