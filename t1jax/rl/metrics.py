"""What tells a PPO run on an MoE policy is healthy: the train-inference mismatch (T1's log-prob
gap, its max, a k3 KL estimate, how often the trainer's own experts differ from the rollout's)
computed on device, and per-step sample statistics (reward, turns, length) on the host."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from t1jax.rl import ppo


def _mean_or_nan(x, mask):
    """The masked mean; NaN where nothing is masked in, so that a measurement not taken (no
    such tokens this step) never reads as a perfect 0."""
    n = jnp.sum(mask)
    return jnp.where(n > 0, jnp.sum(x * mask) / jnp.maximum(n, 1.0), jnp.nan)


def mismatch(train_logp, rollout_logp, mask, free_routes, rollout_routes, valid):
    """Train-vs-rollout metrics on the sampled tokens in `mask`, plus routing disagreement: the
    fraction of (token, MoE layer) pairs with a recorded rollout expert set where the trainer's
    own top-k is a different set (measured on the free router even when replaying). The trainer
    passes only trials the trained weights sampled (same weights: numeric and routing mismatch
    alone, T1's measure); NaN where there are none (one-step-off). Both sides are
    log_softmax(logits / T) over the vocabulary where rollout/logprobs_full_vocab is 1."""
    gap = jnp.abs(train_logp - rollout_logp)
    recorded = jnp.all(rollout_routes >= 0, axis=-1) & valid[..., None]
    differs = jnp.any(jnp.sort(free_routes, -1) != jnp.sort(rollout_routes, -1), axis=-1)
    pairs = jnp.maximum(jnp.sum(recorded), 1)
    return {
        "mismatch/logprob_gap": _mean_or_nan(gap, mask),
        "mismatch/logprob_gap_max": jnp.where(jnp.sum(mask) > 0,
                                              jnp.max(jnp.where(mask > 0, gap, 0.0)), jnp.nan),
        "mismatch/k3_kl": _mean_or_nan(ppo.k3_kl(train_logp, rollout_logp), mask),
        "mismatch/routing_disagreement": jnp.sum(differs & recorded) / pairs,
        "mismatch/routed_pairs": jnp.sum(recorded),
        "mismatch/sampled_tokens": jnp.sum(mask),
    }


NOT_MEASURED = {  # metric -> the count that says whether it was measured this step
    "mismatch/logprob_gap": "mismatch/sampled_tokens",
    "mismatch/logprob_gap_max": "mismatch/sampled_tokens",
    "mismatch/k3_kl": "mismatch/sampled_tokens",
    "staleness/logprob_gap": "staleness/sampled_frac",
    "staleness/k3_kl": "staleness/sampled_frac",
}


def drop_unmeasured(metrics: dict) -> dict:
    """Leave out the gaps of a step that had no tokens of their kind (no stale trial in a sync
    step, no fresh one under one-step-off): absent, not NaN and never 0. A NaN with tokens
    behind it (a real blow-up) stays."""
    return {k: v for k, v in metrics.items()
            if not (k in NOT_MEASURED and metrics.get(NOT_MEASURED[k], 1) == 0)}


def stale_mismatch(train_logp, rollout_logp, mask, stale):
    """The same log-prob gap and k3 KL on the trials older weights sampled (Batch.stale):
    staleness (the updates since) plus numeric mismatch, which cannot be told apart without the
    old weights. Kept out of mismatch/* so that stays comparable with T1's 0.021 / 0.013."""
    m = mask * stale
    return {"staleness/logprob_gap": _mean_or_nan(jnp.abs(train_logp - rollout_logp), m),
            "staleness/k3_kl": _mean_or_nan(ppo.k3_kl(train_logp, rollout_logp), m),
            "staleness/sampled_frac": jnp.sum(m) / jnp.maximum(jnp.sum(mask), 1.0)}


def update_movement(before_logp, after_logp, advantages, mask) -> dict:
    """How far and which way one PPO step moved the policy, on the batch's sampled tokens.
    update/kl: k3 estimate of KL(before || after) (the tokens were sampled from about
    `before`); update/logp_delta_pos|neg: the mean log-prob change of the tokens with a
    positive / negative advantage (a working step raises the first and lowers the second)."""
    delta = after_logp - before_logp
    pos, neg = mask * (advantages > 0), mask * (advantages < 0)
    return {"update/kl": ppo.masked_mean(ppo.k3_kl(after_logp, before_logp), mask),
            "update/logp_delta_pos": _mean_or_nan(delta, pos),
            "update/logp_delta_neg": _mean_or_nan(delta, neg),
            "update/positive_frac": jnp.sum(pos) / jnp.maximum(jnp.sum(mask), 1.0)}


def by_family(samples) -> dict:
    """Mean reward and resolved rate per task family (metadata "category"): which families a
    step pushed up or down (the step's mean hides a family that always loses)."""
    groups: dict = {}
    for s in samples:
        family = s.metadata.get("category")
        if family:
            solved = bool((s.metadata.get("verifier") or {}).get("solved", False))
            groups.setdefault(family, []).append((s.reward, solved))
    out = {}
    for family, rows in sorted(groups.items()):
        rewards, solved = zip(*rows)
        out[f"family/{family}/reward"] = float(np.mean(rewards))
        out[f"family/{family}/resolved"] = float(np.mean(solved))
        out[f"family/{family}/trials"] = len(rows)
    return out


def sample_stats(samples) -> dict:
    """Reward, resolution, turns, length and retokenized drift of one step's trials (host)."""
    rewards = np.array([s.reward for s in samples], np.float64)
    lengths = np.array([len(s.tokens) for s in samples])
    sampled = np.array([int(s.loss_mask.sum()) for s in samples])
    turns = np.array([s.metadata.get("turns", 0) or 0 for s in samples])
    chunks = np.array([len(s.chunk_starts) for s in samples])
    compactions = np.array([s.metadata.get("compactions", 0) or 0 for s in samples])
    chunk_tokens = np.array([n for s in samples for n in np.diff([*s.chunk_starts,
                                                                  len(s.tokens)])])
    drift = np.array([s.metadata.get("retokenized_drift", 0) or 0 for s in samples])
    route_drift = sum(int(s.metadata.get("route_drift", 0) or 0) for s in samples)
    # samples recorded before route_compared existed compared every overlapping position
    unmeasured = all(s.metadata.get("route_compared", 1) == 0 for s in samples)
    full_vocab = np.mean([s.metadata.get("logprobs", "full") == "full" for s in samples])
    resolved = [bool((s.metadata.get("verifier") or {}).get("solved", False))
                for s in samples]
    return {
        "reward/mean": rewards.mean(), "reward/std": rewards.std(), "reward/min": rewards.min(),
        "reward/max": rewards.max(), "reward/resolved": float(np.mean(resolved)),
        "trials": len(samples), "turns/mean": turns.mean(), "turns/max": turns.max(),
        "length/mean": lengths.mean(), "length/max": lengths.max(),
        "length/sampled_tokens": sampled.mean(), "chunks/mean": chunks.mean(),
        "chunks/max": chunks.max(), "chunks/compactions": compactions.mean(),
        "chunks/tokens_mean": chunk_tokens.mean(), "chunks/tokens_max": chunk_tokens.max(),
        "rollout/retokenized_drift": drift.mean(),
        # positions of the step's trials whose route a later call of the trial recomputed
        # differently (a prefix re-prefilled after its cache row was evicted): 0 when every
        # position is run once per trial, so the replayed route is the one sampled under.
        # NaN when no call returned an earlier position's routes again (a fleet sends each
        # position's once: routed_experts_start_len), so nothing could be compared
        "rollout/route_drift": float("nan") if unmeasured else float(route_drift),
        # 1: every trial's log-probs are log_softmax(logits / T) over the vocabulary, as the
        # trainer recomputes them (SGLang's, the JaxEngine's default), so mismatch/logprob_gap
        # is numerics and routing only; below 1, some were renormalised over top-k / top-p
        "rollout/logprobs_full_vocab": float(full_vocab), **by_family(samples),
    }

