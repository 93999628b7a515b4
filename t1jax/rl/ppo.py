"""PPO's pieces as pure functions on token-indexed [B, L] arrays (see t1jax/rl/batch.py).

Actions are the sampled tokens (mask 1). Observation and template tokens are not steps of the
MDP: GAE runs over a trial's sampled tokens in order, so across a tool output the critic's value
before the next sampled token bridges the gap (gamma and lambda apply per sampled token).

Aggregation is token-level ("token-mean"): every sampled token in the (mini)batch weighs the
same, whatever its trial's length, so long trials are not down-weighted per token as they would
be by a per-sequence mean.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def masked_mean(x, mask):
    return jnp.sum(x * mask) / jnp.maximum(jnp.sum(mask), 1.0)


def masked_var(x, mask):
    mean = masked_mean(x, mask)
    return masked_mean(jnp.square(x - mean), mask)


def masked_whiten(x, mask, eps: float = 1e-8):
    mean = masked_mean(x, mask)
    return (x - mean) * jax.lax.rsqrt(masked_var(x, mask) + eps) * mask


def values_before(values_from_model):
    """V(state before token t): the critic reads token t-1's position (0 at t=0)."""
    return jnp.pad(values_from_model[:, :-1], ((0, 0), (1, 0)))


def gae(rewards, values, mask, trial_ids, gamma: float, lam: float, continues_at=None):
    """(advantages, returns), [B, L], zero off the mask. values: V before each token.

    continues_at (batch.py): a trial split over rows continues at that flat index. Each piece's
    GAE is run with the next piece's first value as its bootstrap, then the next piece's
    advantage is added with the weight (gamma * lam)^k it has k steps back, piece by piece
    from the trial's end; the result equals the trial's GAE in one row."""
    linked = continues_at is not None
    if linked:
        link = jnp.maximum(continues_at, 0).reshape(-1)
        has_next = (continues_at >= 0).astype(jnp.float32)
        boot = values.astype(jnp.float32).reshape(-1)[link].reshape(values.shape) * has_next
    else:
        boot = has_next = jnp.zeros(values.shape, jnp.float32)

    def step(carry, xs):
        next_value, next_adv, next_decay, next_trial = carry
        reward, value, m, trial, boot, has_next = xs
        same = trial == next_trial
        next_value = jnp.where(same, next_value, boot)
        next_adv = jnp.where(same, next_adv, 0.0)
        next_decay = jnp.where(same, next_decay, has_next)
        delta = reward + gamma * next_value - value
        adv = delta + gamma * lam * next_adv
        decay = gamma * lam * next_decay  # weight of the next piece's first advantage
        acting = m > 0
        carry = (jnp.where(acting, value, next_value), jnp.where(acting, adv, next_adv),
                 jnp.where(acting, decay, next_decay), trial)
        return carry, (jnp.where(acting, adv, 0.0), jnp.where(acting, decay, 0.0))

    b = rewards.shape[0]
    zeros = jnp.zeros((b,), jnp.float32)
    init = (zeros, zeros, zeros, jnp.full((b,), -1, trial_ids.dtype))
    xs = tuple(jnp.swapaxes(a, 0, 1) for a in
               (rewards.astype(jnp.float32), values.astype(jnp.float32), mask, trial_ids, boot,
                has_next))
    _, (adv, decay) = jax.lax.scan(step, init, xs, reverse=True)
    adv, decay = jnp.swapaxes(adv, 0, 1), jnp.swapaxes(decay, 0, 1)
    if linked:  # one more piece resolved per pass, until nothing changes. Two consecutive
        # pieces never share a row (together they overflow it), so a chain has at most 2B + 1.
        def resolve(state):
            full, _, passes = state
            new = adv + decay * full.reshape(-1)[link].reshape(adv.shape)
            return new, jnp.any(new != full), passes + 1

        adv, _, _ = jax.lax.while_loop(lambda st: st[1] & (st[2] <= 2 * b + 1), resolve,
                                       (adv, jnp.array(True), 0))
    return adv, (adv + values) * mask


def policy_loss(logp, old_logp, advantages, mask, clip_eps: float, tis_weights=None):
    """Clipped surrogate (symmetric eps), token-mean. Returns (loss, clip fraction, approx KL).
    tis_weights: truncated importance weights (no gradient) for off-policy rollouts."""
    log_ratio = logp - old_logp
    ratio = jnp.exp(log_ratio)
    unclipped = -advantages * ratio
    clipped = -advantages * jnp.clip(ratio, 1.0 - clip_eps, 1.0 + clip_eps)
    per_token = jnp.maximum(unclipped, clipped)
    if tis_weights is not None:
        per_token = per_token * jax.lax.stop_gradient(tis_weights)
    loss = masked_mean(per_token, mask)
    clip_frac = masked_mean((clipped > unclipped).astype(jnp.float32), mask)
    approx_kl = masked_mean(0.5 * jnp.square(log_ratio), mask)
    return loss, clip_frac, approx_kl


def value_loss(values, old_values, returns, mask, clip: float):
    """0.5 * max(unclipped, clipped) squared error, token-mean; clip <= 0 turns clipping off.
    Returns (loss, fraction of tokens where the clipped term won)."""
    unclipped = jnp.square(values - returns)
    if clip <= 0:
        return 0.5 * masked_mean(unclipped, mask), jnp.zeros((), jnp.float32)
    clipped_values = old_values + jnp.clip(values - old_values, -clip, clip)
    clipped = jnp.square(clipped_values - returns)
    loss = 0.5 * masked_mean(jnp.maximum(unclipped, clipped), mask)
    return loss, masked_mean((clipped > unclipped).astype(jnp.float32), mask)


def truncated_importance_weights(old_logp, rollout_logp, cap: float):
    """min(pi_old / pi_rollout, cap): corrects for the rollout's different numerics/policy."""
    return jnp.minimum(jnp.exp(old_logp - rollout_logp), cap)


def k3_kl(logp_p, logp_q):
    """Schulman's k3 estimate of KL(q || p) from samples of q: (r - 1) - log r, r = p / q."""
    log_ratio = logp_p - logp_q
    return jnp.expm1(log_ratio) - log_ratio


def entropy(logits, temperature: float = 1.0):
    """Per-token entropy of softmax(logits / T), float32."""
    scaled = logits.astype(jnp.float32) / temperature
    logp = jax.nn.log_softmax(scaled, axis=-1)
    return -jnp.sum(jnp.exp(logp) * logp, axis=-1)


def explained_variance(values, returns, mask):
    """1 - Var(returns - values) / Var(returns): 1 is perfect, 0 is a constant, < 0 worse.
    NaN when the returns do not vary (e.g. every trial got the same reward): undefined, and a
    huge negative number there would only drown the curve."""
    var_returns = masked_var(returns, mask)
    ev = 1.0 - masked_var(returns - values, mask) / jnp.maximum(var_returns, 1e-8)
    return jnp.where(var_returns > 1e-6, ev, jnp.nan)
