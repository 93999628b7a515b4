"""The multi-turn bash agent loop: generate, run the tool calls in the sandbox, append, repeat.

Why: RL trains on exactly the ids the engine sampled, with the log-probs and expert routes it
used. The loop therefore never re-renders text: the prefix is encoded once, each completion is
appended verbatim and each observation is encoded once (TITO), and every generate call's routes
are stitched into one routing record covering the whole final sequence for routing replay (R3).
tito=False swaps in the text round-trip of a TITO-less framework (retokenize.py), for ablations.
"""

from __future__ import annotations

import dataclasses
import time

import numpy as np
from tokenizers import Tokenizer

from t1jax.rollout import context as ctx
from t1jax.rollout.chat import parse_tool_calls, render_prefix
from t1jax.rollout.engine import FINISH_LENGTH, Engine, GenerateResult, SamplingParams
from t1jax.rollout.harness import (Reply, RolloutError, RouteRecord, Trajectory, TurnRecord,
                                   run_turns, stop_ids, truncate_middle)
from t1jax.rollout.retokenize import TextRoundTrip
from t1jax.rollout.settings import EpisodeSettings
from t1jax.rollout.tito import AuditReport, TrajectoryBuilder, audit, encode_observation

SYSTEM_PROMPT = (
    "You are an agent that solves tasks in a Linux terminal. You have one tool, `bash`: each "
    "call runs one command in a persistent shell inside the task's sandbox (working directory "
    "/app) and returns its output and exit code. Call it as often as you need. When the task is "
    "complete, reply without any tool call."
)


def format_observation(result, max_bytes: int) -> tuple[str, bool]:
    """Command output plus a line saying how it ended, head+tail truncated."""
    if result.timed_out:
        status = "[command timed out]"
    elif result.exit_code is None:
        status = "[command killed]"
    else:
        status = f"[exit code: {result.exit_code}]"
    out, cut = truncate_middle(result.output, max_bytes)
    return f"{out.rstrip(chr(10))}\n{status}" if out else status, cut or result.truncated


class _Chunk:
    """One context window of the trial: its builder, engine prompts and routes."""

    def __init__(self, tokenizer: Tokenizer, prompt_ids, tito: bool):
        self.builder = TrajectoryBuilder(tokenizer) if tito else TextRoundTrip(tokenizer)
        self.builder.start(prompt_ids)
        self.prompts: list[list[int]] = []
        self.routes = RouteRecord(by_token=tito)

    def generate(self, engine: Engine, params: SamplingParams, tito: bool) -> GenerateResult:
        prompt = self.builder.prompt_for_next_turn()
        if tito:  # only the positions this chunk has no routes for yet
            params = dataclasses.replace(params, routes_from=self.routes.routes_from(prompt))
        res = engine.generate([prompt], params)[0]
        self.routes.add(prompt, res)
        self.prompts.append(prompt)
        if tito:
            self.builder.add_completion(res.output_ids, res.output_logprobs, res.finish_reason)
        else:
            self.builder.add_result(len(prompt), res)
        return res

    def close(self, index: int) -> "_Chunk":
        """Audit the chunk (TITO) and keep only what the trial trains on, as compact arrays:
        the engine prompts and the builder's lists go, so a long episode's closed chunks cost
        their sample's bytes and nothing more."""
        b = self.builder
        self.report = audit(b, self.prompts, b.completions)
        if not self.report.ok:
            raise RolloutError(f"TITO audit failed in chunk {index}: {self.report.errors[:3]}")
        self.tokens = np.asarray(b.tokens, np.int32)
        self.loss_mask = np.asarray(b.loss_mask, np.int8)
        self.logprobs = np.asarray(b.logprobs, np.float64)  # as sampled, bit for bit
        self.route_rows = self.routes.final(len(b.tokens))
        self.route_drift, self.route_compared = self.routes.drift, self.routes.compared
        del self.builder, self.prompts, self.routes
        return self


