"""The rollout engine contract: what the trainer asks of any generator (our JAX engine or an
SGLang server), with SGLang's semantics so the two are interchangeable.

Why a contract: RL needs more than token ids from a generator. It needs the log-probs the
sampler actually used (for importance ratios) and the experts each token was routed to (for
routing replay, R3), tagged with the weight version that produced them (for staleness).
"""

from __future__ import annotations

import dataclasses
import hashlib
from dataclasses import dataclass
from typing import Protocol

import numpy as np

FINISH_STOP = "stop"  # sampled a stop id; the stop id is the last entry of output_ids
FINISH_LENGTH = "length"  # max_new_tokens reached, or the engine's context (max_len) is full


@dataclass(frozen=True)
class SamplingParams:
    """Per-request sampling, as SGLang's sampling_params.

    temperature 0 means greedy. top_k <= 0 (SGLang: -1) and top_p >= 1 disable truncation.
    seed: the i-th output token is drawn with jax.random.fold_in(PRNGKey(seed), i), so the same
    seed and prompt give the same sample whatever else is in the batch; None draws a fresh seed.
    routes_from: the first position whose expert routes the caller needs (SGLang's
    routed_experts_start_len, at most the prompt's length): a multi-turn trial already holds
    its earlier positions', and a fleet that resent them would send every turn the whole
    trial's, quadratic in the turns. An engine may return more (GenerateResult.routes_start).
    """
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    max_new_tokens: int = 128
    stop_token_ids: tuple[int, ...] = ()
    seed: int | None = None
    routes_from: int = 0

    def __post_init__(self):
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")
        if self.routes_from < 0:
            raise ValueError(f"routes_from must be >= 0, got {self.routes_from}")
        object.__setattr__(self, "stop_token_ids", tuple(int(i) for i in self.stop_token_ids))


@dataclass(frozen=True)
class GenerateResult:
    """One request's completion.

    output_logprobs[i]: log-prob of output_ids[i] as SGLang reports it and the trainer
    recomputes it: log_softmax(logits / temperature) over the whole vocabulary, whatever top-k /
    top-p truncated the draw to; greedy (temperature 0) reports log_softmax(logits) at T=1.
    The JaxEngine's logprobs="truncated" reports instead the log-prob under the renormalised
    top-k / top-p distribution actually drawn from (top_k=1 reports 0.0); the two agree when
    neither truncation is on (the main job).

    routed_experts: int32 [prompt_len + len(output_ids) - 1, layers, k], SGLang's convention:
    row p holds the experts used at position p of prompt + output, for every position that was
    run through the model to produce a next token, i.e. all but the final output token (never
    fed). -1 marks dense layers. routes_start: the position of its first row (0: the whole
    sequence; at most the request's SamplingParams.routes_from): rows cover
    [routes_start, prompt_len + len(output_ids) - 1).
    """
    output_ids: list[int]
    output_logprobs: list[float]
    routed_experts: np.ndarray
    finish_reason: str
    weight_version: str
    routes_start: int = 0


class Engine(Protocol):
    weight_version: str

    def generate(self, prompts: list[list[int]],
                 sampling: SamplingParams | list[SamplingParams]) -> list[GenerateResult]:
        """One result per prompt, in order; a single SamplingParams applies to all."""
        ...

    def load_weights(self, params_state, version: str) -> None:
        """Replace the policy weights; later generations report `version`."""
        ...


def _hash31(key: str) -> int:
    return int.from_bytes(hashlib.blake2b(key.encode(), digest_size=8).digest(), "little") \
        % 2**31


def derived_seed(seed: int, purpose: str) -> int:
    """A run's sampling seed for one purpose (a stage's rollouts, its evaluations), from the
    run's config.seed: two runs with one seed repeat, and the purposes draw apart streams."""
    return _hash31(f"{seed}/{purpose}")


def call_seed(seed: int, task_id: str, attempt: int, call: int) -> int:
    """The sampling seed of one generate call of one trial: a hash, so that trials (and turns)
    draw independent streams, yet a run repeats itself, carried-over and resumed trials
    included ((task, attempt) is unique per run and checkpointed; the call index continues
    across a replay). Below 2**31: SGLang's sampling_seed and the JAX engine both take it."""
    return _hash31(f"{seed}/{task_id}/{attempt}/{call}")


def generate_in_session(engine, prompts, sampling, session: str | None):
    """engine.generate with the trial's session id where the engine takes one (prefix reuse in
    the JaxEngine, the routing key of a fleet), so each position is run once per trial and the
    route replayed for it is the one later tokens were sampled under."""
    if session is not None and getattr(engine, "takes_sessions", False):
        return engine.generate(prompts, sampling, session_ids=[session] * len(prompts))
    return engine.generate(prompts, sampling)


class SeededCalls:
    """One trial's view of a shared engine: its i-th generate call samples with
    call_seed(seed, task_id, attempt, i). Evaluations of two policies with one seed draw the
    same random numbers per (task, attempt, turn): their difference is paired, not two draws."""

    def __init__(self, engine, seed: int, task_id: str, attempt: int):
        self.engine, self.key, self.calls = engine, (seed, task_id, attempt), 0

    def generate(self, prompts, sampling):
        if not isinstance(sampling, SamplingParams):
            raise TypeError("SeededCalls takes one SamplingParams per call")
        call, self.calls = self.calls, self.calls + 1
        return generate_in_session(
            self.engine, prompts, dataclasses.replace(sampling, seed=call_seed(*self.key, call)),
            "/".join(map(str, self.key)))

    def __getattr__(self, name):  # max_len, weight_version, ...: the engine's own
        return getattr(self.engine, name)
