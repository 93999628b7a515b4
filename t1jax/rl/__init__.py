"""Post-rollout data for training: SFT datasets from oracles and filtered rollouts."""
