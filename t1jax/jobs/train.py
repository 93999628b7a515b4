"""Training stages (configs/ppo.py): SFT warm start, Critic Warm-Up, PPO -- one loop, resumable.

Each stage writes `checkpoints/`, `metrics.jsonl`, `tensorboard/` (and, with live rollouts,
`rollouts/step_*/` samples) to the workdir; a later stage starts from an earlier one's
checkpoint through `init.actor` (SFT) and `init.critic` (Critic Warm-Up, parameters only).
"""

from __future__ import annotations

import os
from pathlib import Path

from absl import logging

from t1jax.jobs import UsageError, sandbox_backend, sandbox_limits

STAGES = ("ppo", "critic_warmup", "sft")
SCHEDULES = ("sync", "one_step_off")
SOURCES = ("live", "recorded")


def _check(config) -> None:
    if config.stage not in STAGES:
        raise UsageError(f"config.stage={config.stage!r}; choose one of {STAGES}")
    if config.schedule not in SCHEDULES:
        raise UsageError(f"config.schedule={config.schedule!r}; choose one of {SCHEDULES}")
    if config.rollouts.source not in SOURCES:
        raise UsageError(f"config.rollouts.source={config.rollouts.source!r}; choose one of "
                         f"{SOURCES}")
    if config.rollouts.source == "recorded" and not config.rollouts.recorded_dir \
            and config.stage != "sft":
        raise UsageError("config.rollouts.source='recorded' needs config.rollouts.recorded_dir")
    if config.steps < 1:
        raise UsageError(f"config.steps must be >= 1, got {config.steps}")
    if config.stage == "ppo":
        from t1jax.rl.loop import check_off_policy_correction
        from t1jax.rl.trainer import Settings
        try:
            check_off_policy_correction(Settings.from_config(config.rl), config.schedule,
                                        config.rollouts.source == "live"
                                        and config.rollouts.carry_over)
        except ValueError as err:
            raise UsageError(str(err)) from err


def _sft_source(config, trainer, workdir: Path):
    from t1jax.rl.loop import DatasetBatches
    from t1jax.rl.sft_data import dataset_complete, load_samples, save_dataset
    from t1jax.rollout.oracle_data import oracle_samples
    if config.sft.data_dir:  # the user's own samples
        data_dir = Path(config.sft.data_dir)
        if not (data_dir.is_dir() and any(data_dir.glob("*.npz"))):
            raise UsageError(f"config.sft.data_dir={data_dir} holds no .npz samples")
        return DatasetBatches(load_samples(data_dir), config.sft.batch_size, config.seed)
    data_dir = workdir / "sft_data"
    if not dataset_complete(data_dir):  # never the part of a set a killed run left
        tasks, backend, tok, scale, limits = _task_stack(config)
        samples, skipped = oracle_samples(
            tasks, backend, tok, scale, num_layers=trainer.cfg.num_hidden_layers,
            top_k=trainer.cfg.num_experts_per_tok, workers=config.sandbox.concurrency,
            limits=limits, max_len=config.rl.max_length, tool_format=tool_format(config))
        for task_id, why in skipped:
            logging.warning("SFT data: skipped %s: %s", task_id, why)
        save_dataset(samples, data_dir, skipped=len(skipped))
    return DatasetBatches(load_samples(data_dir), config.sft.batch_size, config.seed)


def tool_format(config) -> str:
    """How the policy writes tool calls: config.rollouts.tool_format, else its checkpoint's
    (init.hf_path) or tokenizer's chat template, else qwen3_json (chat.resolve_tool_format)."""
    from t1jax.rollout.chat import resolve_tool_format
    r, init = config.rollouts, config.get("init") or {}
    return resolve_tool_format(r.get("tool_format", ""), init.get("hf_path", "") if init else "",
                               os.path.dirname(r.get("tokenizer", "") or ""))


