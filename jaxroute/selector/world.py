"""The toy world of LLMSelector (lecture §4.4): K models, questions with a difficulty, shared luck.

A model k has an ability per skill s: `ability[k, s] = general[k] + specialty[k, s]`.
Question n has one difficulty `d[n]`. Model k has one luck term `luck[k, n]` and one
uniform draw `u[k, n]` per question, both *shared across its skills*, so a model finds a
question easy or hard in all skills at once (the lecture's construction).

Success (documented choice): model k succeeds at skill s on question n iff

    u[k, n] < sigmoid(ability[k, s] - d[n] + luck[k, n])

so each success has probability sigmoid(ability - difficulty + luck), and because the draw
`u` is part of the world, an allocation's accuracy on a fixed question set is a deterministic
number (common random numbers across allocations and optimizers). The thresholded
deterministic variant (`threshold=True`) sets u = 1/2, i.e. success iff
ability - difficulty + luck > 0.

A wrong model always gives the same wrong answer to a question: `wrong_answer[k, n]` in
1..n_wrong (answer 0 is the correct one). Every draw comes from explicit keys: one key per
purpose, and the train and test splits are drawn from separate keys.
"""

from __future__ import annotations

import dataclasses
import functools
import string

import jax
import jax.numpy as jnp
import numpy as np

from jaxroute import fast_prng  # noqa: F401  (unrolled Threefry on CPU; this module jits without jaxroute.sim)
from jaxroute.errors import JaxrouteError

MODEL_NAMES = string.ascii_uppercase  # model k is called MODEL_NAMES[k]


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Questions:
    """One split of questions with every per-(model, question) draw."""

    difficulty: jax.Array  # [N] float32
    luck: jax.Array  # [K, N] float32, shared across a model's skills
    uniform: jax.Array  # [K, N] float32 in [0, 1); 0.5 everywhere in the threshold variant
    wrong_answer: jax.Array  # [K, N] int32 in 1..n_wrong: the wrong answer model k gives to question n


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class World:
    """A pool of K models with S skills, and its train and test questions."""

    ability: jax.Array  # [K, S] float32
    train: Questions
    test: Questions


def model_name(k: int) -> str:
    return MODEL_NAMES[k]


def allocation_name(alloc) -> str:
    """`[0, 1]` -> `A+B`."""
    return "+".join(model_name(int(k)) for k in np.asarray(alloc).reshape(-1))


def parse_allocation(text: str, n_models: int, n_modules: int) -> list[int]:
    """`C,C` (or `C+C`) -> [2, 2], validated against the pool size and the system's modules."""
    names = [t.strip().upper() for t in text.replace("+", ",").split(",") if t.strip()]
    if len(names) != n_modules:
        raise JaxrouteError(f"--start '{text}' names {len(names)} models but the system has {n_modules} "
                            f"modules; give one model letter per module, e.g. {','.join(['A'] * n_modules)}")
    valid = MODEL_NAMES[:n_models]
    out = []
    for n in names:
        if len(n) != 1 or n not in valid:
            raise JaxrouteError(f"--start: unknown model '{n}'; this pool has models {', '.join(valid)}")
        out.append(valid.index(n))
    return out


def draw_questions(key: jax.Array, n_models: int, n_questions: int, *, difficulty_std: float = 1.0,
                   luck_std: float = 1.0, n_wrong: int = 4, threshold: bool = False) -> Questions:
    """Draw one split: difficulty ~ N(0, difficulty_std), luck ~ N(0, luck_std), u ~ U[0, 1)."""
    k_d, k_l, k_u, k_w = jax.random.split(key, 4)
    shape = (n_models, n_questions)
    uniform = jnp.full(shape, 0.5, jnp.float32) if threshold else jax.random.uniform(k_u, shape)
    return Questions(
        difficulty=difficulty_std * jax.random.normal(k_d, (n_questions,)),
        luck=luck_std * jax.random.normal(k_l, shape),
        uniform=uniform,
        wrong_answer=jax.random.randint(k_w, shape, 1, n_wrong + 1).astype(jnp.int32),
    )


def make_world(key: jax.Array, ability: jax.Array, n_train: int, n_test: int, **question_kw) -> World:
    """A world with given abilities [K, S]; train and test questions come from separate keys."""
    ability = jnp.asarray(ability, jnp.float32)
    k_train, k_test = jax.random.split(key)
    n_models = ability.shape[0]
    return World(ability=ability,
                 train=draw_questions(k_train, n_models, n_train, **question_kw),
                 test=draw_questions(k_test, n_models, n_test, **question_kw))


def random_ability(key: jax.Array, n_models: int, n_skills: int, *, general_std: float = 1.0,
                   specialty_std: float = 1.5, general_mean: float = 1.0) -> jax.Array:
    """A random pool: ability[k, s] = general[k] + specialty[k, s]. [K, S] float32"""
    k_g, k_s = jax.random.split(key)
    general = general_mean + general_std * jax.random.normal(k_g, (n_models, 1))
    specialty = specialty_std * jax.random.normal(k_s, (n_models, n_skills))
    return general + specialty


@functools.partial(jax.jit, static_argnums=(1, 2, 3, 4, 5, 6))
def random_worlds(key: jax.Array, n_pools: int, n_models: int, n_skills: int, n_train: int, n_test: int,
                  threshold: bool = False) -> World:
    """`n_pools` independent random pools stacked on a leading axis (every leaf gets [P, ...])."""

    def one(k):
        k_a, k_q = jax.random.split(k)
        return make_world(k_q, random_ability(k_a, n_models, n_skills), n_train, n_test, threshold=threshold)

    return jax.vmap(one)(jax.random.split(key, n_pools))


# The lecture's constructed five-model case (skills: 0 = locate, 1 = solve).
#   A locates well and solves badly, B the reverse, C is a middling generalist whose
#   two skills are equal (so C succeeds on "C-easy" questions in both modules at once),
#   D a weaker generalist, E a weak model. With shared luck, C+C is a local optimum of
#   end-to-end accuracy: swapping either module alone keeps only C's easy questions.
LECTURE_ABILITY = np.array(
    [
        [5.0, -2.0],  # A: locate strong, solve weak
        [-2.0, 5.0],  # B: locate weak, solve strong
        [-0.3, -0.3],  # C: both middling
        [-1.0, -1.0],  # D: weaker generalist
        [-2.5, -2.5],  # E: weak
    ],
    dtype=np.float32,
)
LECTURE_QUESTIONS = {"difficulty_std": 1.0, "luck_std": 1.0}  # question draws of the lecture world
LECTURE_PRICES = np.array([5.0, 3.0, 1.0, 0.5, 0.2], dtype=np.float32)  # exercise 7


@functools.partial(jax.jit, static_argnums=(1, 2, 3, 4))
def lecture_worlds(key: jax.Array, n_pools: int, n_train: int = 100, n_test: int = 100,
                   threshold: bool = False) -> World:
    """`n_pools` draws of questions for the constructed five-model case, stacked on [P, ...]."""
    ability = jnp.asarray(LECTURE_ABILITY)

    def one(k):
        return make_world(k, ability, n_train, n_test, threshold=threshold, **LECTURE_QUESTIONS)

    return jax.vmap(one)(jax.random.split(key, n_pools))


def pool(worlds: World, p: int) -> World:
    """Pool p of a stacked world."""
    return jax.tree.map(lambda x: x[p], worlds)
