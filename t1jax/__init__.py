"""t1jax: train long-horizon terminal agents with PPO on Mixture-of-Experts models in JAX."""