class _Trial:
    """The trial's chunks: the open one and the closed (audited, compacted) ones."""

    def __init__(self, tokenizer: Tokenizer, prompt, tito: bool, max_tokens: int):
        self.tokenizer, self.tito, self.max_tokens = tokenizer, tito, max_tokens
        self.chunk = _Chunk(tokenizer, prompt, tito)
        self.closed: list[_Chunk] = []

    def spent(self) -> int:  # tokens of the finished chunks
        return sum(len(c.tokens) for c in self.closed)

    def new_chunk(self, prompt_ids, reserve: int) -> bool:
        """Close the open chunk and start the next from prompt_ids, if the trial has room."""
        if self.spent() + len(self.chunk.builder.tokens) + len(prompt_ids) + reserve \
                > self.max_tokens:
            return False
        self.closed.append(self.chunk.close(len(self.closed)))
        self.chunk = _Chunk(self.tokenizer, prompt_ids, self.tito)
        return True


class _Compactor:
    """Context management in the tools harness (context.py): after each turn, the turn's tool
    output goes into the chunk if a next turn still fits; else the chunk is compacted (elide:
    a new chunk replaying the turns; summary: the policy summarises, then a new chunk starts
    from its summary) or the episode stops."""

    def __init__(self, tokenizer: Tokenizer, system: str, instruction: str,
                 policy: ctx.ContextPolicy, sampling: SamplingParams, stops, prefix_len: int,
                 budget: int, tool_format: str = "qwen3_json"):
        self.tool_format = tool_format
        self.tok, self.system, self.instruction, self.policy = tokenizer, system, instruction, \
            policy
        self.sampling, self.stops, self.prefix_len, self.budget = sampling, stops, prefix_len, \
            budget
        self.history: list[ctx.Turn] = []  # turns a new chunk replays (elide)
        self.omitted = 0  # turns dropped from the replay so far
        self.largest_output = 0  # tokens of the largest tool output so far (sizes the reserve)

    def reserve(self) -> int:
        return self.policy.reserve or ctx.auto_reserve(self.sampling.max_new_tokens,
                                                       self.largest_output,
                                                       self.budget - self.prefix_len)

    def after_turn(self, trial: _Trial, engine: Engine, reply_at: int, observations,
                   records: list, versions: list) -> bool:
        """Place the turn's observations (compacting if need be); False: the context is
        exhausted and the episode ends."""
        p, chunk = self.policy, trial.chunk
        if p.policy == "elide":
            self.history.append(ctx.Turn(chunk.builder.tokens[reply_at:], observations))
        output_ids = len(encode_observation(self.tok, observations))
        self.largest_output = max(self.largest_output, output_ids)
        after = len(chunk.builder.tokens) + output_ids
        summary_room = (len(ctx.summary_note_ids(self.tok)) + p.summary_tokens
                        if p.policy == "summary" else 0)
        if self.budget - after >= self.reserve() + summary_room:
            chunk.builder.add_observation(observations)
            return True
        if p.policy == "elide":
            return self._elide(trial)
        if p.policy == "summary":
            return self._summarise(trial, engine, observations, after, summary_room, records,
                                   versions)
        return False

    def _elide(self, trial: _Trial) -> bool:
        p = self.policy
        self.history = ctx.elide(self.history, p.keep_observations)
        replay = ctx.replay_prompt(self.tok, self.system, self.instruction, self.history,
                                   limit=min(self.budget - self.reserve(), self.prefix_len + int(
                                       (self.budget - self.prefix_len) * p.replay_fraction)),
                                   omitted=self.omitted, tool_format=self.tool_format)
        if replay is None or not trial.new_chunk(replay[0], self.reserve()):
            return False
        self.history, self.omitted = self.history[replay[1]:], self.omitted + replay[1]
        return True

    def _summarise(self, trial: _Trial, engine: Engine, observations, after: int,
                   summary_room: int, records: list, versions: list) -> bool:
        chunk, shown = trial.chunk, observations  # the next chunk shows the output again
        if self.budget - after < summary_room:
            # this output and a summary do not both fit: the summary turn sees a stub of it
            observations = ctx.stub(observations)
            after = len(chunk.builder.tokens) + len(encode_observation(self.tok, observations))
        if self.budget - after < summary_room:
            return False
        chunk.builder.add_observation(observations, note=ctx.SUMMARY_REQUEST)
        res = chunk.generate(engine, dataclasses.replace(
            self.sampling, stop_token_ids=self.stops,
            max_new_tokens=self.policy.summary_tokens), True)
        versions.append(res.weight_version)
        records.append(TurnRecord(len(res.output_ids), res.finish_reason, [], [],
                                  summary=True, chunk=len(trial.closed)))
        summary = self.tok.decode(res.output_ids, skip_special_tokens=True)
        ids = ctx.summary_prompt(self.tok, self.system, self.instruction, summary, shown,
                                 limit=self.budget - self.reserve(),
                                 tool_format=self.tool_format)
        if len(ids) + self.reserve() > self.budget or not trial.new_chunk(ids, self.reserve()):
            return False
        self.history, self.omitted = [], 0
        return True


