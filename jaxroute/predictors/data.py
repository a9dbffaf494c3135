"""Length data for fitting and evaluating horizon predictors.

A predictor sees, for each active request, its prompt length, the tokens generated so
far j and a prompt key. Training and evaluation therefore work on (request, step)
*pairs*. The router queries every active request at every barrier step, so a
request of output length L is queried at j = 0, 1, ..., L-1: each active step of a
request counts once, and long requests weigh in proportion to their length. Pairs
are sampled that way (request i with probability L_i / sum L, then j uniform in
[0, L_i)), both for training and for evaluation.

Splits are temporal (by arrival order): the first 70 % of a workload trains, the
next 15 % validates (early stopping), the last 15 % is held out. A deployed
predictor is fitted on past traffic and serves future traffic; a temporal split
also never depends on a seed, so `train-predictor` and `eval-predictor` agree on
it for a trace file. Synthetic workloads must be drawn with the same seed in both
commands (their template table depends on the seed).

Workloads: the decode workloads of `jaxroute.workloads.decode` plus `mooncake`
(Mooncake FAST'25 JSONL; the prompt key is the first 512-token block id of
`hash_ids`, which identifies the shared system-prompt prefix of a request).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import jax.numpy as jnp
import numpy as np

from jaxroute.errors import JaxrouteError
from jaxroute.predictors.base import RequestFeatures
from jaxroute.workloads import decode, traces
from jaxroute.workloads.names import PREDICTOR_WORKLOADS

WORKLOADS = PREDICTOR_WORKLOADS  # the decode workloads and mooncake's trace (workloads/names.py)
MOONCAKE_DEFAULT_PATH = "../shared/data/mooncake_synthetic_trace.jsonl"
MOONCAKE_KEY_BLOCKS = 1  # prompt key = hash of the first block id(s) of hash_ids
SPLIT_FRACTIONS = (0.70, 0.15, 0.15)  # train, validation, held-out test (temporal)
INT32_MAX = np.iinfo(np.int32).max


@dataclasses.dataclass(frozen=True)
class LengthData:
    """Requests as host arrays, in arrival order."""

    name: str
    prompt_tokens: np.ndarray  # [N] int64, >= 1
    output_tokens: np.ndarray  # [N] int64, >= 1
    key_id: np.ndarray  # [N] int64 in [0, 2^31), -1 where unknown

    def __len__(self) -> int:
        return len(self.output_tokens)

    @property
    def has_keys(self) -> bool:
        return bool(np.any(self.key_id >= 0))

    def slice(self, start: int, stop: int) -> LengthData:
        return LengthData(self.name, self.prompt_tokens[start:stop], self.output_tokens[start:stop],
                          self.key_id[start:stop])


@dataclasses.dataclass(frozen=True)
class Pairs:
    """(request, step) query points: what the router would ask a predictor, plus the truth."""

    prompt_len: np.ndarray  # [P] int32
    generated: np.ndarray  # [P] int32, j in [0, L)
    key_id: np.ndarray  # [P] int32
    remaining: np.ndarray  # [P] int32, L - j >= 1

    def __len__(self) -> int:
        return len(self.generated)

    def features(self) -> RequestFeatures:
        return RequestFeatures(
            prompt_len=jnp.asarray(self.prompt_len, jnp.int32),
            generated=jnp.asarray(self.generated, jnp.int32),
            key_id=jnp.asarray(self.key_id, jnp.int32),
            remaining=jnp.asarray(self.remaining, jnp.int32),
        )

    def take(self, idx: np.ndarray) -> Pairs:
        return Pairs(self.prompt_len[idx], self.generated[idx], self.key_id[idx], self.remaining[idx])


def from_requests(req) -> LengthData:
    """Adapt anything with prompt_tokens, output_tokens and key_id arrays (e.g. DecodeRequests)."""
    return LengthData(req.name, np.asarray(req.prompt_tokens, np.int64), np.asarray(req.output_tokens, np.int64),
                      np.asarray(req.key_id, np.int64))


def mooncake_keys(block_ids: list[np.ndarray], key_blocks: int = MOONCAKE_KEY_BLOCKS) -> np.ndarray:
    """Prompt key per request: a 31-bit hash of its first `key_blocks` hash_ids (-1 if it has none)."""
    out = np.full(len(block_ids), -1, np.int64)
    for i, ids in enumerate(block_ids):
        head = np.asarray(ids[:key_blocks], np.int64)
        if len(head):
            h = 1469598103934665603  # FNV-1a over the block ids, folded to 31 bits
            for b in head.tolist():
                h = ((h ^ int(b)) * 1099511628211) & 0xFFFFFFFFFFFFFFFF
            out[i] = (h ^ (h >> 31)) & INT32_MAX
    return out


def load_mooncake(path: str | Path | None, n: int | None = None) -> LengthData:
    p = Path(path) if path is not None else Path(MOONCAKE_DEFAULT_PATH)
    if path is None and not p.exists():
        raise JaxrouteError(f"workload 'mooncake' needs the Mooncake JSONL trace: pass --trace PATH "
                            f"(default {MOONCAKE_DEFAULT_PATH} relative to the current directory was not found)")
    tr = traces.load_mooncake_jsonl(p)
    if n is not None:
        if n > len(tr):
            raise JaxrouteError(f"workload 'mooncake' has only {len(tr)} requests in {tr.name}; asked for {n}")
        tr = tr.head(n)
    return LengthData("mooncake", np.asarray(tr.prompt_tokens, np.int64), np.asarray(tr.output_tokens, np.int64),
                      mooncake_keys(tr.block_ids))


def trace_size(name: str, trace_path: str | Path | None) -> int:
    """How many requests a trace workload has (for 'use them all')."""
    if name == "mooncake":
        return len(load_mooncake(trace_path))
    return len(traces.load_azure_csv(decode.resolve_trace_path(name, trace_path)))


def load_lengths(name: str, n: int | None = None, seed: int = 0, trace_path: str | Path | None = None,
                 default_synthetic: int = 20000) -> LengthData:
    """The first n requests of a workload (traces: all of them when n is None)."""
    if name not in WORKLOADS:
        raise JaxrouteError(f"unknown workload '{name}'; choose from: {', '.join(WORKLOADS)}")
    if name == "mooncake":
        return load_mooncake(trace_path, n)
    if n is None:
        n = default_synthetic if name.startswith("synthetic") else trace_size(name, trace_path)
    return from_requests(decode.make_decode_requests(name, n, seed=seed, trace_path=trace_path))


def training_requests_for_simulation(name: str, n_sim: int, seed: int = 0, trace_path: str | Path | None = None,
                                     n_train: int | None = None) -> LengthData:
    """Requests to fit deployed predictors on, distinct from the n_sim simulated ones.

    The simulation uses `make_decode_requests(name, n_sim, seed)`. Synthetic workloads
    train on positions n_sim.. of a longer draw with the same seed (further requests of
    the same population, so synthetic-prod's template table is the same); trace
    workloads train on the trace requests that follow the simulated ones.
    n_train defaults to max(n_sim, 4000) (what is left of a trace, if less).
    """
    if name not in decode.DECODE_WORKLOADS:
        raise JaxrouteError(f"unknown decode workload '{name}'; choose from: {', '.join(decode.DECODE_WORKLOADS)}")
    n_train = int(n_train or max(n_sim, 4000))
    if name.startswith("synthetic"):
        full = from_requests(decode.make_decode_requests(name, n_sim + n_train, seed=seed))
        return full.slice(n_sim, n_sim + n_train)
    total = trace_size(name, trace_path)
    left = total - n_sim
    if left < 200:
        raise JaxrouteError(f"deployed predictors are fitted on trace requests after the {n_sim} simulated ones, "
                            f"but {name} has only {total}; simulate at most {total - 200} requests")
    n_train = min(n_train, left)
    full = from_requests(decode.make_decode_requests(name, n_sim + n_train, seed=seed, trace_path=trace_path))
    return full.slice(n_sim, n_sim + n_train)


def temporal_split(data: LengthData, fractions=SPLIT_FRACTIONS) -> tuple[LengthData, LengthData, LengthData]:
    """(train, validation, test) by arrival order."""
    n = len(data)
    a = int(round(fractions[0] * n))
    b = int(round((fractions[0] + fractions[1]) * n))
    if a < 1 or b - a < 1 or n - b < 1:
        raise JaxrouteError(f"{n} requests are too few to split into train/validation/test; use at least 20")
    return data.slice(0, a), data.slice(a, b), data.slice(b, n)


def total_steps(data: LengthData) -> int:
    return int(np.sum(data.output_tokens))


def sample_pairs(data: LengthData, n_pairs: int, rng: np.random.Generator) -> Pairs:
    """n_pairs (request, step) pairs, each active step of each request equally likely (with replacement)."""
    if len(data) == 0:
        raise JaxrouteError("cannot sample predictor training pairs from an empty split")
    cum = np.cumsum(data.output_tokens)
    u = rng.integers(0, cum[-1], size=n_pairs)
    i = np.searchsorted(cum, u, side="right")
    j = u - np.concatenate([[0], cum[:-1]])[i]
    return _pairs(data, i, j)


def all_pairs(data: LengthData) -> Pairs:
    """Every (request, step) pair, j = 0..L-1 for each request."""
    i = np.repeat(np.arange(len(data)), data.output_tokens)
    starts = np.concatenate([[0], np.cumsum(data.output_tokens)[:-1]])
    j = np.arange(len(i)) - np.repeat(starts, data.output_tokens)
    return _pairs(data, i, j)


def _pairs(data: LengthData, i: np.ndarray, j: np.ndarray) -> Pairs:
    L = data.output_tokens[i]
    return Pairs(
        prompt_len=np.minimum(data.prompt_tokens[i], INT32_MAX).astype(np.int32),
        generated=j.astype(np.int32),
        key_id=data.key_id[i].astype(np.int32),
        remaining=(L - j).astype(np.int32),
    )
