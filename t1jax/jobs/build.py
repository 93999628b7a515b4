"""What the jobs build from a config, each written once: the sandbox backend and its limits, the
task stack trials run with (tasks, backend, tokenizer, reward scale), the device mesh, the
trainer and its starting weights, a policy restored from a checkpoint, and the live rollout
source. Heavy imports stay inside the functions, as in the jobs: a job pays only for what it
builds (the pool jobs never import JAX).
"""

from __future__ import annotations

import dataclasses
import os
import shutil
from pathlib import Path
from typing import Any

from absl import logging

from t1jax.jobs import UsageError

DEFAULT_TOKENIZER = Path.home() / ".cache" / "t1jax" / "tokenizer-512.json"


# -- sandboxes -----------------------------------------------------------------------------------
def sandbox_backend(sandbox):
    """The backend a config's `sandbox` block names (configs/common.py sandbox_config)."""
    from t1jax.sandbox import make_backend
    options = {}
    if sandbox.backend == "docker":
        options = dict(runtime=sandbox.runtime or None, build_network=sandbox.build_network,
                       base_map=base_map(sandbox.base_map), registry=sandbox.registry)
    return make_backend(sandbox.backend, **options)


def base_map(text: str) -> dict:
    """config.sandbox.base_map ("public=local,...") over the default map of public bases."""
    from t1jax.sandbox.images import DEFAULT_BASE_MAP
    out = dict(DEFAULT_BASE_MAP)
    for item in filter(None, (p.strip() for p in text.split(","))):
        public, sep, local = item.partition("=")
        if not sep or not public.strip() or not local.strip():
            raise UsageError(f"config.sandbox.base_map: {item!r} is not PUBLIC=LOCAL (e.g. "
                             "python:3.12-slim=t1jax/base:bookworm; *=IMAGE maps every other)")
        out[public.strip()] = local.strip()
    return out


def sandbox_limits(sandbox):
    """Per-sandbox limits from the same block (a task's own limits are applied on top)."""
    from t1jax.sandbox.base import Limits
    return Limits(pids=sandbox.pids, max_output_bytes=sandbox.max_output_bytes,
                  default_timeout_s=sandbox.command_timeout_s,
                  episode_output_bytes=sandbox.episode_output_bytes)


def reap_best_effort(backend, run_id: str | None = None) -> int:
    """Reap, as a safety net only: a race with another user of the daemon (a container that
    vanishes while the reaper lists them) must not end the job or mask its outcome."""
    try:
        return backend.reap(run_id)
    except Exception as err:  # noqa: BLE001 - cleanup
        logging.warning("could not reap sandboxes%s: %s", f" of {run_id}" if run_id else "", err)
        return 0


# -- tasks ---------------------------------------------------------------------------------------
def task_folder(config) -> Path:
    """config.tasks, the one spelling of a job's task folder (eval, oracle, pool, audit,
    synth): a Harbor / Terminal-Bench directory, or the bundled seed tasks when empty."""
    from t1jax.tasks.pool import default_pool_dir
    folder = Path(config.tasks) if config.tasks else default_pool_dir()
    if not folder.is_dir():
        raise UsageError(f"config.tasks={folder} is not a directory")
    return folder


def load_job_tasks(pool_dir, *, skip_invalid: bool, task_filter: str) -> list:
    """The tasks a job runs: the pool (malformed tasks reported, or skipped when asked),
    narrowed by `task_filter`; an unknown task id or an empty selection is a UsageError."""
    from t1jax.tasks.pool import load_pool, select_tasks
    loaded = load_pool(pool_dir, skip_invalid=skip_invalid)
    for err in loaded.errors:
        logging.warning("skipping %s", err)
    try:
        tasks = select_tasks(loaded.tasks, task_filter)
    except ValueError as err:
        raise UsageError(f"--config.{err}") from err
    if not tasks:
        raise UsageError(f"no tasks found in {pool_dir}")
    for line in grouped_warnings(tasks):
        logging.warning("%s", line)
    return tasks


def grouped_warnings(tasks) -> list[str]:
    """The loader's warnings once per run: each distinct warning with how many tasks gave it
    and the first few of them (89 official tasks give the same three, which one line each
    says, instead of 267 lines or none)."""
    by_text: dict[str, list[str]] = {}
    for task in tasks:
        for warning in task.warnings:
            by_text.setdefault(warning, []).append(task.task_id)
    lines = []
    for warning, ids in sorted(by_text.items(), key=lambda kv: (-len(kv[1]), kv[0])):
        named = ", ".join(ids[:3]) + (f", ... ({len(ids)} tasks)" if len(ids) > 3 else "")
        lines.append(f"task loader: {warning} [{named}]")
    return lines


