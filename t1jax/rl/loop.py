"""The training pipeline: rollouts in, trainer steps, weights out, checkpoints and metrics.

Two schedules, as in the T1 report:
  sync          collect(t) with weights w_t -> train(t) -> publish w_{t+1}
  one_step_off  collect(t+1) runs in a thread while train(t) runs, so step t+1's rollouts come
                from w_t (one step stale); publish w_{t+1} once both are done.
A rollout source (RolloutSource) is live (agent episodes in sandboxes through an engine,
t1jax.rollout.source.LiveRollouts; every step's samples are also written to the workdir),
recorded (a directory of such steps, replayed: the exact-resume tests and offline ablations use
it) or a fixed dataset (SFT).

Resume: the checkpoint holds the train state, the step, the rollout source's position (task
sampler epoch and offset) and the config; a restarted run continues from the last finished
checkpoint, and `metrics.jsonl` keeps one row per step.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import dataclasses
import json
import time
from pathlib import Path
from typing import Protocol

import jax
from absl import logging

from t1jax import distributed
from t1jax.checkpoint import Checkpointer, abstract_like
from t1jax.faults import kill_point
from t1jax.metrics_log import MetricWriter
from t1jax.rl import critic as critic_lib
from t1jax.rollout.sample import Sample, load_samples

STATE_ITEMS = ("step", "actor", "critic", "actor_opt", "critic_opt", "reference")


class RolloutSource(Protocol):
    """What the loop needs of a rollout source. Training sees rollouts only as Samples: a source
    that runs trials (t1jax.rollout.source.LiveRollouts) lives on the rollout side, and the
    loop never learns how a step's samples were made."""

    # trials may cross step boundaries, so older weights sampled part of a step (PPO refuses to
    # run without an off-policy correction then)
    carry_over: bool
    # the last collect's metrics for its step's row (rollout/*, staleness/*; staleness/* is
    # dropped outside PPO, where the policy never moves)
    last_metrics: dict

    def collect(self, step: int) -> list[Sample]:
        """Step `step`'s samples (the loop may call it from a thread while a step trains)."""

    def publish(self, trainer, version: str) -> None:
        """Hand the trainer's current policy, weight version `version`, to whatever samples."""

    def state_dict(self) -> dict:
        """The position a resumed run continues from (saved in the step's checkpoint)."""

    def load_state_dict(self, state: dict) -> None:
        """Continue from a state_dict() ({} for a checkpoint that holds none)."""


class RecordedRollouts:
    """Replays `directory/step_00000/*.npz`, ... (what LiveRollouts writes)."""

    carry_over = False
    last_metrics: dict = {}

    def __init__(self, directory):
        self.directory = Path(directory)
        if not self.directory.is_dir():
            raise FileNotFoundError(f"recorded rollouts: no directory {self.directory}")
        self.steps = sorted(p for p in self.directory.glob("step_*") if p.is_dir())
        if not self.steps:
            raise FileNotFoundError(f"recorded rollouts: no step_* folders in {self.directory}")
        self.published: list[str] = []

    def collect(self, step: int):
        """Step `step` reads folder `step` modulo the number recorded (a short recording
        can drive a longer run)."""
        return load_samples(self.steps[step % len(self.steps)])

    def publish(self, trainer, version: str) -> None:
        self.published.append(version)

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None:
        pass


@dataclasses.dataclass
class LoopOptions:
    steps: int
    stage: str = "ppo"  # ppo | critic_warmup | sft
    schedule: str = "sync"  # sync | one_step_off
    checkpoint_every: int = 1
    keep_checkpoints: int = 3
    async_checkpoints: bool = True


