"""The T1 recipe on Qwen3-30B-A3B: one 8-GPU trainer node + an SGLang rollout fleet + Docker hosts.

Stages, each resumable from its workdir (see BUILD.md "Real scale" for installs and the fleet):

  # 0. the fleet serves the base model with routed-expert capture (one server per GPU node)
  python -m sglang.launch_server --model-path /shared/Qwen3-30B-A3B \
      --enable-return-routed-experts --port 30000 --tp 8
  # 1. SFT warm start (oracle solutions of the pool as agent conversations)
  python experiments/run.py --config configs/qwen3_30b_a3b.py:sft --workdir /ckpt/sft \
      --config.init.hf_path=/shared/Qwen3-30B-A3B --config.rollouts.pool_dir=/data/pool
  # 2. Critic Warm-Up on the frozen SFT policy's rollouts
  python experiments/run.py --config configs/qwen3_30b_a3b.py:critic_warmup \
      --workdir /ckpt/warmup --config.init.actor=/ckpt/sft/checkpoints \
      --config.rollouts.fleet_urls=http://gpu1:30000,http://gpu2:30000 \
      --config.rollouts.pool_dir=/data/pool
  # 3. PPO, one step off-policy, weights published to the fleet after every step
  python experiments/run.py --config configs/qwen3_30b_a3b.py --workdir /ckpt/ppo \
      --config.init.actor=/ckpt/sft/checkpoints --config.init.critic=/ckpt/warmup/checkpoints \
      --config.rollouts.fleet_urls=http://gpu1:30000,http://gpu2:30000 \
      --config.rollouts.pool_dir=/data/pool

Sizes are ours, chosen for 8xH200 (the T1 report does not state its batch or learning rates):
the mesh is configs/model/qwen3_30b_a3b.py:gpu (expert=8). A rollout batch of 64 trials, 1.5x
oversampled with carry-over, up to 100 turns of 1k new tokens in a 32k context.
"""

import ml_collections

from configs.common import rl_config, sandbox_config
from configs.model import qwen3_30b_a3b


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    from configs import ppo
    config = ppo.get_config(arg)  # same fields as the tiny trainer: one job, other sizes
    config.steps = {"sft": 2000, "critic_warmup": 40}.get(config.stage, 400)
    config.schedule = "one_step_off"

    base = qwen3_30b_a3b.get_config("gpu")
    config.model, config.mesh = base.model, base.mesh
    config.mesh.devices = "gpu"
    config.model.param_dtype = "bfloat16"
    config.model.compute_dtype = "bfloat16"

    config.rl = rl_config()
    config.rl.actor_lr = 1e-6
    config.rl.critic_lr = 5e-6
    config.rl.max_length = 32768
    config.rl.min_length = 4096
    config.rl.minibatches = 4
    config.rl.overlong = "drop"  # counted in batch/dropped_overlong

    r = config.rollouts
    r.engine = "fleet"  # --config.rollouts.fleet_urls=... (required)
    r.weights_dir = "/shared/t1jax/published"  # a disk every SGLang host mounts
    r.tokenizer = "/shared/Qwen3-30B-A3B/tokenizer.json"
    r.batch_size = 64
    r.oversample = 1.5
    r.max_turns = 100
    r.max_new_tokens = 1024

    config.sft.batch_size = 32
    config.sft.lr = 1e-5

    config.checkpoint.every = 10
    config.checkpoint.keep = 3

    config.sandbox = sandbox_config()
    config.sandbox.concurrency = 96  # >= batch_size x oversample; DOCKER_HOST may be remote
    config.sandbox.command_timeout_s = 600.0
    return config
