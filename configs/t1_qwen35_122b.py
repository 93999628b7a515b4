"""The T1 report's setting: Qwen3.5-122B-A10B, PPO with R3, TITO and the dense reward, a separate
full-size critic, one step off-policy against an SGLang fleet, hundreds of turns per trial.

Launch: the main job's phases (configs/tiny_cpu.py, one driver) at this size; every phase
resumes from the workdir (BUILD.md "Real scale" covers installs, the pool and the fleet). T1's
trainer is 8 nodes x 8 H200, one JAX job of 8 or 64 processes (BUILD.md "Accelerators": the
same command on every process; oversampled admission is decided over all of them). The fleet
is 16 more nodes, one SGLang server (TP 8) each:

  # 0. the fleet, on each of its 16 nodes
  python -m sglang.launch_server --model-path /shared/Qwen3.5-122B-A10B \
      --enable-return-routed-experts --enable-deterministic-inference --host 0.0.0.0 \
      --port 30000 --tp 8
  # 1. pool, oracle, SFT, Critic Warm-Up, PPO, evaluations (on the fleet), report
  python experiments/run.py --config configs/t1_qwen35_122b.py --workdir /ckpt/t1 \
      --config.pool.dir=/data/pool --config.init.hf_path=/shared/Qwen3.5-122B-A10B \
      --config.rollouts.fleet_urls=http://fleet01:30000,...,http://fleet16:30000

What the report fixes, and this file follows: the model; PPO with symmetric clipping, Adam and
a constant learning rate; KL, entropy and load-balancing terms off; the critic trained first each
step from Critic Warm-Up weights; one sample per task; the dense reward on a fixed global scale;
oversampling (admit the first trials to finish); up to 300+ tool calls per trial.
What it does not state, and is ours: batch size, learning rates, context and per-turn budgets,
fleet size and the meshes. Memory (bf16 weights, fp32 Adam moments, ~12 bytes/param): actor
1.47 TB + critic 1.47 TB (no frozen reference: KL is off); over 64 H200 (expert=8
x fsdp=8) that is ~46 GB/GPU of state before activations. The ahead-of-time TPU check
(`.venv-tpu/bin/python experiments/run.py --config configs/t1_qwen35_122b.py --workdir
runs/aot_t1 --config.phases=aot`; BUILD.md, "Ahead-of-time TPU checks") compiles this config's actor step on v5p-256 (mesh
1,16,8,1, one 64k-token row per chip) at 99.3 GB of the 102.0 GB (95 GiB) a chip offers, with
the 48 saved layer inputs (19.3 GB) in host memory; the 8-GPU-per-node mesh above is not
checked that way (no GPU compiler here).
Not run on GPUs here.

Known gap: our pinned chat template (t1jax/rollout/chat.py) renders Qwen2.5/3-style JSON tool
calls, while Qwen3.5's own template uses XML function calls; the SFT stage teaches the pinned
format, but the base model's zero-shot numbers under our tool harness are not Qwen's.
"""

import ml_collections

from configs.common import check_variant
from configs.model import qwen3_5_122b_a10b


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    from configs import qwen3_30b_a3b
    check_variant("t1_qwen35_122b", arg)
    config = qwen3_30b_a3b.get_config()  # the recipe at real scale; this model, these sizes

    base = qwen3_5_122b_a10b.get_config("gpu")
    config.model = base.model
    # 64 GPUs: experts 8-way inside a node's NVLink domain, everything else 8-way across nodes
    config.mesh = ml_collections.ConfigDict(dict(data=1, fsdp=8, expert=8, tensor=1,
                                                 devices="gpu"))
    # the fit check (--config.phases=aot): no GPU compiler here; v5p-256 (128 chips on 32
    # hosts), experts 8-way, everything else 16-way
    config.aot.topology, config.aot.mesh = "v5p:4x4x8", "1,16,8,1"
    # a 64k-token row per chip (BUILD.md, "Ahead-of-time TPU checks"): the 48 saved layer
    # inputs (19 GB per chip) wait in host memory; experts stay put, tokens travel in chunks
    config.model.moe_sharding = "gather_tokens"
    config.model.offload_layer_inputs = True

    # rl: the 30B's learning rates, minibatches and overlong rule, longer rows
    config.rl.max_length = 65536
    config.rl.min_length = 8192
    config.rl.logits_chunk = 1024

    r = config.rollouts
    r.tokenizer = "/shared/Qwen3.5-122B-A10B/tokenizer.json"
    r.batch_size = 128
    r.max_turns = 320
    r.max_new_tokens = 2048
    config.init.hf_path = "/shared/Qwen3.5-122B-A10B"

    config.sft.batch_size = 64
    config.sft.lr = 5e-6
    config.ppo.steps = 500

    config.sandbox.concurrency = 192  # >= batch_size x oversample; DOCKER_HOST may be remote
    return config
