"""Config blocks shared by the jobs that run sandboxes (oracle, audit, synth): one definition,
documented once."""

import ml_collections

from t1jax.sandbox.base import Limits


def check_variant(config_file: str, arg: str | None, variants=()) -> None:
    """A named variant (`--config configs/<file>.py:<arg>`) the file does not define is an
    error naming the ones it does, never silently the default."""
    if arg and arg not in variants:
        raise ValueError(f"configs/{config_file}.py has no variant {arg!r}"
                         + (f" (variants: {', '.join(variants)})" if variants
                            else " (it takes none)"))


def sandbox_config() -> ml_collections.ConfigDict:
    sandbox = ml_collections.ConfigDict()
    sandbox.backend = "docker"  # docker | bwrap (no daemon needed)
    sandbox.concurrency = 4  # sandboxes running at once
    sandbox.allow_network = False  # a task's allow_internet only counts when this is True
    sandbox.runtime = ""  # Docker runtime: "" (the daemon's default, runc) | runc | runsc (gVisor)
    sandbox.build_network = "none"  # network for `docker build` (host to apt-get in builds)
    # public base -> local image, over t1jax.sandbox.images.DEFAULT_BASE_MAP (Docker only):
    # "python:3.12-slim=t1jax/base:bookworm,node:20=my/node:20"; "*=IMAGE" maps every other base
    sandbox.base_map = ""
    # True where the registry is reachable (Harbor's way): a task's prebuilt docker_image is
    # pulled and used, missing bases are pulled; False: Dockerfiles built on local stand-ins
    sandbox.registry = False
    # per command output kept (head + tail), command timeout, all of an episode's output:
    # the defaults of t1jax.sandbox.base.Limits, written there once
    sandbox.pids = Limits.pids
    sandbox.max_output_bytes = Limits.max_output_bytes
    sandbox.command_timeout_s = Limits.default_timeout_s
    sandbox.episode_output_bytes = Limits.episode_output_bytes
    return sandbox


def verifier_config() -> ml_collections.ConfigDict:
    """How trials are verified and scored (every job that verifies reads this block)."""
    verifier = ml_collections.ConfigDict()
    verifier.mode = "script"  # script | offline | pytest (t1jax/verify/verifier.py)
    # agent: in the agent's own sandbox once it finished, as Harbor does (services it started
    # still running); snapshot: in a fresh sandbox from a snapshot of its files (nothing it
    # left running can touch the tests, no process survives; a docker commit per trial)
    verifier.where = "agent"
    verifier.global_scale = 0.0  # > 0 fixes the dense reward's denominator
    verifier.scale_quantile = 0.9  # else: this quantile of the pool's assertion counts
    return verifier


def rl_config() -> ml_collections.ConfigDict:
    """PPO's settings at their defaults, made from t1jax.rl.trainer.Settings: what each knob
    means and its default are written there, once."""
    import dataclasses

    from t1jax.rl.trainer import Settings
    return ml_collections.ConfigDict(dataclasses.asdict(Settings()))


def context_config(rollouts: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
    """Context management for episodes longer than one context window
    (t1jax/rollout/context.py); "none" keeps one chunk as long as the trial (rl.max_length)."""
    rollouts.compaction = "none"  # none | stop | elide | summary
    # tokens per trial, all chunks together (0: rl.max_length, one training row); larger needs a
    # compaction policy, and the trainer then splits a trial over rows at chunk boundaries
    rollouts.trial_tokens = 0
    rollouts.context_tokens = 0  # tokens per chunk (0: the model's positions, the engine's cache)
    rollouts.compaction_reserve = 0  # free tokens a turn needs (0: max_new_tokens)
    rollouts.keep_observations = 1  # elide: the newest tool outputs kept whole
    rollouts.replay_fraction = 0.5  # elide: replayed turns' share of the room after the prompt
    rollouts.summary_tokens = 128  # summary: the summary reply's token budget
    return rollouts
