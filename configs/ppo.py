"""Train with the T1 recipe's stages on the tiny model (CPU). One file, three stages:

  # SFT warm start on oracle solutions turned into agent conversations
  python experiments/run.py --config configs/ppo.py:sft --workdir runs/sft
  # Critic Warm-Up: the critic alone on rollouts of the frozen SFT policy
  python experiments/run.py --config configs/ppo.py:critic_warmup --workdir runs/warmup \
      --config.init.actor=runs/sft/checkpoints
  # PPO from the SFT actor and the warmed-up critic (parameters only)
  python experiments/run.py --config configs/ppo.py --workdir runs/ppo \
      --config.init.actor=runs/sft/checkpoints --config.init.critic=runs/warmup/checkpoints

Re-running a command with the same workdir resumes from its last checkpoint. Ablations are
flags: --config.rl.r3=False, --config.rl.tis=True, --config.schedule=one_step_off, ...
Replay recorded rollouts (no sandboxes): --config.rollouts.source=recorded
--config.rollouts.recorded_dir=runs/ppo/rollouts
"""

import ml_collections

from configs.common import (check_variant, context_config, rl_config, sandbox_config,
                            verifier_config)
from configs.model import tiny


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    check_variant("ppo", arg, ("ppo", "critic_warmup", "sft"))
    config = ml_collections.ConfigDict()
    config.mode = "train"
    config.stage = arg or "ppo"  # ppo | critic_warmup | sft
    config.seed = 0
    config.steps = {"sft": 40, "critic_warmup": 4}.get(config.stage, 8)
    config.schedule = "sync"  # sync | one_step_off (rollouts of t+1 overlap training of t)

    base = tiny.get_config()
    config.model, config.mesh = base.model, base.mesh

    config.rl = rl_config()
    config.rl.actor_lr = 1e-4  # tiny models want far larger steps than T1's 122B
    config.rl.critic_lr = 1e-4
    config.rl.max_length = 2048  # the agent prompt alone is ~1.1k tokens of this tokenizer

    config.rollouts = ml_collections.ConfigDict()
    config.rollouts.source = "live"  # live (engine + sandboxes) | recorded
    config.rollouts.recorded_dir = ""  # step_*/ folders of .npz samples (what live writes)
    config.rollouts.pool_dir = ""  # default: the bundled tasks
    config.rollouts.task_filter = ""  # comma-separated task ids; "" = all
    config.rollouts.heldout_dirs = ""  # comma-separated benchmark dirs never to train on
    config.rollouts.tokenizer = ""  # tokenizer.json (default: trained offline, cached)
    # qwen3_json | qwen3_xml; "": the checkpoint's (init.hf_path) or tokenizer folder's chat
    # template says (t1jax/rollout/chat.py), else qwen3_json
    config.rollouts.tool_format = ""
    config.rollouts.batch_size = 4  # trials per step (one sample per trial)
    config.rollouts.group_size = 1  # trials of each task per step (rl.baseline="task" uses them)
    config.rollouts.oversample = 1.5  # launch this many times more, admit the first to finish
    config.rollouts.carry_over = True  # unfinished trials continue next step (not dropped)
    config.rollouts.max_turns = 8
    config.rollouts.max_new_tokens = 96  # per turn
    config.rollouts.tito = True  # False: re-render and re-encode text every turn (an ablation)
    config.rollouts.sampling_seed = -1  # -1: from config.seed and the stage; >= 0: this, every stage
    context_config(config.rollouts)
    config.rollouts.engine = "embedded"  # embedded (in-process JAX) | fleet (HTTP servers)
    config.rollouts.engine_batch = 8  # sequences the embedded engine decodes together
    config.rollouts.fleet_urls = ""  # comma-separated SGLang / t1jax server urls (fleet)
    # an SGLang model gateway in front of them (smg >= 1.13, --policy consistent_hashing):
    # generation goes through it, weights are published to every fleet_urls server
    config.rollouts.fleet_router = ""
    config.rollouts.fleet_timeout_s = 300.0  # per HTTP call to a fleet server
    config.rollouts.fleet_retries = 2  # extra attempts on other servers after a failure
    config.rollouts.weights_dir = ""  # disk the servers share, for published weights

    config.sft = ml_collections.ConfigDict()
    config.sft.data_dir = ""  # .npz samples; default: build from oracle solutions in workdir
    config.sft.batch_size = 4
    config.sft.lr = 3e-4
    config.sft.lr_schedule = "constant"  # constant | cosine (to 0 at the last step)

    config.init = ml_collections.ConfigDict()
    config.init.actor = ""  # checkpoints dir whose actor starts the policy (SFT warm start)
    config.init.hf_path = ""  # or a Hugging Face model dir (safetensors + config.json)
    config.init.critic = ""  # checkpoints dir whose critic parameters start the critic

    config.checkpoint = ml_collections.ConfigDict()
    config.checkpoint.every = 1
    config.checkpoint.keep = 3
    config.checkpoint.async_save = True

    config.sandbox = sandbox_config()
    config.sandbox.concurrency = 2
    config.verifier = verifier_config()
    return config