def check_off_policy_correction(s, schedule: str, carry_over: bool) -> None:
    """Refuse PPO whose ratio would ignore the policy that sampled its trials.

    Under one_step_off (every trial one step old) or carry-over (a trial continued from an
    earlier step), the trainer's pre-update policy is not the behaviour policy. We correct as
    the decoupled PPO objective does (Hilton et al. 2021; AReaL): the ratio and its clip are
    taken against the pre-update ("proximal") policy, rl.old_logprobs='recompute', and the
    behaviour policy enters as a truncated importance weight pi_prox / pi_behaviour, rl.tis=True
    (the configs' default). Why this one: the trust region stays around the weights being
    updated, so a stale batch neither zeroes the gradient of tokens whose ratio against an old
    policy is already outside the clip, nor lets the step grow with staleness; the truncation
    bounds the variance, and the same weight absorbs the engine's numeric mismatch.
    rl.old_logprobs='rollout' (the ratio against the behaviour policy itself, plain PPO) is the
    accepted alternative; recompute without TIS is refused here, and TIS on top of rollout
    log-probs (the double correction) by rl.Settings."""
    stale = [why for why, on in (("config.schedule='one_step_off'", schedule == "one_step_off"),
                                 ("config.rollouts.carry_over=True", carry_over)) if on]
    if stale and s.old_logprobs == "recompute" and not s.tis:
        raise ValueError(
            f"{' and '.join(stale)} train on trials that older weights sampled, but "
            "rl.old_logprobs='recompute' with rl.tis=False takes the PPO ratio against the "
            "trainer's current weights and ignores the policy that sampled them. Set "
            "rl.tis=True (the decoupled objective, the default) or rl.old_logprobs='rollout'")


def state_items(state) -> dict:
    items = {name: getattr(state, name) for name in STATE_ITEMS}
    return {k: v for k, v in items.items() if v is not None}


def restore_trainer(trainer, checkpointer: Checkpointer, step=None) -> dict:
    """Load the full train state (same mesh layout as the live one); returns the meta."""
    target = abstract_like(state_items(trainer.state))
    restored, meta = checkpointer.restore(target, step)
    trainer.state = dataclasses.replace(trainer.state, **restored)
    return meta


def load_critic_only(trainer, directory) -> int:
    """Take the critic parameters of another run (Critic Warm-Up) and nothing else: no
    optimizer moments cross runs. Returns the step they came from."""
    with Checkpointer.reader(directory) as source:
        step = source.latest_step()
        if step is None:
            raise FileNotFoundError(f"no finished checkpoint in {directory} to take a critic from")
        critic = source.restore_items({"critic": abstract_like(trainer.state.critic)}, step)
    trainer.state = dataclasses.replace(trainer.state, critic=critic["critic"])
    return step


def load_actor_only(trainer, directory) -> int:
    """Start the policy from another run's actor (the SFT warm start); the reference policy
    for KL terms becomes that actor too, and the critic's backbone restarts from it (value head
    kept), as a critic starts from the SFT model; load_critic_only afterwards replaces it."""
    with Checkpointer.reader(directory) as source:
        step = source.latest_step()
        if step is None:
            raise FileNotFoundError(f"no finished checkpoint in {directory} to take an actor from")
        actor = source.restore_items({"actor": abstract_like(trainer.state.actor)}, step)["actor"]
    _start_from(trainer, actor)
    return step


def load_actor_hf(trainer, path) -> None:
    """Start the policy (and the critic's backbone, and the KL reference) from a Hugging Face
    checkpoint directory (safetensors + config.json), each tensor into its sharding."""
    from flax import nnx

    from t1jax.model.hf_io import load_hf
    _, actor = nnx.split(load_hf(trainer.actor_model(), path), nnx.Param)
    _start_from(trainer, actor)


def _start_from(trainer, actor) -> None:
    updates = {"actor": actor,
               "critic": critic_lib.warm_start_from_actor(  # own buffers: steps donate state
                   trainer.state.critic, jax.tree.map(lambda x: x.copy(), actor))}
    if trainer.state.reference is not None:
        updates["reference"] = jax.tree.map(lambda x: x.copy(), actor)
    trainer.state = dataclasses.replace(trainer.state, **updates)


