"""Curation: the tools that run trials over tasks to make, check and rank a training pool
(validation by oracle and do-nothing agents, recursive synthesis, the quality audit, the
generated task families, the pool as a TFDS dataset). They sit above rollout (they play
episodes) and below the jobs; the task format itself is t1jax.tasks.

audit.py: scores every task on eight quality dimensions and hard-rejects tasks that would teach
  the wrong thing even though they validate.
audit_static.py: the audit's static reads of a task directory: hidden requirements, test or
  solution files leaking into the agent's image, substance of solution and instruction.
families.py: generated task families for the tiny setting: short shell skills a small model
  learns on CPUs, in the Harbor layout, with a held-out split.
llm.py: a tiny client for OpenAI-compatible chat servers (urllib, no new dependencies), for task
  synthesis and the audit's judge.
synth.py: recursive task synthesis (T1's RST): rewrites of accepted tasks, each validated in
  sandboxes, seed the next round.
synth_operators.py: rewrite operators that extend a task's workflow by one step, changing its
  instruction, solution and tests together.
tfds_pool.py: the training pool as a fixed TFDS (array_record) dataset in quality-rank order,
  with the dense reward's global scale in its metadata.
validate.py: pool validation: oracle and do-nothing agents on every task; a task is healthy only
  if its verifier tells done from not done.
"""