def _task_stack(config):
    from t1jax.rollout.tokenizer import load_or_train
    from t1jax.tasks.decontam import check_pool
    from t1jax.tasks.pool import default_pool_dir, load_pool, select_tasks
    from t1jax.verify.reward import pool_scale
    pool_dir = Path(config.rollouts.pool_dir) if config.rollouts.pool_dir else default_pool_dir()
    tasks = load_pool(pool_dir).tasks
    try:
        tasks = select_tasks(tasks, config.rollouts.task_filter)
    except ValueError as err:
        raise UsageError(f"config.rollouts.{err}") from err
    if config.rollouts.heldout_dirs:  # decontamination: refuse to train on held-out tasks
        check_pool(tasks, [d for d in config.rollouts.heldout_dirs.split(",") if d])
    backend = sandbox_backend(config.sandbox)
    backend.reap()
    tok = load_or_train(config.rollouts.tokenizer or str(Path.home() / ".cache" / "t1jax" /
                                                          "tokenizer-512.json"))
    scale = pool_scale(tasks, config.verifier.scale_quantile, config.verifier.global_scale)
    limits = sandbox_limits(config.sandbox)
    return tasks, backend, tok, scale, limits


def fleet_client(urls: str, model_cfg, router: str = ""):
    """A FleetClient over comma-separated urls (generating through `router` if one is given),
    reading routes by the model's own config."""
    from t1jax.rollout.sglang import FleetClient, RouteLayout
    return FleetClient(urls.split(","), RouteLayout.of(model_cfg), router=router or None)


def _live_source(config, trainer, workdir: Path):
    tasks, backend, tok, scale, limits = _task_stack(config)
    return live_source(config, trainer, workdir, tasks, backend, tok, scale, limits,
                       stage=config.get("stage", "ppo"))


def rollout_seed(config, stage: str) -> int:
    """config.rollouts.sampling_seed, or with -1 (the default) one derived from config.seed
    and the stage: two runs with one config.seed sample the same, and Warm-Up and PPO, whose
    first policy is the same SFT actor, never replay each other's trials."""
    from t1jax.rollout.engine import derived_seed
    seed = config.rollouts.get("sampling_seed", -1)
    return derived_seed(config.seed, f"rollouts/{stage}") if seed < 0 else int(seed)


def live_source(config, trainer, workdir: Path, tasks, backend, tok, scale, limits,
                system_prompt: str | None = None, stage: str = "ppo"):
    """Rollouts of `tasks` by the trainer's policy (config.rollouts, config.sandbox, config.rl),
    sampled with rollout_seed(config, stage)."""
    from t1jax.rl.loop import LiveRollouts
    from t1jax.rollout import context
    from t1jax.rollout.batching import embedded_engine
    from t1jax.rollout.engine import SamplingParams
    from t1jax.rollout.scheduler import RolloutScheduler, episode_trial
    from t1jax.rollout.sglang import FleetEngine
    from t1jax.tasks.sampler import EpochSampler
    r = config.rollouts
    publish = None
    if r.engine == "embedded":
        engine = embedded_engine(trainer.actor_model(), max_batch=r.engine_batch,
                                 max_len=config.rl.max_length)
    elif r.engine == "fleet":
        if not r.fleet_urls:
            raise UsageError("config.rollouts.engine='fleet' needs config.rollouts.fleet_urls")
        engine = FleetEngine(fleet_client(r.fleet_urls, trainer.cfg, r.get("fleet_router", "")),
                             config.rl.max_length)
        weights_dir = Path(r.weights_dir) if r.weights_dir else workdir / "published"

        def publish_to_fleet(trainer, version):  # HF safetensors on a shared disk
            engine.client.publish_weights(trainer.actor_model(), weights_dir, version)
        publish = publish_to_fleet
    else:
        raise UsageError(f"config.rollouts.engine={r.engine!r}; choose embedded or fleet")
    sampling = SamplingParams(temperature=config.rl.temperature, max_new_tokens=r.max_new_tokens)
    trial_tokens = r.get("trial_tokens", 0) or config.rl.max_length
    if trial_tokens > config.rl.max_length and r.compaction == "none":
        raise UsageError(f"config.rollouts.trial_tokens={trial_tokens} is more than one training "
                         f"row (rl.max_length={config.rl.max_length}): it needs a compaction "
                         "policy (config.rollouts.compaction), whose chunks each fit a row")
    trial = episode_trial(backend, engine, tok, {t.task_id: t for t in tasks}, scale=scale,
                          sampling=sampling, limits=limits, run_id=f"train-{workdir.name}",
                          verifier_mode=config.verifier.mode, max_turns=r.max_turns,
                          max_tokens=trial_tokens,
                          command_timeout_s=config.sandbox.command_timeout_s,
                          max_observation_bytes=config.sandbox.max_output_bytes,
                          tito=r.tito,
                          seed=rollout_seed(config, stage), tool_format=tool_format(config),
                          context=context.from_config(r, trainer.cfg.max_position_embeddings,
                                                      config.rl.max_length),
                          **({} if system_prompt is None else {"system_prompt": system_prompt}))
    scheduler = RolloutScheduler(trial, max_concurrency=config.sandbox.concurrency)
    return LiveRollouts(scheduler, tasks, EpochSampler(len(tasks), config.seed), engine,
                        batch_size=r.batch_size, oversample=r.oversample,
                        carry_over=r.carry_over, record_dir=workdir / "rollouts",
                        publish=publish, group_size=r.get("group_size", 1))


