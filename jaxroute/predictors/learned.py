"""Learned predictor: two small MLPs in plain JAX.

- Termination classifier: logit of P(request ends within the next H steps).
- Conditional remaining-steps regressor: mu_rem given that it ends within H. It is
  parametrised on a log scale, mu = H ** sigmoid(z) (so 1 <= mu <= H and equal
  steps in z are equal ratios of mu), and trained with squared error on mu / H,
  only on pairs that do end within H. Squared error (not error in log space)
  makes the fit the conditional *mean*, which is what BR-H's contribution
  c = (1 - p) H + p mu needs; a log-space loss would fit the geometric mean and
  bias mu low.

Features (`LearnedConfig.features`):
- `log_prompt`: log(1 + prompt tokens), standardised with training-pair statistics;
- `log_generated`: log(1 + tokens generated j), standardised likewise; the age is
  the strongest signal (it is all survival uses);
- `key_embedding` (only where the workload has prompt keys): a learned embedding of
  the key hashed into `key_buckets` buckets (bucket 0 = unknown key). Hashing keeps
  the table a fixed size for any number of keys. Unknown keys map to the zero vector,
  and so do keys never seen in training: embeddings start at zero and only buckets
  that training keys hash to move. Training replaces a random `key_dropout` share of
  keys by "unknown", so the zero vector learns the key-free (survival-like) answer
  rather than whatever an untrained bucket would give. One-off keys that collide with
  a trained bucket cost a little accuracy, which more buckets reduce.
Each MLP has its own embedding and ReLU hidden layers (`hidden`).
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxroute.errors import JaxrouteError
from jaxroute.predictors.base import RequestFeatures

CONFIG_VERSION = 1
BASE_FEATURES = ("log_prompt", "log_generated")
KEY_FEATURE = "key_embedding"
ALL_FEATURES = BASE_FEATURES + (KEY_FEATURE,)


def feature_set(has_keys: bool) -> tuple[str, ...]:
    """The features used for a workload with (or without) prompt keys."""
    return BASE_FEATURES + ((KEY_FEATURE,) if has_keys else ())


@dataclasses.dataclass(frozen=True)
class LearnedConfig:
    """Everything needed to rebuild the model's shapes and inputs (saved as JSON beside the weights)."""

    horizon: int
    features: tuple[str, ...]
    norm_mean: tuple[float, float]  # of (log_prompt, log_generated) over training pairs
    norm_std: tuple[float, float]
    hidden: tuple[int, ...] = (64, 64)
    key_buckets: int = 16384
    key_dim: int = 8
    optimizer: dict = dataclasses.field(default_factory=dict)  # make_optimizer's settings
    info: dict = dataclasses.field(default_factory=dict)  # provenance (workload, seed, metrics), not shapes

    @property
    def uses_keys(self) -> bool:
        return KEY_FEATURE in self.features

    def to_json(self) -> dict:
        d = dataclasses.asdict(self)
        d["version"] = CONFIG_VERSION
        return json.loads(json.dumps(d))

    @staticmethod
    def from_json(d: dict, where: str = "checkpoint") -> LearnedConfig:
        try:
            if d.get("version") != CONFIG_VERSION:
                raise JaxrouteError(f"{where}: config version {d.get('version')!r}, "
                                    f"this jaxroute reads {CONFIG_VERSION}")
            cfg = LearnedConfig(
                horizon=int(d["horizon"]),
                features=tuple(d["features"]),
                norm_mean=tuple(float(x) for x in d["norm_mean"]),
                norm_std=tuple(float(x) for x in d["norm_std"]),
                hidden=tuple(int(h) for h in d["hidden"]),
                key_buckets=int(d["key_buckets"]),
                key_dim=int(d["key_dim"]),
                optimizer=dict(d.get("optimizer", {})),
                info=dict(d.get("info", {})),
            )
        except (KeyError, TypeError, ValueError) as e:
            raise JaxrouteError(f"{where}: malformed predictor config ({e!r})") from None
        cfg.validate(where)
        return cfg

    def validate(self, where: str = "config") -> None:
        unknown = [f for f in self.features if f not in ALL_FEATURES]
        if unknown or tuple(self.features[:2]) != BASE_FEATURES:
            raise JaxrouteError(f"{where}: unsupported feature set {list(self.features)}; "
                                f"expected {list(BASE_FEATURES)} optionally + ['{KEY_FEATURE}']")
        if self.horizon < 1 or not self.hidden or min(self.hidden) < 1 or self.key_buckets < 1 or self.key_dim < 1:
            raise JaxrouteError(f"{where}: horizon, hidden sizes, key_buckets and key_dim must be >= 1")
        if len(self.norm_mean) != 2 or len(self.norm_std) != 2 or min(self.norm_std) <= 0:
            raise JaxrouteError(f"{where}: normalisation needs 2 means and 2 positive standard deviations")


# ----------------------------------------------------------------------------- model

Params = dict[str, Any]


