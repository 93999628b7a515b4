"""Evaluate a policy on a task directory (configs/eval.py): see t1jax/rollout/evaluate.py for the protocol."""

from __future__ import annotations

import dataclasses
import json
import sys
import time
from pathlib import Path

from t1jax.jobs import UsageError, build, check_choices

ENGINES = ("embedded", "fleet")


def _check(config) -> None:
    from t1jax.rollout.evaluate import HARNESSES, INTERNET_POLICIES
    check_choices(config, {"harness": HARNESSES, "rollouts.engine": ENGINES,
                           "internet_tasks": INTERNET_POLICIES})
    r, e = config.rollouts, config.eval
    if r.engine == "fleet" and not r.fleet_urls:
        raise UsageError("config.rollouts.engine='fleet' needs config.rollouts.fleet_urls")
    if r.engine == "fleet" and (config.policy.checkpoint or config.init.hf_path):
        raise UsageError("config.rollouts.engine='fleet' evaluates what the servers hold; drop "
                         "config.policy.checkpoint / config.init.hf_path (load them into the "
                         "servers)")
    if config.policy.checkpoint and config.init.hf_path:
        raise UsageError("set config.policy.checkpoint or config.init.hf_path, not both")
    for name, value in (("eval.attempts", e.attempts), ("eval.max_tokens", e.max_tokens),
                        ("rollouts.max_new_tokens", r.max_new_tokens),
                        ("rollouts.max_turns", r.max_turns),
                        ("rollouts.engine_batch", r.engine_batch),
                        ("sandbox.concurrency", config.sandbox.concurrency)):
        if value < 1:
            raise UsageError(f"config.{name} must be >= 1, got {value}")
    if e.temperature < 0:
        raise UsageError(f"config.eval.temperature must be >= 0, got {e.temperature}")


def load_policy(config):
    """(CausalLM, label): the checkpoint's actor, the HF weights, or the random init."""
    mesh = build.mesh_from(config)
    p = config.policy
    if p.checkpoint:  # check the source before the (slow) model build
        from t1jax.checkpoint import finalized_steps
        if not Path(p.checkpoint).is_dir():
            raise UsageError(f"config.policy.checkpoint={p.checkpoint} is not a directory")
        steps = finalized_steps(p.checkpoint)
        step = steps[-1] if steps and p.step < 0 else p.step
        if step not in steps:
            raise UsageError(f"no finished checkpoint for step {step} in {p.checkpoint} "
                             f"(have steps {steps})")
    hf_path = config.init.hf_path
    if hf_path and not Path(hf_path).is_dir():
        raise UsageError(f"config.init.hf_path={hf_path} is not a directory")
    model = build.policy(config, mesh)
    if p.checkpoint:
        return build.restored_actor(model, p.checkpoint, step), f"step_{step:04d}"
    if hf_path:
        from t1jax.model.hf_io import load_hf
        return load_hf(model, hf_path), Path(hf_path).name
    return model, "base"


def _recorded_scale(config):
    """The dense reward's scale config.policy.checkpoint's run trained on (recorded by its
    live rollouts), unless config.verifier.global_scale fixes one: a task's reward then means
    the same here as in that run, whichever tasks this evaluation loads. None: none recorded
    (SFT and older checkpoints: the scale comes from the tasks loaded, and the summary says
    so)."""
    from t1jax.checkpoint import Checkpointer
    from t1jax.verify.reward import GlobalScale
    p = config.policy
    if not p.checkpoint or config.verifier.global_scale > 0:
        return None
    with Checkpointer.reader(p.checkpoint) as ckpt:
        meta = ckpt.restore_meta(None if p.step < 0 else p.step)
    value = (meta.get("source") or {}).get("reward_scale")
    return None if value is None else GlobalScale(float(value),
                                                  f"recorded in {p.checkpoint}")


def run(config, workdir: Path) -> int:
    _check(config)
    from t1jax.jobs.progress import job_progress

    from t1jax.rollout.eval_summary import skipped_note
    from t1jax.rollout.evaluate import evaluate

    pool_dir = build.task_folder(config)
    tasks = build.load_job_tasks(pool_dir, skip_invalid=config.skip_invalid_tasks,
                                 task_filter=config.task_filter)

    r, e = config.rollouts, config.eval
    tok = build.tokenizer(r.tokenizer)
    from t1jax.model.config import model_config_from
    # with compaction a trial may span chunks (rollouts.trial_tokens, 0: one engine context)
    trial_tokens = (r.trial_tokens if r.compaction != "none" else 0) or e.max_tokens
    episode = build.episode_settings(
        config, temperature=e.temperature, top_p=e.top_p, max_tokens=trial_tokens,
        max_positions=model_config_from(config.model).max_position_embeddings,
        engine_len=e.max_tokens, timeout_s=e.timeout_s)
    engine_len = episode.context.budget if episode.context is not None else e.max_tokens
    model, default_label = None, "fleet"
    if r.engine == "embedded":
        model, default_label = load_policy(config)
        if tok.get_vocab_size() > model.model.cfg.vocab_size:
            raise UsageError(f"the tokenizer has {tok.get_vocab_size()} ids but the model's "
                             f"vocab_size is {model.model.cfg.vocab_size}")
    engine = build.rollout_engine(config, engine_len, model,
                                  model_cfg=model_config_from(config.model),
                                  weight_version=default_label)
    label = config.label or default_label

    stack = build.task_stack(config, tasks, tok)
    recorded = _recorded_scale(config)
    if recorded is not None:  # a trained policy: scored on its run's scale, not these tasks'
        stack = dataclasses.replace(stack, scale=recorded)
    run_id = config.run_id or f"{workdir.name}-{time.strftime('%Y%m%d-%H%M%S')}"
    seed = build.eval_seed(config)
    with job_progress() as progress:
        builds = progress.add_task("build task images", total=len(tasks), info="")
        trials = progress.add_task(f"{label} trials ({config.harness})",
                                   total=len(tasks) * e.attempts, info="")
        solved = [0]

        def tick(kind: str, what: str) -> None:
            if kind == "build":
                progress.advance(builds)
                return
            solved[0] += what.endswith(": resolved")
            progress.update(trials, advance=1, info=f"resolved {solved[0]}")

        try:
            summary = evaluate(
                tasks, engine, tok, stack.site(config, run_id), episode=episode, label=label,
                attempts=e.attempts, harness=config.harness, out_dir=workdir,
                internet_tasks=config.internet_tasks, seed=seed, progress=tick)
        finally:
            stack.backend.reap(run_id)  # whatever an interrupt left running
        # skipped tasks never get a trial: fill the bar so it ends complete
        progress.update(trials, completed=len(tasks) * e.attempts)
    print((workdir / "summary.md").read_text())
    print(json.dumps({k: v for k, v in summary.items()
                      if k not in ("by_category", "by_difficulty")}, indent=2))
    print(f"wrote {workdir / 'trials.jsonl'}, {workdir / 'summary.json'} and "
          f"{workdir / 'summary.md'}")
    note = skipped_note(summary)
    if note:  # last, where a user looks: a rate over fewer tasks than asked for
        print(f"WARNING: {note}", file=sys.stderr)
    if summary["trials"] == 0:
        print(f"ERROR: evaluated no task of {len(tasks)} in {pool_dir}; nothing to report",
              file=sys.stderr)
        return 1
    return 0
