"""Training the learned predictor with optax: AdamW, warmup + cosine schedule, minibatches, early stopping.

Data: a fixed pool of (request, step) pairs sampled from the training split and
one from the validation split, each active step of a request equally likely (the
way the router queries the predictor; see `predictors.data`). Each optimiser step
draws a minibatch from the pool on device. Steps run in jitted chunks of
`eval_every` (a `lax.scan`); between chunks the host evaluates the validation loss,
keeps the best parameters and stops after `patience` evaluations without
improvement, and updates the progress bar.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

from jaxroute import fast_prng  # noqa: F401  (unrolled Threefry on CPU; this module jits without jaxroute.sim)
from jaxroute.errors import JaxrouteError
from jaxroute.predictors import learned
from jaxroute.predictors.data import LengthData, Pairs, sample_pairs


@dataclasses.dataclass(frozen=True)
class TrainSettings:
    steps: int = 2000  # optimiser steps at most
    batch: int = 512
    lr: float = 3e-3  # peak learning rate
    weight_decay: float = 1e-4
    warmup: int = 100  # linear warmup steps, then cosine decay to lr * final_lr_fraction
    final_lr_fraction: float = 0.05
    clip_norm: float = 1.0
    eval_every: int = 100  # steps per jitted chunk and between validation checks
    patience: int = 5  # validation checks without improvement before stopping
    train_pairs: int = 1 << 18
    val_pairs: int = 1 << 15
    hidden: tuple[int, ...] = (64, 64)
    key_buckets: int = 16384
    key_dim: int = 8
    key_dropout: float = 0.25  # share of training keys replaced by "unknown" (see learned.py)
    seed: int = 0

    def optimizer_config(self) -> dict:
        return {"lr": self.lr, "weight_decay": self.weight_decay, "warmup": self.warmup, "steps": self.steps,
                "final_lr_fraction": self.final_lr_fraction, "clip_norm": self.clip_norm}


def make_optimizer(opt: dict) -> optax.GradientTransformation:
    """Gradient clipping + AdamW on a warmup-cosine schedule (the structure must match for restoring)."""
    warmup = min(int(opt["warmup"]), max(int(opt["steps"]) - 1, 0))
    schedule = optax.warmup_cosine_decay_schedule(
        init_value=0.0, peak_value=opt["lr"], warmup_steps=warmup,
        decay_steps=max(int(opt["steps"]), warmup + 1), end_value=opt["lr"] * opt["final_lr_fraction"])
    return optax.chain(optax.clip_by_global_norm(opt["clip_norm"]),
                       optax.adamw(schedule, weight_decay=opt["weight_decay"]))


@dataclasses.dataclass
class TrainResult:
    params: Any  # best parameters (lowest validation loss)
    opt_state: Any  # optimiser state at the best step
    config: learned.LearnedConfig
    history: list[dict]  # {"step", "train_loss", "val_loss", "val_bce", "val_mse"} per check
    best_step: int
    stopped_early: bool


def _to_device(p: Pairs):
    return p.features()


@functools.partial(jax.jit, static_argnames=("horizon", "n_steps", "batch", "tx", "key_dropout"))
def _train_chunk(params, opt_state, key, pool, norm_mean, norm_std, *, horizon, n_steps, batch, tx, key_dropout):
    n = pool.generated.shape[0]

    def loss_fn(p, mb):
        bce, mse = learned.losses(p, norm_mean, norm_std, mb, horizon)
        return bce + mse

    def body(carry, k):
        p, s = carry
        k_idx, k_drop = jax.random.split(k)
        idx = jax.random.randint(k_idx, (batch,), 0, n)
        mb = jax.tree_util.tree_map(lambda a: a[idx], pool)
        drop = jax.random.uniform(k_drop, (batch,)) < key_dropout
        mb = dataclasses.replace(mb, key_id=jnp.where(drop, -1, mb.key_id))
        loss, grads = jax.value_and_grad(loss_fn)(p, mb)
        updates, s = tx.update(grads, s, p)
        return (optax.apply_updates(p, updates), s), loss

    (params, opt_state), loss = jax.lax.scan(body, (params, opt_state), jax.random.split(key, n_steps))
    return params, opt_state, jnp.mean(loss)


@functools.partial(jax.jit, static_argnames=("horizon",))
def _val_losses(params, pool, norm_mean, norm_std, *, horizon):
    return learned.losses(params, norm_mean, norm_std, pool, horizon)


def train(train_data: LengthData, val_data: LengthData, horizon: int, settings: TrainSettings = TrainSettings(),
          features: tuple[str, ...] | None = None, progress: bool = False, info: dict | None = None) -> TrainResult:
    """Fit the two MLPs on `train_data`, early-stopping on `val_data`."""
    s = settings
    if s.steps < 1 or s.batch < 1 or s.eval_every < 1 or s.patience < 1:
        raise JaxrouteError("steps, batch, eval_every and patience must be >= 1")
    if not 0.0 <= s.key_dropout < 1.0:
        raise JaxrouteError(f"key_dropout must be in [0, 1), got {s.key_dropout}")
    if horizon < 1:
        raise JaxrouteError(f"horizon must be >= 1, got {horizon}")
    features = features or learned.feature_set(train_data.has_keys)
    rng = np.random.default_rng(s.seed)
    train_pairs = sample_pairs(train_data, s.train_pairs, rng)
    val_pairs = sample_pairs(val_data, s.val_pairs, rng)
    mean, std = learned.normalisation(train_pairs.prompt_len, train_pairs.generated)
    cfg = learned.LearnedConfig(horizon=horizon, features=tuple(features), norm_mean=mean, norm_std=std,
                                hidden=tuple(s.hidden), key_buckets=s.key_buckets, key_dim=s.key_dim,
                                optimizer=s.optimizer_config(), info=dict(info or {}))
    cfg.validate()
    tx = make_optimizer(cfg.optimizer)
    key = jax.random.PRNGKey(s.seed)
    key, k_init = jax.random.split(key)
    params = learned.init_params(k_init, cfg)
    opt_state = tx.init(params)
    nm, ns = jnp.asarray(mean, jnp.float32), jnp.asarray(std, jnp.float32)
    tpool, vpool = _to_device(train_pairs), _to_device(val_pairs)

    def val_check(p):
        bce, mse = (float(x) for x in _val_losses(p, vpool, nm, ns, horizon=horizon))
        return bce + mse, bce, mse

    v0, b0, m0 = val_check(params)
    history = [{"step": 0, "train_loss": None, "val_loss": v0, "val_bce": b0, "val_mse": m0}]
    best = (v0, 0, params, opt_state)
    bad, step, stopped = 0, 0, False
    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=s.steps, desc="training predictor", unit="step")
    while step < s.steps:
        n = min(s.eval_every, s.steps - step)
        key, k = jax.random.split(key)
        params, opt_state, tl = _train_chunk(params, opt_state, k, tpool, nm, ns, horizon=horizon, n_steps=n,
                                             batch=s.batch, tx=tx, key_dropout=s.key_dropout)
        step += n
        v, b, m = val_check(params)
        history.append({"step": step, "train_loss": float(tl), "val_loss": v, "val_bce": b, "val_mse": m})
        if bar is not None:
            bar.update(n)
            bar.set_postfix(train=f"{float(tl):.4f}", val=f"{v:.4f}")
        if v < best[0]:
            best, bad = (v, step, params, opt_state), 0
        else:
            bad += 1
            if bad >= s.patience:
                stopped = True
                break
    if bar is not None:
        bar.close()
    return TrainResult(best[2], best[3], cfg, history, best[1], stopped)
