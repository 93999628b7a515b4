"""Rollout: the engine contract, the embedded JAX engine, the chat template, and TITO."""