def run(config, workdir: Path) -> int:
    _check(config)
    from t1jax.jobs.progress import job_progress

    from t1jax.checkpoint import has_checkpoint
    from t1jax.model.config import model_config_from
    from t1jax.rl import loop
    from t1jax.rl.trainer import Trainer, sft_learning_rate
    from t1jax.sharding import mesh_from_config

    import jax
    devices = jax.devices(config.mesh.devices) if config.mesh.get("devices") else None
    n = config.mesh.data * config.mesh.fsdp * config.mesh.expert * config.mesh.tensor
    mesh = mesh_from_config(config.mesh, None if devices is None else devices[:n])
    lr = (sft_learning_rate(config.sft.lr, config.sft.lr_schedule, config.steps)
          if config.stage == "sft" else None)
    trainer = Trainer(model_config_from(config.model), config.rl, mesh, seed=config.seed,
                      actor_lr=lr)
    fresh = not has_checkpoint(workdir / "checkpoints")  # a finished step, not a folder
    if config.init.actor and config.init.get("hf_path"):
        raise UsageError("set config.init.actor or config.init.hf_path, not both")
    if fresh and config.init.get("hf_path"):
        if not Path(config.init.hf_path, "config.json").is_file():
            raise UsageError(f"config.init.hf_path={config.init.hf_path} has no config.json "
                             f"(a Hugging Face model directory)")
        logging.info("actor and critic backbone from %s", config.init.hf_path)
        loop.load_actor_hf(trainer, config.init.hf_path)
    if fresh and config.init.actor:
        logging.info("actor from %s (step %d)", config.init.actor,
                     loop.load_actor_only(trainer, config.init.actor))
    if fresh and config.init.critic:
        logging.info("critic from %s (step %d)", config.init.critic,
                     loop.load_critic_only(trainer, config.init.critic))
    if config.stage == "sft":
        source = _sft_source(config, trainer, workdir)
    elif config.rollouts.source == "recorded":
        source = loop.RecordedRollouts(config.rollouts.recorded_dir)
    else:
        source = _live_source(config, trainer, workdir)
    options = loop.LoopOptions(steps=config.steps, stage=config.stage, schedule=config.schedule,
                               checkpoint_every=config.checkpoint.every,
                               keep_checkpoints=config.checkpoint.keep,
                               async_checkpoints=config.checkpoint.async_save)
    key = {"ppo": "reward/mean", "critic_warmup": "critic/explained_variance",
           "sft": "sft/nll"}[config.stage]
    with job_progress() as progress:
        bar = progress.add_task(config.stage, total=config.steps, info="")

        def tick(step, metrics):
            progress.update(bar, completed=step, info=f"{key} {metrics.get(key, float('nan')):.4f}")

        loop.run(trainer, source, workdir, options, config_json=config.to_json_best_effort(),
                 progress=tick)
    logging.info("finished %s: %d steps in %s", config.stage, config.steps, workdir)
    return 0