def run(trainer, source: RolloutSource, workdir, options: LoopOptions, *,
        config_json: str = "{}", progress=None, stop=None) -> list[dict]:
    """Train `options.steps` steps (counting from a resumed checkpoint); returns the metrics
    of the steps run in this call. progress(step, metrics) is called after each step;
    stop(step, metrics) -> True ends the run after that step, checkpointed (Critic Warm-Up
    stops once the critic is healthy)."""
    workdir = Path(workdir)
    ckpt_dir = workdir / "checkpoints"
    step_fn = {"ppo": trainer.ppo_step, "critic_warmup": trainer.critic_step,
               "sft": trainer.sft_step}[options.stage]
    publishes = options.stage == "ppo"
    if publishes:
        check_off_policy_correction(trainer.s, options.schedule, bool(source.carry_over))
    history = []
    with Checkpointer(ckpt_dir, keep=options.keep_checkpoints,
                      async_save=options.async_checkpoints) as checkpointer:
        start = 0
        if checkpointer.latest_step() is not None:
            meta = restore_trainer(trainer, checkpointer)
            start = int(meta["step"])
            source.load_state_dict(meta.get("source", {}))
            logging.info("resumed from %s at step %d", ckpt_dir, start)
        if start >= options.steps:
            return history
        if options.stage != "sft":  # the engines sample from this policy (restored, or
            source.publish(trainer, str(start))  # loaded from SFT): Warm-Up's too
        # rows are numbered by finished steps (1..), so keep those up to the checkpoint
        writer = (MetricWriter(workdir, resume_step=start + 1) if distributed.is_main()
                  else _NoMetrics())  # every process computes them, process 0 writes them
        with writer, \
                concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="rollout") as pool:
            pending = None
            for step in range(start, options.steps):
                t0 = time.perf_counter()
                samples = pending.result() if pending is not None else source.collect(step)
                rollout_wait = time.perf_counter() - t0
                # read before the next collect overwrites it; Warm-Up's policy never moves, so
                # its trials have no staleness to report
                source_metrics = {k: v for k, v in source.last_metrics.items()
                                  if publishes or not k.startswith("staleness/")}
                kill_point(options.stage, step + 1, "collected")
                # what a resume after this step must restart from: before any prefetch
                source_state = source.state_dict()
                pending = None
                if options.schedule == "one_step_off" and step + 1 < options.steps:
                    pending = pool.submit(source.collect, step + 1)
                # PPO: trials older weights sampled than this step's are marked stale
                metrics = step_fn(samples, version=step) if publishes else step_fn(samples)
                kill_point(options.stage, step + 1, "updated")
                if pending is not None:  # one step off: the next rollouts finish first
                    concurrent.futures.wait([pending])
                if publishes:
                    source.publish(trainer, str(step + 1))
                metrics.update(source_metrics)
                metrics.update({"perf/rollout_wait_s": rollout_wait,
                                "perf/wall_s": time.perf_counter() - t0,
                                "weights/version": step + 1})
                writer.write(step + 1, metrics)
                writer.flush()  # on disk before the checkpoint that makes this step final
                history.append(metrics)
                done = step + 1
                stopping = stop is not None and bool(stop(done, metrics))
                if done % options.checkpoint_every == 0 or done == options.steps or stopping:
                    checkpointer.save(done, state_items(trainer.state),
                                      {"step": done, "source": source_state,
                                       "config": json.loads(config_json),
                                       "metrics": {k: v for k, v in metrics.items()
                                                   if isinstance(v, (int, float))}})
                    kill_point(options.stage, done, "saving")
                if progress is not None:
                    progress(done, metrics)
                if stopping:
                    break
        checkpointer.wait()
    return history


class _NoMetrics(contextlib.nullcontext):
    """A MetricWriter for the processes other than 0 of a multi-process job."""

    def write(self, step, scalars) -> None:
        pass

    def flush(self) -> None:
        pass


class DatasetBatches:
    """A fixed dataset (SFT), served `batch_size` samples per step in a seeded permutation
    per epoch; its position is a function of the step, so resuming needs no state."""

    carry_over = False
    last_metrics: dict = {}

    def __init__(self, samples, batch_size: int, seed: int = 0):
        if not samples:
            raise ValueError("the dataset is empty")
        self.samples, self.batch_size, self.seed = list(samples), int(batch_size), seed

    def collect(self, step: int):
        import numpy as np
        n, out = len(self.samples), []
        for k in range(step * self.batch_size, (step + 1) * self.batch_size):
            epoch, i = divmod(k, n)
            order = np.random.default_rng([self.seed, epoch]).permutation(n)
            out.append(self.samples[order[i]])
        return out

    def publish(self, trainer, version: str) -> None:
        pass

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None:
        pass
