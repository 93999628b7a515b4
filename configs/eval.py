"""Evaluate a policy on any Harbor / Terminal-Bench directory, T1 style (fresh sandbox per
trial, `attempts` trials per task averaged); writes trials.jsonl, summary.json, summary.md and
samples/*.npz to the workdir.

  # a training run's latest checkpoint on the bundled tasks, Terminus-2 harness
  python experiments/run.py --config configs/eval.py --workdir runs/eval-ppo \
      --config.policy.checkpoint=runs/ppo/checkpoints --config.harness=terminus
  # Terminal-Bench 2.1 through an SGLang fleet that already serves the policy, on a machine
  # that reaches Docker Hub and the internet (:offline where neither is reachable; BUILD.md)
  python experiments/run.py --config configs/eval.py:online --workdir runs/eval-tb21 \
      --config.tasks=/path/to/terminal-bench-2-1 --config.rollouts.engine=fleet \
      --config.rollouts.fleet_urls=http://host1:30000,http://host2:30000
  # the untrained base of the tiny setting (random init), quick smoke
  python experiments/run.py --config configs/eval.py:smoke --workdir runs/eval-smoke

How trials are rolled out (engine, fleet, tokenizer, tool format, system prompt, turns, reply
length, compaction) is the `rollouts` block and how the policy is evaluated (attempts,
temperature, top_p, sampling seed) the `eval` block, both spelled as the recipe configs spell
them (configs/common.py), as is `init.hf_path`: a flag means one thing in every job.
"""

import ml_collections

from configs.common import check_variant, eval_config, rollouts_config, sandbox_config, verifier_config
from configs.model import tiny


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    check_variant("eval", arg, ("smoke", "online", "offline"))
    config = ml_collections.ConfigDict()
    config.mode = "eval"
    config.label = ""  # names the evaluated policy in the outputs; default: derived
    config.run_id = ""  # default: derived from the workdir name and the time
    config.seed = 0  # the random init when no policy is given
    config.tasks = ""  # a Harbor / Terminal-Bench directory; default: the bundled seed tasks
    config.task_filter = ""  # comma-separated task ids; "" = all
    config.skip_invalid_tasks = False  # True: report malformed tasks and evaluate the rest
    config.internet_tasks = "skip"  # skip | run (offline anyway) tasks with allow_internet

    base = tiny.get_config()
    config.model, config.mesh = base.model, base.mesh  # the policy's architecture

    config.policy = ml_collections.ConfigDict()
    config.policy.checkpoint = ""  # a training run's checkpoints/ dir (Orbax, its actor)
    config.policy.step = -1  # that run's step; -1 = the latest finished one
    config.init = ml_collections.ConfigDict()
    config.init.hf_path = ""  # or an HF safetensors dir; neither = random init (seed)

    # as the recipe configs spell it (configs/common.py): engine, fleet, tokenizer ("": the
    # cached offline one of the tiny setting), tool format, system prompt, turns, compaction
    config.rollouts = r = rollouts_config()
    r.max_new_tokens = 256
    r.max_turns = 50

    config.harness = "terminus"  # terminus (Terminus-2 JSON replies, as T1 reports) | tools
    config.eval = eval_config()  # attempts, temperature, top_p, timeout_s, sampling_seed
    config.eval.max_tokens = 2048  # token budget of a trial (every chunk; a terminus chunk)

    config.sandbox = sandbox_config()
    config.verifier = verifier_config()

    if arg == "smoke":  # two tasks, one attempt, a few short turns
        config.task_filter = "count-log-errors,organize-files"
        config.eval.attempts = 1
        config.rollouts.max_turns = 2
        config.rollouts.max_new_tokens = 16
        config.harness = "tools"
    elif arg == "online":  # Terminal-Bench 2.x as Harbor runs it, where the registry and the
        # internet are reachable: the tasks' prebuilt images, network as each task allows,
        # test.sh as written (it fetches uv and pytest)
        config.sandbox.registry = True
        config.sandbox.allow_network = True
        config.sandbox.build_network = "host"
        config.internet_tasks = "run"  # verifier.mode stays "script": test.sh as written
    elif arg == "offline":  # no registry, no internet (this machine, air-gapped clusters):
        # Dockerfiles built on local stand-in bases, sandboxes without network, test.sh as
        # written with offline stand-ins for the tools it fetches (t1jax/verify/offline);
        # sandbox.registry and allow_network stay False
        config.verifier.mode = "offline"
        config.internet_tasks = "run"
    return config
