"""Tasks: the task format (one task directory, Harbor / Terminal-Bench layouts), pools of
tasks, their sampling and decontamination: the bottom floor that sandboxes, verifiers and
rollouts read. What runs trials over tasks (validation, synthesis, audit, the generated
families) is t1jax.curation, a floor above rollout.

decontam.py: finds training tasks that overlap held-out benchmark tasks (names, instructions,
  test files), so benchmark scores stay meaningful.
pool.py: every task directory under a root loaded and validated together, so every bad task is
  reported in one pass and no two share a task_id.
sampler.py: a resumable, seeded epoch sampler over a pool, so the pool's quality-rank order does
  not decide what is trained first.
task.py: one task directory (Harbor / Terminal-Bench 2 or Terminal-Bench 1 layout) validated
  into frozen dataclasses, so a malformed task fails at load time.
seed_tasks/: the task directories bundled with t1jax (pool.default_pool_dir); not Python.
tb2_shaped/: eleven tasks of ours in the official Terminal-Bench 2.x layout, run offline in CI
  (its README.md); not Python.
"""
