"""Training stages (configs/ppo.py): SFT warm start, Critic Warm-Up, PPO -- one loop, resumable.

Each stage writes `checkpoints/`, `metrics.jsonl`, `tensorboard/` (and, with live rollouts,
`rollouts/step_*/` samples) to the workdir; a later stage starts from an earlier one's
checkpoint through `init.actor` (SFT) and `init.critic` (Critic Warm-Up, parameters only).
"""

from __future__ import annotations

from pathlib import Path

from absl import logging

from t1jax.jobs import UsageError, build, check_choices

STAGES = ("ppo", "critic_warmup", "sft")
SCHEDULES = ("sync", "one_step_off")
SOURCES = ("live", "recorded")


def _check(config) -> None:
    check_choices(config, {"stage": STAGES, "schedule": SCHEDULES, "rollouts.source": SOURCES})
    if config.rollouts.source == "recorded" and not config.rollouts.recorded_dir \
            and config.stage != "sft":
        raise UsageError("config.rollouts.source='recorded' needs config.rollouts.recorded_dir")
    if config.steps < 1:
        raise UsageError(f"config.steps must be >= 1, got {config.steps}")
    if config.stage == "ppo":
        build.check_off_policy(config, config.rollouts.source == "live"
                               and config.rollouts.carry_over)


def _sft_source(config, trainer, workdir: Path):
    from t1jax.rl.loop import DatasetBatches
    from t1jax.rollout.oracle_data import oracle_samples
    from t1jax.rollout.sample import dataset_complete, load_samples, save_dataset
    if config.sft.data_dir:  # the user's own samples
        data_dir = Path(config.sft.data_dir)
        if not (data_dir.is_dir() and any(data_dir.glob("*.npz"))):
            raise UsageError(f"config.sft.data_dir={data_dir} holds no .npz samples")
        return DatasetBatches(load_samples(data_dir), config.sft.batch_size, config.seed)
    from t1jax import distributed
    data_dir = workdir / "sft_data"
    # never the part of a set a killed run left; process 0 builds it, every process reads it
    if distributed.is_main() and not dataset_complete(data_dir):
        stack = _task_stack(config)
        samples, skipped = oracle_samples(
            stack.tasks, stack.backend, stack.tokenizer, stack.scale,
            num_layers=trainer.cfg.num_hidden_layers, top_k=trainer.cfg.num_experts_per_tok,
            workers=config.sandbox.concurrency, limits=stack.limits,
            max_len=config.rl.max_length, tool_format=build.tool_format(config))
        for task_id, why in skipped:
            logging.warning("SFT data: skipped %s: %s", task_id, why)
        save_dataset(samples, data_dir, skipped=len(skipped))
    distributed.rendezvous("train/sft_data")
    return DatasetBatches(load_samples(data_dir), config.sft.batch_size, config.seed)


def _task_stack(config) -> build.TaskStack:
    """The pool's tasks config.rollouts selects, refused if they overlap a held-out suite."""
    from t1jax.tasks.decontam import check_pool
    from t1jax.tasks.pool import default_pool_dir, load_pool, select_tasks
    pool_dir = Path(config.rollouts.pool_dir) if config.rollouts.pool_dir else default_pool_dir()
    tasks = load_pool(pool_dir).tasks
    try:
        tasks = select_tasks(tasks, config.rollouts.task_filter)
    except ValueError as err:
        raise UsageError(f"config.rollouts.{err}") from err
    if config.rollouts.heldout_dirs:  # decontamination: refuse to train on held-out tasks
        check_pool(tasks, [d for d in config.rollouts.heldout_dirs.split(",") if d])
    return build.task_stack(config, tasks, build.tokenizer(config.rollouts.tokenizer))


def _live_source(config, trainer, workdir: Path):
    return build.live_rollouts(config, trainer, workdir, _task_stack(config),
                               stage=config.get("stage", "ppo"))


def run(config, workdir: Path) -> int:
    _check(config)
    from t1jax.jobs.progress import job_progress, metric_bar

    from t1jax.rl import loop

    trainer = build.trainer(config, build.mesh_from(config),
                            sft_steps=config.steps if config.stage == "sft" else None)
    if config.init.actor and config.init.get("hf_path"):
        raise UsageError("set config.init.actor or config.init.hf_path, not both")
    live = None
    if config.stage != "sft" and config.rollouts.source != "recorded":
        live = _live_source(config, trainer, workdir)  # its engine gets the weights at the start
    build.start_weights(trainer, workdir / "checkpoints", hf_path=config.init.get("hf_path", ""),
                        actor=config.init.actor, critic=config.init.critic,
                        reward_scale=None if live is None else live.reward_scale)
    if config.stage == "sft":
        source = _sft_source(config, trainer, workdir)
    elif config.rollouts.source == "recorded":
        source = loop.RecordedRollouts(config.rollouts.recorded_dir)
    else:
        source = live
    options = loop.LoopOptions(steps=config.steps, stage=config.stage, schedule=config.schedule,
                               checkpoint_every=config.checkpoint.every,
                               keep_checkpoints=config.checkpoint.keep,
                               async_checkpoints=config.checkpoint.async_save)
    key = {"ppo": "reward/mean", "critic_warmup": "critic/explained_variance",
           "sft": "sft/nll"}[config.stage]
    with job_progress() as progress:
        loop.run(trainer, source, workdir, options, config_json=config.to_json_best_effort(),
                 progress=metric_bar(progress, config.stage, config.steps, key, digits=4))
    logging.info("finished %s: %d steps in %s", config.stage, config.steps, workdir)
    return 0
