"""LLMSelector (lecture §4): which model each module of a compound AI system should use.

- `world`: the toy world (K models, per-skill abilities, question difficulty, shared luck), random
  pools and the lecture's constructed five-model case.
- `systems`: locate-solve, self-refine, debate; end-to-end and per-module correctness of an allocation.
- `optimizers`: llmselector, greedy, random_search, exhaustive, best_single (and the exercise-7
  llmselector_downgrade), each a pure function of (key, world, params) with static config.
"""