def tokenizer(path: str = ""):
    """The tokenizer at `path` (default: the cached one), trained and saved there if absent."""
    from t1jax.rollout.tokenizer import load_or_train
    return load_or_train(path or str(DEFAULT_TOKENIZER))


@dataclasses.dataclass(frozen=True)
class TaskStack:
    """What running trials of `tasks` needs besides a policy."""
    tasks: list
    backend: Any  # the sandboxes dead runs left behind already removed
    tokenizer: Any  # None for a job that runs no policy (the oracle's validation)
    scale: Any  # the dense reward's fixed global scale over `tasks`
    limits: Any  # per sandbox, from config.sandbox

    def site(self, config, run_id: str, images=None):
        """Where this stack's trials run (rollout/trial.py TrialSite): its backend, limits and
        scale, config.sandbox's concurrency and network, `images` (a fan_out.Images shared
        with earlier calls; None: a fresh cache)."""
        return trial_site(config, self.backend, run_id=run_id, scale=self.scale,
                          images=images, limits=self.limits)


def trial_site(config, backend, *, run_id: str, scale=None, images=None, limits=None):
    """A TrialSite at `backend` with config.sandbox's limits (or `limits`), concurrency and
    network, labelling its sandboxes `run_id`, grading on `scale` (None: not graded)."""
    from t1jax.rollout.trial import TrialSite
    s = config.sandbox
    return TrialSite(backend, limits or sandbox_limits(s), run_id=run_id,
                     allow_network=s.allow_network, scale=scale, concurrency=s.concurrency,
                     images=images)


def task_stack(config, tasks, tokenizer=None) -> TaskStack:
    """`tasks` with config.sandbox's backend and limits and config.verifier's reward scale."""
    from t1jax.verify.reward import pool_scale
    backend = sandbox_backend(config.sandbox)
    reaped = backend.reap()
    if reaped:
        logging.info("removed %d sandboxes left behind by dead runs", reaped)
    scale = pool_scale(tasks, config.verifier.scale_quantile, config.verifier.global_scale)
    return TaskStack(list(tasks), backend, tokenizer, scale, sandbox_limits(config.sandbox))


# -- devices and weights -------------------------------------------------------------------------
def mesh_from(config, devices=None):
    """config.mesh over the first data * fsdp * expert * tensor of `devices`; by default those
    of the platform config.mesh.devices names, or, naming none, exactly every device."""
    from t1jax.sharding import mesh_from_config
    m = config.mesh
    if devices is None and m.get("devices"):
        import jax
        devices = jax.devices(m.devices)
    n = m.data * m.fsdp * m.expert * m.tensor
    return mesh_from_config(m, None if devices is None else list(devices)[:n])


def trainer(config, mesh, *, sft_steps: int | None = None):
    """A Trainer of config.model and config.rl on `mesh`, seeded by config.seed; with sft_steps,
    the actor learns at config.sft's rate, scheduled over that many steps."""
    from t1jax.model.config import model_config_from
    from t1jax.rl.trainer import Trainer, sft_learning_rate
    lr = (None if sft_steps is None else
          sft_learning_rate(config.sft.lr, config.sft.lr_schedule, sft_steps))
    return Trainer(model_config_from(config.model), config.rl, mesh, seed=config.seed,
                   actor_lr=lr)


