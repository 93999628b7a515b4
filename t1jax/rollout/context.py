"""Context management for episodes longer than one context window: a per-chunk token budget,
checked before every turn, and what to do when the next turn would not fit.

Policies: `stop` ends the episode (finish "context"); `elide` starts a new chunk whose prompt
replays the turns so far (the sampled reply ids verbatim) with old tool outputs replaced by a
stub (the newest kept whole, the oldest turns dropped if even that is too long); `summary`
first asks the policy itself to summarise its progress (the reply is sampled and trained like
any other), then starts a new chunk from the instruction plus that summary and the output that
filled the context, as Terminus-2 does near a full context. The tools harness applies them in
agent.py, the Terminus-2 text harness to its messages in terminus_agent.py.

Why chunks: a compaction rewrites the conversation, so the next prompt does not extend the
previous one (TITO's "split" case). The new prompt is built from ids, sent to the engine as is
and kept as the new chunk's context (loss mask 0), so every chunk holds exactly what the engine
saw. The trial stays one Sample with `chunk_starts`: the trainer restarts positions and keeps
attention inside each chunk, and GAE runs over the trial's chunks in order (`trial_ids`), so the
reward on the trial's last sampled token reaches every chunk through the returns (with T1's
gamma = lam = 1 every sampled token's return is the trial's reward; with lam < 1 the critic's
values carry it across each boundary). A trial longer than a training row (`rl.max_length`) is
split over rows at chunk boundaries, its GAE linked across them (t1jax/rl/batch.py).
"""

from __future__ import annotations

import dataclasses

from tokenizers import Tokenizer

from t1jax.rollout.chat import render_prefix
from t1jax.rollout.tito import encode_observation, encode_plain

POLICIES = ("stop", "elide", "summary")
SUMMARY_REQUEST = ("Your context window is nearly full. Reply with a short summary of what you "
                   "have done, what you found and what remains to do, without a tool call; the "
                   "task continues from your summary.")
SUMMARY_HEADER = "Summary of your earlier work on this task (you wrote it when the context " \
                 "filled up):"
LAST_OUTPUT = "The output of your last tool call(s) before the summary:"
ELIDED = "[output elided: {size} bytes]"
OMITTED = "[{turns} earlier turns omitted to save context]"


@dataclasses.dataclass(frozen=True)
class ContextPolicy:
    """The per-chunk budget and what happens when a turn would not fit in it."""
    budget: int  # tokens one chunk (one engine context) may hold
    policy: str = "stop"  # stop | elide | summary
    reserve: int = 0  # free tokens a turn needs (its reply and tool output); 0: the reply
    #                   budget plus the largest tool output of the trial so far (see auto_reserve)
    keep_observations: int = 1  # elide: the newest turns whose tool output stays whole
    replay_fraction: float = 0.5  # elide: replayed turns fill at most this much of the room
    #                               the instruction leaves in a chunk (the rest is for new turns)
    summary_tokens: int = 128  # summary: the most tokens the summary reply may take

    def __post_init__(self):
        if self.policy not in POLICIES:
            raise ValueError(f"context policy must be one of {POLICIES}, got {self.policy!r}")
        if self.budget < 1 or self.reserve < 0 or self.keep_observations < 0 \
                or self.summary_tokens < 1 or not 0 < self.replay_fraction <= 1:
            raise ValueError(f"bad context policy {self}: budget and summary_tokens must be "
                             f">= 1, reserve and keep_observations >= 0, replay_fraction in "
                             f"(0, 1]")


def from_config(rollouts, model_max_positions: int, engine_max_len: int | None = None):
    """The ContextPolicy of a run config's `rollouts` block (configs/common.py context_config
    writes its fields and their defaults), or None for compaction "none" (one chunk as long as
    the trial budget)."""
    policy = rollouts["compaction"]
    if policy == "none":
        return None
    if policy not in POLICIES:
        raise ValueError(f"rollouts.compaction must be 'none' or one of {POLICIES}, got "
                         f"{policy!r}")
    return ContextPolicy(
        budget=context_budget(model_max_positions, engine_max_len, rollouts["context_tokens"]),
        policy=policy, reserve=rollouts["compaction_reserve"],
        keep_observations=rollouts["keep_observations"],
        replay_fraction=rollouts["replay_fraction"], summary_tokens=rollouts["summary_tokens"])


