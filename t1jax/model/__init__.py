"""The policy model: Qwen3-MoE building blocks in Flax NNX."""