def start_weights(trainer, checkpoints, *, hf_path: str = "", actor="", critic="",
                  reward_scale: float | None = None) -> None:
    """A fresh run's starting weights; none when `checkpoints` holds a finished step (the loop
    resumes from it). The policy (and the critic's backbone) from a Hugging Face directory
    (config.init.hf_path) or an earlier phase's actor (SFT), then its critic (Warm-Up),
    refused if that phase scored its trials on another dense-reward scale than `reward_scale`
    (this run's)."""
    from t1jax.checkpoint import Checkpointer, has_checkpoint
    from t1jax.rl import loop
    from t1jax.rollout.source import check_reward_scale
    if has_checkpoint(checkpoints):  # a finished step, not a folder
        return
    if critic and reward_scale is not None:
        with Checkpointer.reader(critic) as source:
            recorded = (source.restore_meta().get("source") or {}).get("reward_scale")
        try:
            check_reward_scale(recorded, reward_scale, f"the critic's run ({critic})")
        except ValueError as err:
            raise UsageError(f"the critic to start from ({critic}): {err}") from err
    if hf_path:
        if not Path(hf_path, "config.json").is_file():
            raise UsageError(f"config.init.hf_path={hf_path} has no config.json "
                             f"(a Hugging Face model directory)")
        logging.info("actor and critic backbone from %s", hf_path)
        loop.load_actor_hf(trainer, hf_path)
    if actor:
        logging.info("actor from %s (step %d)", actor, loop.load_actor_only(trainer, actor))
    if critic:
        logging.info("critic from %s (step %d)", critic, loop.load_critic_only(trainer, critic))


def policy(config, mesh=None):
    """A CausalLM of config.model at config.seed's initialisation (sharded over `mesh`)."""
    from flax import nnx

    from t1jax.model.config import model_config_from
    from t1jax.model.transformer import CausalLM
    cfg = model_config_from(config.model)
    if mesh is None:
        return CausalLM(cfg, nnx.Rngs(config.seed))
    from t1jax.sharding import create_sharded
    return create_sharded(lambda: CausalLM(cfg, nnx.Rngs(config.seed)), mesh)


def restored_actor(model, checkpoints, step: int | None = None):
    """`model` (a CausalLM) holding the actor of `checkpoints`' step `step` (default: the newest
    finished one), each array in the sharding of the model's own."""
    from flax import nnx

    from t1jax.checkpoint import Checkpointer, abstract_like
    _, params = nnx.split(model, nnx.Param)
    with Checkpointer.reader(checkpoints) as source:
        actor = source.restore_items({"actor": abstract_like(params)}, step)["actor"]
    nnx.update(model, actor)
    return model


def local_params(params):
    """`params` whole on this process's first device. In a multi-process job a model's global
    arrays span other hosts' devices and every use of them is a collective, so an engine that
    runs at its own pace on one process (embedded generation, evaluation) needs its own copy.
    Every process calls it (an allgather)."""
    import jax

    from t1jax import distributed
    return jax.device_put(distributed.host_copy(params), jax.local_devices()[0])


def local_model(model):
    """`model` (a CausalLM) with local_params of its parameters; itself in a single process."""
    from t1jax import distributed
    if distributed.process_count() == 1:
        return model
    from flax import nnx
    graphdef, params = nnx.split(model, nnx.Param)
    return nnx.merge(graphdef, local_params(params))


# what a model folder holds besides weights and config.json for a server to load it whole
# (SGLang reads the tokenizer and chat template from --model-path unless told not to)
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                   "vocab.json", "merges.txt", "chat_template.jinja", "generation_config.json")


def tokenizer_files(config) -> list[Path]:
    """The model's tokenizer and chat-template files: those beside config.rollouts.tokenizer,
    else in config.init.hf_path (none for a tokenizer of our own: the tiny model's)."""
    r, hf_path = config.rollouts, config.init.hf_path
    folder = Path(r.tokenizer).parent if r.tokenizer else Path(hf_path) if hf_path else None
    return [] if folder is None else [folder / n for n in TOKENIZER_FILES
                                      if (folder / n).is_file()]


def publish_weights(client, model, weights_dir: Path, version, extra_files=()) -> Path:
    """The policy as HF safetensors on a disk the fleet shares, loaded by every live server,
    with `extra_files` (tokenizer_files: the folder is then a whole model a server can be
    started on). Every process of a multi-process job calls it: each writes its shards
    (export_hf), process 0 has the servers load them, and every process learns which servers
    confirmed (each plays its own trials through its own client: none may send them to a
    server left on older weights) or the error, raised on all. Returns the checkpoint folder."""
    from t1jax import distributed
    from t1jax.model.hf_io import export_hf
    from t1jax.rollout.sglang import RolloutError
    version = str(version)
    path = export_hf(model, weights_dir / f"weights_{version}").resolve()
    outcome = None
    if distributed.is_main():
        for extra in extra_files:
            shutil.copyfile(extra, path / Path(extra).name)
        try:
            client.load_weights(path, version)
            outcome = ("ok", sorted(client.live))
        except RolloutError as err:
            outcome = ("error", str(err))
    kind, detail = distributed.allgather_objects(outcome)[0]
    if kind == "error":
        raise RolloutError(detail)
    client.confirmed(path, version, detail)
    return path


