"""`EpisodeSettings`: how one agent episode plays and is verified, whoever plays it.

Why one value: training's live rollouts (scheduler.episode_trial), every evaluation
(evaluate.evaluate) and the oracle's SFT episodes (oracle_data.oracle_samples) play the same kind
of episode. Their knobs (turns, reply length, sampling, token budget, command timeout,
observation cap, system prompt, tool format, TITO, context policy, how the verifier runs) are
defaulted here, once; a job builds one value from its config (t1jax/jobs/build.py
episode_settings) and hands it down whole, as rl/trainer.py's Settings is for the trainer, down
to the harnesses' episode functions (agent.run_agent_episode, terminus_agent.
run_terminus_episode), which take it as it is.
"""

from __future__ import annotations

import dataclasses

from t1jax.rollout.context import ContextPolicy
from t1jax.rollout.engine import SamplingParams
from t1jax.sandbox.base import Limits
from t1jax.verify.verifier import VerifierSettings


@dataclasses.dataclass(frozen=True)
class EpisodeSettings:
    max_turns: int = 300
    max_new_tokens: int = 4096  # per turn
    temperature: float = 1.0
    top_p: float = 1.0  # >= 1: no nucleus truncation
    max_tokens: int | None = None  # the whole trial's tokens, every chunk; None: engine max_len
    timeout_s: float | None = None  # the episode's wall clock; None: the task's [agent] timeout
    command_timeout_s: float | None = None  # per command; None: the sandbox Limits'
    max_observation_bytes: int | None = None  # per tool output shown; None: the sandbox Limits'
    system_prompt: str | None = None  # None: the harness's own
    tool_format: str = "qwen3_json"  # how the policy writes tool calls (chat.TOOL_FORMATS)
    tito: bool = True  # False: the text round trip (the "without TITO" ablation)
    context: ContextPolicy | None = None  # per-chunk budget and compaction; None: one chunk
    verifier: VerifierSettings = VerifierSettings()  # how and where the tests run

    def __post_init__(self):
        if self.max_turns < 1 or self.max_new_tokens < 1:
            raise ValueError(f"EpisodeSettings needs max_turns >= 1 and max_new_tokens >= 1, "
                             f"got {self.max_turns} and {self.max_new_tokens}")
        if self.context is not None and not self.tito:
            raise ValueError("EpisodeSettings: context compaction needs tito=True "
                             "(chunks are built from ids)")

    def sampling(self) -> SamplingParams:
        return SamplingParams(temperature=self.temperature, top_p=self.top_p,
                              max_new_tokens=self.max_new_tokens)

    def replace(self, **changes) -> "EpisodeSettings":
        return dataclasses.replace(self, **changes)

    def with_limits(self, limits: Limits) -> "EpisodeSettings":
        """These settings with a run's sandbox limits (its command timeout and observation
        cap) where they leave them open."""
        return self.replace(
            command_timeout_s=float(self.command_timeout_s or limits.default_timeout_s),
            max_observation_bytes=int(self.max_observation_bytes or limits.max_output_bytes))

    def resolved(self, task, engine, system_prompt: str) -> "EpisodeSettings":
        """Every knob left open closed for one episode of `task` on `engine`: the trial's
        budget (the engine's max_len), its wall clock (the task's [agent] timeout_sec), the
        command timeout and observation cap (the sandbox Limits' defaults) and the system
        prompt (`system_prompt`, the harness's own)."""
        agent = getattr(task, "agent", None)
        return self.with_limits(Limits()).replace(
            max_tokens=int(self.max_tokens or getattr(engine, "max_len", 32768)),
            timeout_s=float(self.timeout_s if self.timeout_s is not None
                            else getattr(agent, "timeout_sec", 1800.0)),
            system_prompt=self.system_prompt or system_prompt)