class _ToolsHarness:
    """The tools agent's side of the shared loop (harness.run_turns): prompts are the trial's
    ids (TITO), replies are parsed for tool calls, outputs are shown with their exit codes."""

    def __init__(self, trial: _Trial, compactor: _Compactor | None, engine: Engine,
                 tokenizer: Tokenizer, *, budget: int, max_new_tokens: int, tool_format: str,
                 max_observation_bytes: int):
        self.trial, self.compactor, self.engine, self.tok = trial, compactor, engine, tokenizer
        self.budget, self.max_new, self.tool_format = budget, max_new_tokens, tool_format
        self.max_observation_bytes = max_observation_bytes
        self.records: list[TurnRecord] = []
        self.versions: list[str] = []
        self.reply_at = 0  # where the last reply starts in its chunk

    def prepare(self) -> int | str:
        trial = self.trial
        prompt_len = len(trial.chunk.builder.prompt_for_next_turn())
        room = min(self.budget - prompt_len, trial.max_tokens - trial.spent() - prompt_len)
        return "tokens" if room < 1 else min(self.max_new, room)

    def generate(self, engine: Engine, params: SamplingParams) -> GenerateResult:
        self.reply_at = len(self.trial.chunk.builder.tokens)
        return self.trial.chunk.generate(engine, params, self.trial.tito)

    def read(self, res: GenerateResult) -> Reply:
        text = self.tok.decode(res.output_ids, skip_special_tokens=False)
        commands, errors = parse_tool_calls(text, self.tool_format)
        if not commands and not errors and res.finish_reason == FINISH_LENGTH:
            # A reply cut by max_new_tokens is not a final answer: say so and go on.
            errors.append(f"your reply was cut off after {len(res.output_ids)} tokens, before "
                          "a tool call or a final answer")
        record = TurnRecord(len(res.output_ids), res.finish_reason, [], errors,
                            chunk=len(self.trial.closed))
        return Reply(record, commands, done=not commands and not errors)

    def render(self, command: str, result) -> tuple[str, bool]:
        return format_observation(result, self.max_observation_bytes)

    def observe(self, reply: Reply, outputs: list[str]) -> bool:
        observations = outputs + [f"Error: {e}" for e in reply.record.errors]
        if self.compactor is None:
            self.trial.chunk.builder.add_observation(observations)
            return True
        return self.compactor.after_turn(self.trial, self.engine, self.reply_at, observations,
                                         self.records, self.versions)