# -- live rollouts -------------------------------------------------------------------------------
def tool_format(config) -> str:
    """How the policy writes tool calls: config.rollouts.tool_format, else its base checkpoint's
    (config.init.hf_path) or tokenizer's chat template, else qwen3_json
    (chat.resolve_tool_format)."""
    from t1jax.rollout.chat import resolve_tool_format
    r = config.rollouts
    return resolve_tool_format(r.tool_format, config.init.hf_path, os.path.dirname(r.tokenizer))


def rollout_seed(config, stage: str) -> int:
    """config.rollouts.sampling_seed, or with -1 (the default) one derived from config.seed
    and the stage: two runs with one config.seed sample the same, and Warm-Up and PPO, whose
    first policy is the same SFT actor, never replay each other's trials."""
    from t1jax.rollout.engine import derived_seed
    seed = config.rollouts.sampling_seed
    return derived_seed(config.seed, f"rollouts/{stage}") if seed < 0 else int(seed)


def eval_seed(config) -> int:
    """config.eval.sampling_seed, or with -1 (the default) one derived from config.seed: every
    evaluation of a job (the recipe's base / SFT / PPO, the eval job's) draws the same random
    numbers per (task, attempt, turn), and another value is another draw of the same policies."""
    from t1jax.rollout.engine import derived_seed
    seed = config.eval.sampling_seed
    return derived_seed(config.seed, "eval") if seed < 0 else int(seed)


def verifier_settings(config):
    """config.verifier as the one VerifierSettings every trial of the job is verified with
    (its choices are checked by experiments/run.py before any job starts: check_verifier)."""
    from t1jax.verify.verifier import VerifierSettings
    return VerifierSettings(mode=config.verifier.mode, where=config.verifier.where)


def episode_settings(config, *, temperature: float, max_tokens: int, max_positions: int,
                     engine_len: int, top_p: float = 1.0, timeout_s: float = 0.0):
    """The job's one EpisodeSettings (t1jax/rollout/settings.py) from config.rollouts (turns,
    reply length, system prompt, tool format, TITO, context policy), config.sandbox (command
    timeout, observation cap) and config.verifier. The caller's: the sampling temperature and
    top_p, the trial's token budget (max_tokens) and wall clock (0: the task's): training
    samples at rl.temperature within rollouts.trial_tokens, an evaluation at eval.temperature
    within one engine context. A context policy's chunks fit max_positions (the model's) and
    engine_len (the engine's cache). A setting that cannot work is a UsageError."""
    from t1jax.rollout import context
    from t1jax.rollout.settings import EpisodeSettings
    r = config.rollouts
    try:
        policy = context.from_config(r, max_positions, engine_len)
        return EpisodeSettings(
            max_turns=r.max_turns, max_new_tokens=r.max_new_tokens, temperature=temperature,
            top_p=top_p, max_tokens=max_tokens, timeout_s=timeout_s or None,
            command_timeout_s=config.sandbox.command_timeout_s,
            max_observation_bytes=config.sandbox.max_output_bytes,
            system_prompt=r.system_prompt or None, tool_format=tool_format(config),
            tito=r.tito, context=policy, verifier=verifier_settings(config))
    except ValueError as err:
        raise UsageError(f"config.rollouts: {err}") from err


def fleet_client(rollouts, model_cfg):
    """A FleetClient over the comma-separated rollouts.fleet_urls (generating through
    rollouts.fleet_router if one is given), reading routes by the model's own config, with
    rollouts.fleet_timeout_s per HTTP call and rollouts.fleet_retries extra attempts."""
    from t1jax.rollout.sglang import FleetClient, RouteLayout
    r = rollouts
    return FleetClient(r.fleet_urls.split(","), RouteLayout.of(model_cfg),
                       router=r.fleet_router or None,
                       timeout_s=r.fleet_timeout_s, retries=r.fleet_retries)


