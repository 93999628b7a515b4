"""t1jax: train long-horizon terminal agents with PPO on Mixture-of-Experts models in JAX.

checkpoint.py: Orbax checkpoints for the trainer (keep-N, async, crash-safe, sharded), one item per
  state key so a later stage restores only the parts it needs (e.g. the warmed-up critic).
distributed.py: joins a multi-process JAX job from the environment before any device is touched,
  so every process sees the one global mesh; `is_main()` says who writes shared files.
faults.py: kills the process at a named point when T1JAX_KILL_AT is set, so the chaos tests can
  preempt a job where they choose.
metrics_log.py: per-step training metrics as metrics.jsonl (what scripts and tests read back) and
  TensorBoard events, truncated on resume so each step keeps one row.
sharding.py: mesh construction and the one table mapping logical axis names to mesh axes, so
  model code never names the mesh and one table serves every mesh.
jobs/: what experiments/run.py runs, one module per mode, and what the jobs build from a config.
model/: the policy and critic network (Qwen3-MoE / Qwen3.5-MoE in Flax NNX) and its HF I/O.
report/: what a run leaves for people to read (summary.md, plots, trajectory viewer), and run
  comparisons.
rl/: training: Samples packed into batches, PPO and the critic, the sharded trainer, the loop.
rollout/: engines, the agent harnesses, TITO, the rollout scheduler, Samples on disk, evaluation.
sandbox/: Docker and bubblewrap sandboxes where agents' commands and tasks' tests run.
curation/: what runs trials over tasks to make, check and rank a pool (validation, synthesis,
  audit, generated families, the TFDS pool).
tasks/: the task format, pools, their sampling and decontamination (the bottom floor).
verify/: grading a finished episode: the verifier, per-assertion results, the dense reward.
"""
