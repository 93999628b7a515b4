"""Tasks: the task format, pools and their sampling, and the work on tasks: validation,
synthesis, audit, decontamination and generated task families.

audit.py: scores every task on eight quality dimensions and hard-rejects tasks that would teach
  the wrong thing even though they validate.
audit_static.py: the audit's static reads of a task directory: hidden requirements, test or
  solution files leaking into the agent's image, substance of solution and instruction.
decontam.py: finds training tasks that overlap held-out benchmark tasks (names, instructions,
  test files), so benchmark scores stay meaningful.
families.py: generated task families for the tiny setting: short shell skills a small model
  learns on CPUs, in the Harbor layout, with a held-out split.
llm.py: a tiny client for OpenAI-compatible chat servers (urllib, no new dependencies), for task
  synthesis and the audit's judge.
pool.py: every task directory under a root loaded and validated together, so every bad task is
  reported in one pass and no two share a task_id.
sampler.py: a resumable, seeded epoch sampler over a pool, so the pool's quality-rank order does
  not decide what is trained first.
synth.py: recursive task synthesis (T1's RST): rewrites of accepted tasks, each validated in
  sandboxes, seed the next round.
synth_operators.py: rewrite operators that extend a task's workflow by one step, changing its
  instruction, solution and tests together.
task.py: one task directory (Harbor / Terminal-Bench 2 or Terminal-Bench 1 layout) validated
  into frozen dataclasses, so a malformed task fails at load time.
tfds_pool.py: the training pool as a fixed TFDS (array_record) dataset in quality-rank order,
  with the dense reward's global scale in its metadata.
validate.py: pool validation: oracle and do-nothing agents on every task; a task is healthy only
  if its verifier tells done from not done.
seed_tasks/: the task directories bundled with t1jax (pool.default_pool_dir); not Python.
tb2_shaped/: eleven tasks of ours in the official Terminal-Bench 2.x layout, run offline in CI
  (its README.md); not Python.
"""