def rollout_engine(config, max_len: int, model=None, *, model_cfg=None,
                   weight_version: str = "0"):
    """The rollouts block's engine over contexts of max_len tokens, written once for training,
    the recipe's evaluations and the eval job: the embedded JAX engine holding `model`
    (rollouts.engine_batch rows decoded together, its weights called weight_version), or with
    rollouts.engine='fleet' a FleetEngine over rollouts.fleet_urls, whose servers hold the
    policy (model_cfg: its routes' shape)."""
    r = config.rollouts
    if r.engine == "embedded":
        from t1jax.rollout.batching import embedded_engine
        return embedded_engine(model, max_batch=r.engine_batch, max_len=max_len,
                               weight_version=weight_version)
    if r.engine == "fleet":
        if not r.fleet_urls:
            raise UsageError("config.rollouts.engine='fleet' needs config.rollouts.fleet_urls")
        from t1jax.rollout.sglang import FleetEngine
        return FleetEngine(fleet_client(r, model_cfg), max_len)
    raise UsageError(f"config.rollouts.engine={r.engine!r}; choose embedded or fleet")


def live_rollouts(config, trainer, workdir: Path, stack: TaskStack, stage: str = "ppo"):
    """Rollouts of the stack's tasks by the trainer's policy (config.rollouts, config.sandbox,
    config.rl), sampled with rollout_seed(config, stage)."""
    from t1jax.rollout.scheduler import RolloutScheduler, episode_trial
    from t1jax.rollout.source import LiveRollouts
    from t1jax.tasks.sampler import EpochSampler
    from t1jax import distributed
    r = config.rollouts
    publish = None
    processes = (distributed.process_index(), distributed.process_count())
    if r.engine == "embedded" and processes[1] > 1:
        # each process generates alone, at its own pace, from its own whole copy of the policy
        from flax import nnx
        engine = rollout_engine(config, config.rl.max_length, nnx.merge(
            trainer.actor_def, local_params(trainer.state.actor)))

        def publish_local(trainer, version):
            engine.load_weights(local_params(trainer.state.actor), version)
        publish = publish_local
    elif r.engine == "embedded":
        engine = rollout_engine(config, config.rl.max_length, trainer.actor_model())
    else:
        engine = rollout_engine(config, config.rl.max_length, model_cfg=trainer.cfg)
        weights_dir = Path(r.weights_dir) if r.weights_dir else workdir / "published"

        previous = []  # what this job published last: once replaced, no server reads it

        def publish_to_fleet(trainer, version):
            path = publish_weights(engine.client, trainer.actor_model(), weights_dir, version,
                                   tokenizer_files(config))
            if previous and previous[-1] != path and distributed.is_main():
                shutil.rmtree(previous.pop(), ignore_errors=True)
            previous[:] = [path]
        publish = publish_to_fleet
    trial_tokens = r.trial_tokens or config.rl.max_length
    if trial_tokens > config.rl.max_length and r.compaction == "none":
        raise UsageError(f"config.rollouts.trial_tokens={trial_tokens} is more than one training "
                         f"row (rl.max_length={config.rl.max_length}): it needs a compaction "
                         "policy (config.rollouts.compaction), whose chunks each fit a row")
    episode = episode_settings(config, temperature=config.rl.temperature, max_tokens=trial_tokens,
                               max_positions=trainer.cfg.max_position_embeddings,
                               engine_len=config.rl.max_length)
    tasks = stack.tasks
    site = stack.site(config, f"train-{workdir.name}" + (f"-p{processes[0]}"
                                                           if processes[1] > 1 else ""))
    trial = episode_trial(site, engine, stack.tokenizer, {t.task_id: t for t in tasks},
                          episode=episode, seed=rollout_seed(config, stage))
    scheduler = RolloutScheduler(trial, max_concurrency=config.sandbox.concurrency)
    return LiveRollouts(scheduler, tasks, EpochSampler(len(tasks), config.seed), engine,
                        batch_size=r.batch_size, oversample=r.oversample,
                        carry_over=r.carry_over, record_dir=workdir / "rollouts",
                        publish=publish, group_size=r.group_size,
                        processes=processes, reward_scale=stack.scale.value)


def check_off_policy(config, carry_over: bool) -> None:
    """PPO's off-policy correction checked before a job starts (rl/loop.py
    check_off_policy_correction), as a UsageError naming the config keys."""
    from t1jax.rl.loop import check_off_policy_correction
    from t1jax.rl.trainer import Settings
    try:
        check_off_policy_correction(Settings.from_config(config.rl), config.schedule, carry_over)
    except ValueError as err:
        raise UsageError(str(err)) from err
