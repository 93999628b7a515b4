"""The critic: a separate full-size value model that routes on its own (no replay).

Why separate functions: the PPO step and the Critic Warm-Up stage share exactly this loss, so
the warmed-up critic is the one PPO continues with.
"""

from __future__ import annotations

import math

import jax
from flax import nnx

from t1jax.rl import ppo


def critic_values(graphdef, params, batch):
    """V(state before token t), float32 [B, L]."""
    out = nnx.merge(graphdef, params)(batch.tokens, batch.positions, batch.segment_ids)
    return ppo.values_before(out.values)


def critic_loss(graphdef, value_clip: float):
    def loss(params, batch, old_values, returns):
        values = critic_values(graphdef, params, batch)
        value, clip_frac = ppo.value_loss(values, old_values, returns, batch.loss_mask,
                                          value_clip)
        return value, {"critic/value_loss": value, "critic/value_clip_frac": clip_frac,
                       "critic/values_mean": ppo.masked_mean(values, batch.loss_mask)}
    return loss


def warm_start_from_actor(critic_params, actor_params):
    """The critic's backbone copied from the policy (value head kept): the usual start for a
    critic, before Critic Warm-Up fits the head and backbone to the policy's returns."""
    flat_actor = dict(nnx.to_flat_state(actor_params))
    flat = []
    for path, var in nnx.to_flat_state(critic_params):
        source = flat_actor.get(path)
        if source is not None and path[0] == "model":
            var = var.replace(jax.numpy.asarray(source.get_value(), var.get_value().dtype))
        flat.append((path, var))
    return nnx.from_flat_state(flat)


VALUE_HEAD_INITS = ("zeros", "uniform")


def uniform_value_head(critic_params, key):
    """The value head PyTorch's nn.Linear(hidden, 1) starts with, U(+-1/sqrt(hidden)) for weight
    and bias (a value head built that way, e.g. TRL's): per-token values as spread as the returns.
    ValueModel's own head starts at zero; this is the cold critic the T1 report describes, for
    ablations (rl.value_head_init='uniform')."""
    flat = []
    for path, var in nnx.to_flat_state(critic_params):
        if path[0] in ("value_head", "value_bias"):
            key, sub = jax.random.split(key)
            old = var.get_value()
            bound = 1.0 / (critic_params["value_head"].get_value().shape[0] ** 0.5)
            new = jax.random.uniform(sub, old.shape, old.dtype, -bound, bound)
            var = var.replace(jax.device_put(new, old.sharding))
        flat.append((path, var))
    return nnx.from_flat_state(flat)


def warmup_health(evs, *, min_steps: int, window: int, min_ev: float) -> tuple[bool, float]:
    """Whether Critic Warm-Up may stop after steps with these explained variances, and the mean
    over its last `window` steps. Each step's value is measured with the critic's pre-update
    values on that step's fresh rollouts, which it has never trained on, so it is held-out
    health, not fit. Healthy: at least `min_steps` steps and the window's mean above `min_ev`
    (one lucky batch of a few trials does not end it). A NaN step (returns that did not vary)
    counts against it. window <= 0: never healthy (Warm-Up runs its fixed number of steps)."""
    evs = [float(v) for v in evs]
    if window <= 0 or len(evs) < max(min_steps, window):
        return False, float("nan")
    last = evs[-window:]
    if any(math.isnan(v) for v in last):
        return False, float("nan")
    mean = sum(last) / window
    return mean > min_ev, mean