def run_agent_episode(task, engine: Engine, tokenizer: Tokenizer, sandbox,
                      episode: EpisodeSettings = EpisodeSettings()) -> Trajectory:
    """Run one episode of `task` in `sandbox` (started by the caller, who also verifies it),
    as `episode` says (settings.EpisodeSettings; its open knobs closed by `resolved`: the
    system prompt defaults to this harness's SYSTEM_PROMPT).

    episode.max_tokens: the whole trial's budget, every chunk together (default: the engine's
    max_len). episode.context: the per-chunk budget and compaction policy (context.py); None:
    one chunk of max_tokens. episode.timeout_s: wall clock for the episode (default: the
    task's [agent] timeout_sec). tito=False: every prompt and the final sample are the
    conversation re-rendered as text and re-encoded, with sampled log-probs and routes
    attached by position (the "without TITO" ablation; no compaction). tool_format: how the
    model writes tool calls (chat.TOOL_FORMATS; a checkpoint's own, chat.tool_format_of).
    Raises RolloutError only when the rollout's record is unusable; model mistakes become
    observations.
    """
    e = episode.resolved(task, engine, SYSTEM_PROMPT)
    sampling, max_tokens, context, tito = e.sampling(), e.max_tokens, e.context, e.tito
    system_prompt, tool_format = e.system_prompt, e.tool_format
    deadline = time.monotonic() + e.timeout_s
    stops = stop_ids(tokenizer, sampling)
    prefix_text = render_prefix(system_prompt, task.instruction, tool_format)
    prefix = tokenizer.encode(prefix_text, add_special_tokens=False).ids
    budget = min(context.budget, max_tokens) if context is not None else max_tokens
    if len(prefix) >= budget:
        raise RolloutError(f"the prompt ({len(prefix)} tokens) does not fit max_tokens "
                           f"{budget}")
    trial = _Trial(tokenizer, prefix if tito else prefix_text, tito, max_tokens)
    compactor = None if context is None else _Compactor(
        tokenizer, system_prompt, task.instruction, context, sampling, stops, len(prefix), budget,
        tool_format)
    harness = _ToolsHarness(trial, compactor, engine, tokenizer, budget=budget,
                            max_new_tokens=sampling.max_new_tokens, tool_format=tool_format,
                            max_observation_bytes=e.max_observation_bytes)
    finish, n_calls = run_turns(harness, engine, sandbox, sampling=sampling, stops=stops,
                                max_turns=e.max_turns, deadline=deadline,
                                command_timeout_s=e.command_timeout_s)
    records, versions = harness.records, harness.versions
    chunk, closed = trial.chunk, trial.closed
    if tito:
        closed.append(chunk.close(len(closed)))
        report = AuditReport()  # one report for the trial; offsets are within each chunk
        for c in closed:
            report.drift_tokens_in_loss_region += c.report.drift_tokens_in_loss_region
            report.relocated += c.report.relocated
            report.errors += c.report.errors
        tokens = np.concatenate([c.tokens for c in closed]).tolist()
        loss_mask = np.concatenate([c.loss_mask for c in closed]).tolist()
        logprobs = np.concatenate([c.logprobs for c in closed]).tolist()
        route_rows = np.concatenate([c.route_rows for c in closed], axis=0)
        starts = np.cumsum([0] + [len(c.tokens) for c in closed[:-1]]).tolist()
        route_drift = sum(c.route_drift for c in closed)
        compared = sum(c.route_compared for c in closed)
    else:
        report = AuditReport()  # the audit would fail by design; retokenized_drift counts it
        b = chunk.builder
        tokens = b.finish()
        route_rows = b.place_routes(chunk.routes.final(len(tokens)))
        loss_mask, logprobs, starts = list(b.loss_mask), list(b.logprobs), [0]
        route_drift, compared = chunk.routes.drift, chunk.routes.compared
    return Trajectory(
        tokens=list(tokens), loss_mask=loss_mask, logprobs=logprobs, routes=route_rows,
        prompt_len=len(prefix), turns=sum(not r.summary for r in records), tool_calls=n_calls,
        finish=finish, records=records, audit=report, weight_versions=versions,
        route_drift=route_drift,
        retokenized_drift=0 if tito else chunk.builder.retokenized_drift,
        chunk_starts=[int(x) for x in starts], compactions=len(starts) - 1,
        route_compared=compared)
