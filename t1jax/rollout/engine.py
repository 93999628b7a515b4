"""The rollout engine contract: what the trainer asks of any generator (our JAX engine or an
SGLang server), with SGLang's semantics so the two are interchangeable.

Why a contract: RL needs more than token ids from a generator. It needs the log-probs the
sampler actually used (for importance ratios) and the experts each token was routed to (for
routing replay, R3), tagged with the weight version that produced them (for staleness).
"""

from __future__ import annotations

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
    """
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    max_new_tokens: int = 128
    stop_token_ids: tuple[int, ...] = ()
    seed: int | None = None

    def __post_init__(self):
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")
        object.__setattr__(self, "stop_token_ids", tuple(int(i) for i in self.stop_token_ids))


@dataclass(frozen=True)
class GenerateResult:
    """One request's completion.

    output_logprobs[i]: log-prob of output_ids[i] under the distribution it was sampled from:
    softmax(logits / temperature), restricted to the top-k and then the top-p nucleus, and
    renormalised. With temperature 0 (greedy) it is log_softmax(logits)[id] at temperature 1,
    with no truncation. (So top_k=1 reports 0.0, greedy reports the model's own log-prob.)

    routed_experts: int32 [prompt_len + len(output_ids) - 1, layers, k], SGLang's convention:
    row p holds the experts used at position p of prompt + output, for every position that was
    run through the model to produce a next token, i.e. all but the final output token (never
    fed). -1 marks dense layers.
    """
    output_ids: list[int]
    output_logprobs: list[float]
    routed_experts: np.ndarray
    finish_reason: str
    weight_version: str


class Engine(Protocol):
    weight_version: str

    def generate(self, prompts: list[list[int]],
                 sampling: SamplingParams | list[SamplingParams]) -> list[GenerateResult]:
        """One result per prompt, in order; a single SamplingParams applies to all."""
        ...

    def load_weights(self, params_state, version: str) -> None:
        """Replace the policy weights; later generations report `version`."""
        ...
