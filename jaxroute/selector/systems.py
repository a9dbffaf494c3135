"""Compound AI systems of the toy world (lecture §4.1, §4.5).

A system is a frozen dataclass holding static structure (number of modules L, skills S).
`outcome(alloc, ability, questions, blind_spot)` runs the system with allocation
`alloc` ([L] int32, the model of each module) on every question and returns

    correct   [N] bool     end-to-end correctness
    module_ok [L, N] bool  whether each module's own output was right (what a perfect
                           diagnoser would say about it)

It is pure and jittable; vmapping it over allocations evaluates many allocations at once.

Systems:
- locate-solve: module 0 locates (skill 0), module 1 solves (skill 1); correct iff both succeed.
- self-refine: generator (skill 0), critic (skill 1), refiner (skill 2). A correct draft stays
  correct. A wrong draft is caught when the critic succeeds; with the self-critique blind
  spot, the catch probability is multiplied by `blind_spot` (e.g. 0.3) when critic and
  generator are the same model. A caught error is fixed when the refiner succeeds.
- debate: generators 0..2 (skill 0), debaters 3..5 (skill 1). A generator that fails gives its
  model's one wrong answer to that question. Each debater picks among the initial answers
  only: a debater that succeeds picks the correct answer if some generator gave it;
  otherwise it picks the plurality initial answer (ties: the earliest generator's). The final
  answer is the majority of the debaters' picks (three-way tie: the first debater's).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from jaxroute.errors import JaxrouteError
from jaxroute.selector import names
from jaxroute.selector.world import Questions


def success_prob(ability: jax.Array, questions: Questions) -> jax.Array:
    """P(model k succeeds at skill s on question n) = sigmoid(ability - difficulty + luck). [K, S, N]"""
    logits = ability[:, :, None] - questions.difficulty[None, None, :] + questions.luck[:, None, :]
    return jax.nn.sigmoid(logits)


def _succeeds(model: jax.Array, skill: int, ability: jax.Array, questions: Questions, factor=1.0) -> jax.Array:
    """[N] bool: the world's shared draw u[model] against factor * P(success) (only this row is computed)."""
    prob = jax.nn.sigmoid(ability[model, skill] - questions.difficulty + questions.luck[model])
    return questions.uniform[model] < factor * prob


def _plurality(a: jax.Array, b: jax.Array, c: jax.Array) -> jax.Array:
    """Most common of three answers per question; a three-way tie keeps the first."""
    return jnp.where((a == b) | (a == c), a, jnp.where(b == c, b, a))


@dataclasses.dataclass(frozen=True)
class LocateSolve:
    name: str = "locate-solve"
    n_modules: int = 2
    n_skills: int = 2
    module_names: tuple[str, ...] = ("locate", "solve")

    def outcome(self, alloc, ability, questions: Questions, blind_spot=1.0):
        locate = _succeeds(alloc[0], 0, ability, questions)
        solve = _succeeds(alloc[1], 1, ability, questions)
        return locate & solve, jnp.stack([locate, solve])


@dataclasses.dataclass(frozen=True)
class SelfRefine:
    name: str = "self-refine"
    n_modules: int = 3
    n_skills: int = 3
    module_names: tuple[str, ...] = ("generator", "critic", "refiner")

    def outcome(self, alloc, ability, questions: Questions, blind_spot=1.0):
        draft = _succeeds(alloc[0], 0, ability, questions)
        factor = jnp.where(alloc[1] == alloc[0], blind_spot, 1.0)
        catch = _succeeds(alloc[1], 1, ability, questions, factor)
        fix = _succeeds(alloc[2], 2, ability, questions)
        correct = draft | (catch & fix)
        module_ok = jnp.stack([draft, draft | catch, draft | ~catch | fix])
        return correct, module_ok


@dataclasses.dataclass(frozen=True)
class Debate:
    name: str = "debate"
    n_modules: int = 6
    n_skills: int = 2
    module_names: tuple[str, ...] = ("gen1", "gen2", "gen3", "debater1", "debater2", "debater3")

    def initial_answers(self, alloc, ability, questions: Questions) -> jax.Array:
        """[3, N] int32: 0 = correct, else the generator model's wrong answer."""
        return jnp.stack([
            jnp.where(_succeeds(alloc[j], 0, ability, questions), 0, questions.wrong_answer[alloc[j]])
            for j in range(3)
        ])

    def outcome(self, alloc, ability, questions: Questions, blind_spot=1.0):
        answers = self.initial_answers(alloc, ability, questions)
        has_correct = jnp.any(answers == 0, axis=0)
        herd = _plurality(answers[0], answers[1], answers[2])
        picks = jnp.stack([
            jnp.where(_succeeds(alloc[3 + d], 1, ability, questions) & has_correct, 0, herd) for d in range(3)
        ])
        final = _plurality(picks[0], picks[1], picks[2])
        correct = final == 0
        return correct, jnp.concatenate([answers == 0, picks == 0])


SYSTEMS = {s.name: s for s in (LocateSolve(), SelfRefine(), Debate())}
if tuple(SYSTEMS) != names.SYSTEMS:
    raise ImportError(f"selector.systems.SYSTEMS {tuple(SYSTEMS)} must name selector.names.SYSTEMS {names.SYSTEMS}")


def get_system(name: str):
    try:
        return SYSTEMS[name.lower()]
    except KeyError:
        raise JaxrouteError(f"unknown system '{name}'; choose from: {', '.join(SYSTEMS)}") from None
