"""The T1 recipe on Qwen3-30B-A3B: the main job's phases (configs/tiny_cpu.py, one driver) at
real scale: one 8-GPU trainer node, an SGLang rollout fleet, Docker hosts for the sandboxes.

  # 0. the fleet serves the base model with routed-expert capture (one server per GPU node)
  python -m sglang.launch_server --model-path /shared/Qwen3-30B-A3B \
      --enable-return-routed-experts --enable-deterministic-inference --host 0.0.0.0 \
      --port 30000 --tp 8
  # 1. the whole recipe: pool, oracle, SFT, Critic Warm-Up, PPO, evaluations, report
  python experiments/run.py --config configs/qwen3_30b_a3b.py --workdir /ckpt/q30b \
      --config.pool.dir=/data/pool --config.init.hf_path=/shared/Qwen3-30B-A3B \
      --config.rollouts.fleet_urls=http://gpu1:30000,http://gpu2:30000

Every phase resumes from the workdir: re-run the same command after an interruption. Run a
subset with --config.phases=pool,oracle,sft (phases: pool, oracle, sft, warmup, ppo, eval,
report). /data/pool holds train/, heldout/ (the test split, e.g. Terminal-Bench 2.1's tasks)
and optionally validation/ (PPO's periodic evaluations; settings are chosen on it), each a
folder of Harbor-format task folders; the pool phase refuses a train split that overlaps the
others. SFT plays the train split's reference solutions through the agent loop; every
evaluation (base, SFT, PPO) publishes that policy to the fleet and plays on it. As several
processes (two nodes of 4 GPUs, or one process per GPU): the same command on each, with the
variables BUILD.md "Accelerators" names.

Sizes are ours, chosen for 8xH200 (the T1 report does not state its batch or learning rates):
the mesh is configs/model/qwen3_30b_a3b.py:gpu (expert=8). A rollout batch of 64 trials, 1.5x
oversampled with carry-over, up to 100 turns of 1k new tokens in a 32k context.
"""

import ml_collections

from configs.common import check_variant, rl_config
from configs.model import qwen3_30b_a3b


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    check_variant("qwen3_30b_a3b", arg)
    from configs import tiny_cpu
    config = tiny_cpu.get_config()  # the main job's fields: one driver, other sizes
    config.schedule = "one_step_off"

    base = qwen3_30b_a3b.get_config("gpu")
    config.model, config.mesh = base.model, base.mesh
    config.mesh.devices = "gpu"  # (the model config holds bf16 params and compute)
    # the fit check (--config.phases=aot): the 8-GPU mesh has no compiler here; v5p-64
    # (32 chips on 8 hosts) with the experts 8-way as on the GPU node
    config.aot.topology, config.aot.mesh = "v5p:2x4x4", "1,4,8,1"

    config.pool.dir = "/data/pool"  # --config.pool.dir=...
    config.oracle.train_per_family = 2  # train tasks per category checked (-1: all)
    config.rollouts.system_prompt = ""  # the agent harness's own
    config.init.hf_path = "/shared/Qwen3-30B-A3B"

    # the defaults (t1jax.rl.trainer.Settings: actor_lr 1e-6, critic_lr 5e-6), not the tiny
    # model's choices
    config.rl = rl = rl_config()
    rl.max_length = 32768
    rl.min_length = 4096
    rl.minibatches = 4
    rl.overlong = "drop"  # counted in batch/dropped_overlong

    r = config.rollouts
    r.engine = "fleet"  # --config.rollouts.fleet_urls=... (required)
    r.weights_dir = "/shared/t1jax/published"  # a disk every SGLang host mounts
    r.tokenizer = "/shared/Qwen3-30B-A3B/tokenizer.json"
    r.batch_size = 64
    r.oversample = 1.5
    r.max_turns = 100
    r.max_new_tokens = 1024

    config.sft.steps = 2000
    config.sft.batch_size = 32
    config.sft.lr = 1e-5
    config.sft.lr_schedule = "constant"
    config.sft.checkpoint_every = 100
    config.sft.teacher_slips = False  # the slips are the generated families' own

    config.warmup.steps = 40
    config.ppo.steps = 400
    config.eval.attempts = 1
    config.eval.every = 20

    config.checkpoint.every = 10

    config.sandbox.concurrency = 96  # >= batch_size x oversample; DOCKER_HOST may be remote
    config.sandbox.command_timeout_s = 600.0
    return config
