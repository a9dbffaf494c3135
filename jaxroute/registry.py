"""Policy registries: one per model kind, checked before tracing.

`lax.switch` clamps an out-of-range index silently (an unknown id would run the last
branch), so every policy id is validated on the host when params are built, and every
switch checks that it has exactly one branch per registered name.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import jax
import numpy as np

from jaxroute.errors import JaxrouteError


class PolicyRegistry:
    """Ordered policy names of one model kind; the index of a name is its traced id."""

    def __init__(self, kind: str, names: Sequence[str], what: str | None = None):
        """kind: the model kind ("dispatch", "decode", ...); what: the noun in messages (default "<kind> policy")."""
        if len(set(names)) != len(names):
            raise ValueError(f"{kind}: duplicate policy names in {list(names)}")
        self.kind = kind
        self.what = what or f"{kind} policy"
        self.names: tuple[str, ...] = tuple(names)

    def __contains__(self, name: object) -> bool:
        return name in self.names

    def __iter__(self):
        return iter(self.names)

    def __len__(self) -> int:
        return len(self.names)

    def id(self, name: str) -> int:
        """The id of `name`, or a JaxrouteError listing the choices."""
        if name not in self.names:
            raise JaxrouteError(f"unknown {self.what} '{name}'; choose from: {', '.join(self.names)}")
        return self.names.index(name)

    def name(self, policy_id: Any) -> str:
        """The name of a host-side id (an int or a one-element array); a traced id or several ids have no one
        name and are refused."""
        if isinstance(policy_id, jax.core.Tracer):
            raise JaxrouteError(f"a traced {self.what} id has no name on the host: name it before tracing")
        i = self.check_id(policy_id)
        if i < 0:
            raise JaxrouteError(f"{np.size(policy_id)} {self.what} ids {np.asarray(policy_id).tolist()} have no one "
                                "name: name each id")
        return self.names[i]

    def check_id(self, policy_id: Any) -> int:
        """A host-side id (or array of ids) as an int (-1 for several), or a JaxrouteError when one names no policy.

        A traced id cannot be checked here (it is accepted; check it on the host before tracing).
        """
        if isinstance(policy_id, jax.core.Tracer):
            return -1
        ids = np.asarray(policy_id)
        if ids.size and (ids.min() < 0 or ids.max() >= len(self.names)):
            raise JaxrouteError(f"{self.what} id {ids.tolist()} is out of range 0..{len(self.names) - 1} "
                               f"({', '.join(self.names)})")
        return int(ids.reshape(-1)[0]) if ids.size == 1 else -1

    def switch(self, policy_id: jax.Array, branches: Sequence[Callable], *operands) -> Any:
        """`lax.switch` over one branch per registered policy, in registry order."""
        if len(branches) != len(self.names):
            raise ValueError(f"{self.kind}: {len(branches)} branches for {len(self.names)} policies")
        return jax.lax.switch(policy_id, branches, *operands)

    def switch_shared(self, policy_id: jax.Array, rules: Sequence[Any], branch: Callable[[Any], Callable],
                      *operands) -> Any:
        """`switch` where policies that run the same rule share a branch: `rules` names each policy's rule (one
        per registered policy, hashable), `branch(rule)` builds its branch. Each distinct rule is traced and
        compiled once (presets that differ only in their traced settings are one rule)."""
        if len(rules) != len(self.names):
            raise ValueError(f"{self.kind}: {len(rules)} rules for {len(self.names)} policies")
        distinct = list(dict.fromkeys(rules))
        index = np.asarray([distinct.index(r) for r in rules], np.int32)
        return jax.lax.switch(jax.numpy.asarray(index)[policy_id], [branch(r) for r in distinct], *operands)
