"""Training from rollouts: Samples packed into batches, PPO and the critic, the sharded trainer
and its loop, and SFT data from filtered rollouts.

batch.py: Samples packed into padded rows of a few fixed shapes (so compiled steps are reused),
  with what GAE needs to follow a trial across rows and chunks.
critic.py: the critic's values and loss, shared by the PPO step and Critic Warm-Up so PPO goes on
  with the warmed-up critic.
loop.py: the training loop (collect, train, publish weights, checkpoint, metrics) over any
  RolloutSource, sync or one step off, resumable.
metrics.py: what tells a PPO run on an MoE policy is healthy: train-inference mismatch (on
  device) and sample statistics (on the host).
minibatch.py: a step's batch cut into strided minibatches and one model's updates scanned over
  them; knows nothing of PPO.
ppo.py: PPO's pieces (GAE, clipped policy and value losses, KL, entropy) as pure functions on
  token-indexed arrays.
sft_data.py: which rollout trials are good enough to imitate (rejection sampling) for SFT data.
shared_prefix.py: runs the tokens every row opens with once and broadcasts their cache, to cut a
  step's tokens when rows share a long prefix.
token_stats.py: per-token log-probs (and entropy, accuracy) from the LM head in sequence chunks,
  so the full float32 logits never exist.
trainer.py: the PPO actor-critic trainer: state, optimizers and the jitted, sharded PPO, Critic
  Warm-Up and SFT steps.
"""