def _init_mlp(key: jax.Array, cfg: LearnedConfig) -> Params:
    d_in = len(BASE_FEATURES) + (cfg.key_dim if cfg.uses_keys else 0)
    sizes = (d_in, *cfg.hidden, 1)
    keys = jax.random.split(key, len(sizes))
    layers = []
    for k, (a, b) in zip(keys[:-1], zip(sizes[:-1], sizes[1:], strict=True), strict=True):
        w = jax.random.normal(k, (a, b), jnp.float32) * jnp.sqrt(2.0 / a)  # He init for ReLU
        layers.append({"w": w, "b": jnp.zeros((b,), jnp.float32)})
    net: Params = {"layers": layers}
    if cfg.uses_keys:
        # Zero init: a bucket no training key hashes to stays exactly zero, i.e. "unknown key".
        net["emb"] = jnp.zeros((cfg.key_buckets + 1, cfg.key_dim), jnp.float32)
    return net


def init_params(key: jax.Array, cfg: LearnedConfig) -> Params:
    """{'clf': termination MLP, 'reg': remaining-steps MLP}."""
    k1, k2 = jax.random.split(key)
    return {"clf": _init_mlp(k1, cfg), "reg": _init_mlp(k2, cfg)}


def key_bucket(key_id: jax.Array, n_buckets: int) -> jax.Array:
    """Bucket 1..n_buckets of a hashed prompt key; 0 for an unknown key (< 0)."""
    h = key_id.astype(jnp.uint32) * jnp.uint32(0x9E3779B1)
    h = h ^ (h >> 15)
    b = (h % jnp.uint32(n_buckets)).astype(jnp.int32) + 1
    return jnp.where(key_id >= 0, b, 0)


def _inputs(net: Params, norm_mean: jax.Array, norm_std: jax.Array, feats: RequestFeatures) -> jax.Array:
    x = jnp.stack([jnp.log1p(feats.prompt_len.astype(jnp.float32)),
                   jnp.log1p(feats.generated.astype(jnp.float32))], axis=-1)
    x = (x - norm_mean) / norm_std
    if "emb" in net:
        emb = net["emb"]
        b = key_bucket(feats.key_id, emb.shape[0] - 1)
        x = jnp.concatenate([x, jnp.where((b > 0)[..., None], emb[b], 0.0)], axis=-1)  # unknown -> 0
    return x


def _mlp(net: Params, x: jax.Array) -> jax.Array:
    *hidden, last = net["layers"]
    for layer in hidden:
        x = jax.nn.relu(x @ layer["w"] + layer["b"])
    return (x @ last["w"] + last["b"])[..., 0]


def forward(params: Params, norm_mean: jax.Array, norm_std: jax.Array,
            feats: RequestFeatures) -> tuple[jax.Array, jax.Array]:
    """(termination logit [N], regressor pre-activation z [N]); mu = H ** sigmoid(z)."""
    logit = _mlp(params["clf"], _inputs(params["clf"], norm_mean, norm_std, feats))
    z = _mlp(params["reg"], _inputs(params["reg"], norm_mean, norm_std, feats))
    return logit, z


def mu_from_z(z: jax.Array, horizon: int) -> jax.Array:
    return jnp.power(jnp.float32(horizon), jax.nn.sigmoid(z))


def losses(params: Params, norm_mean: jax.Array, norm_std: jax.Array, feats: RequestFeatures,
           horizon: int) -> tuple[jax.Array, jax.Array]:
    """(BCE of termination within H, squared error of mu/H on pairs that end within H)."""
    logit, z = forward(params, norm_mean, norm_std, feats)
    ends = feats.remaining <= horizon
    y = ends.astype(jnp.float32)
    bce = jnp.mean(jnp.maximum(logit, 0) - logit * y + jnp.log1p(jnp.exp(-jnp.abs(logit))))
    err = (mu_from_z(z, horizon) - feats.remaining.astype(jnp.float32)) / horizon
    n_ends = jnp.sum(ends)
    mse = jnp.sum(jnp.where(ends, err * err, 0.0)) / jnp.maximum(n_ends, 1)
    return bce, mse


# ----------------------------------------------------------------------------- as a predictor


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class LearnedTable:
    """A trained model as a bank entry."""

    params: Params  # init_params structure
    norm_mean: jax.Array  # [2] float32
    norm_std: jax.Array  # [2] float32


def make_table(params: Params, cfg: LearnedConfig) -> LearnedTable:
    return LearnedTable(params, jnp.asarray(cfg.norm_mean, jnp.float32), jnp.asarray(cfg.norm_std, jnp.float32))


def predict_learned(table: LearnedTable, feats: RequestFeatures, horizon: int) -> tuple[jax.Array, jax.Array]:
    logit, z = forward(table.params, table.norm_mean, table.norm_std, feats)
    return jax.nn.sigmoid(logit), mu_from_z(z, horizon)


def normalisation(prompt_len: np.ndarray, generated: np.ndarray) -> tuple[tuple[float, float], tuple[float, float]]:
    """Mean and std of (log1p prompt, log1p generated) over training pairs."""
    x = np.stack([np.log1p(np.asarray(prompt_len, np.float64)), np.log1p(np.asarray(generated, np.float64))])
    mean = x.mean(axis=1)
    std = np.maximum(x.std(axis=1), 1e-3)
    return (float(mean[0]), float(mean[1])), (float(std[0]), float(std[1]))