def context_budget(model_max_positions: int, engine_max_len: int | None = None,
                   configured: int = 0) -> int:
    """Tokens one chunk may hold: the configured budget (0: none), capped by the model's
    positions and the engine's cache length."""
    return min(int(x) for x in (model_max_positions, engine_max_len, configured) if x)


@dataclasses.dataclass(frozen=True)
class Turn:
    """A finished turn as a later chunk replays it: the reply's ids as the trajectory holds them
    (sampled ids plus any closing glue) and the tool outputs that answered it (a stub once
    elided, so an episode of hundreds of turns holds only its newest outputs)."""
    reply_ids: list[int]
    observations: list[str]
    elided: bool = False


def auto_reserve(max_new_tokens: int, largest_output: int, room: int) -> int:
    """Free tokens a turn is expected to need: its reply budget plus the largest tool output
    (in tokens) the trial has seen, so a task whose commands print a lot compacts earlier
    instead of finding no room after the output; at most half the chunk's room past its
    instruction, and never less than the reply budget."""
    return max(max_new_tokens, min(max_new_tokens + largest_output, room // 2))


def _prefix(tok: Tokenizer, system: str, instruction: str, tool_format: str) -> list[int]:
    return tok.encode(render_prefix(system, instruction, tool_format),
                      add_special_tokens=False).ids


def stub(observations: list[str]) -> list[str]:
    """One turn's tool outputs as a single stub naming their size."""
    return [ELIDED.format(size=sum(len(o.encode()) for o in observations))]


def elide(turns: list[Turn], keep: int) -> list[Turn]:
    """Every turn's tool output but the newest `keep` turns' replaced by a stub naming its size."""
    cut = len(turns) - keep
    return [Turn(t.reply_ids, stub(t.observations), True) if i < cut and not t.elided else t
            for i, t in enumerate(turns)]


def replay_prompt(tok: Tokenizer, system: str, instruction: str, turns: list[Turn], *,
                  limit: int, omitted: int = 0,
                  tool_format: str = "qwen3_json") -> tuple[list[int], int] | None:
    """The instruction, then each turn's reply ids verbatim and its tool output; while longer
    than `limit`, the oldest turns are dropped (a note in the instruction counts them, with the
    `omitted` earlier), all of them if need be. Returns the ids and how many of `turns` were
    dropped; None if not even the instruction fits."""
    bodies = [t.reply_ids + encode_observation(tok, t.observations) for t in turns]
    for first in range(len(turns) + 1):
        dropped = omitted + first
        note = "\n\n" + OMITTED.format(turns=dropped) if dropped else ""
        ids = _prefix(tok, system, instruction + note, tool_format)
        for body in bodies[first:]:
            ids += body
        if len(ids) <= limit:
            return ids, first
    return None


def summary_note_ids(tok: Tokenizer) -> list[int]:
    """What asking for a summary adds to an observation (its length sizes the trigger)."""
    return encode_plain(tok, "\n" + SUMMARY_REQUEST)


def summary_prompt(tok: Tokenizer, system: str, instruction: str, summary: str,
                   last_output: list[str] = (), *, limit: int | None = None,
                   tool_format: str = "qwen3_json") -> list[int]:
    """The next chunk's prompt after a summary: the instruction, the policy's summary, then the
    tool output that filled the context (the summary was written from it, or from a stub of
    it, and the next turn usually acts on it): whole if the prompt stays within `limit`
    tokens, else as a stub, else left out."""
    head = f"{instruction}\n\n{SUMMARY_HEADER}\n{summary.strip()}"
    for shown in ([last_output, stub(last_output)] if last_output else []):
        ids = _prefix(tok, system, f"{head}\n\n{LAST_OUTPUT}\n" + "\n".join(shown), tool_format)
        if limit is None or len(ids) <= limit:
            return ids
    return _prefix(tok, system, head, tool_format)
