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

from t1jax.rollout.chat import EOT, IM_END, parse_tool_calls, render_prefix
from t1jax.rollout.engine import FINISH_LENGTH, Engine, GenerateResult, SamplingParams
from t1jax.rollout.retokenize import TextRoundTrip
from t1jax.rollout.tito import AuditReport, TrajectoryBuilder, audit

SYSTEM_PROMPT = (
    "You are an agent that solves tasks in a Linux terminal. You have one tool, `bash`: each "
    "call runs one command in a persistent shell inside the task's sandbox (working directory "
    "/app) and returns its output and exit code. Call it as often as you need. When the task is "
    "complete, reply without any tool call."
)
FINISHES = ("done", "turns", "tokens", "timeout")


class RolloutError(RuntimeError):
    """This rollout cannot be trusted (bad routes, drifted tokens): abort it, do not train on it."""


@dataclasses.dataclass
class CommandRecord:
    command: str
    exit_code: int | None
    timed_out: bool
    truncated: bool  # the observation was cut (by the sandbox or by us)
    duration_s: float


@dataclasses.dataclass
class TurnRecord:
    sampled: int  # ids the engine sampled this turn
    finish_reason: str  # the engine's ("stop" | "length")
    commands: list[CommandRecord]
    errors: list[str]  # malformed tool calls, answered with an error observation


@dataclasses.dataclass
class Trajectory:
    tokens: list[int]
    loss_mask: list[int]  # 1 exactly on sampled ids (tito=False: on re-encoded assistant text)
    logprobs: list[float]  # sampling log-probs on sampled ids, 0 elsewhere
    routes: np.ndarray  # int32 [len(tokens), layers, k]; -1 where the model never ran
    prompt_len: int
    turns: int
    tool_calls: int
    finish: str  # one of FINISHES
    records: list[TurnRecord]
    audit: AuditReport  # empty with tito=False, where the audit fails by design
    weight_versions: list[str]  # one per generate call
    route_drift: int  # positions whose routes differed when a later call recomputed them
    retokenized_drift: int = 0  # tito=False: loss-region ids that are not the sampled ones


def truncate_middle(text: str, max_bytes: int) -> tuple[str, bool]:
    """Keep the head and tail of text within max_bytes (UTF-8), marking the cut."""
    data = text.encode("utf-8", errors="replace")
    if len(data) <= max_bytes:
        return text, False
    marker = f"\n[... {len(data) - max_bytes} bytes omitted ...]\n"
    keep = max(max_bytes - len(marker), 0)
    head, tail = data[:keep // 2], data[len(data) - (keep - keep // 2):]
    return (head.decode("utf-8", errors="ignore") + marker
            + tail.decode("utf-8", errors="ignore")), True


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


class _Routes:
    """Stitches each generate call's routes into one record; a position keeps the routes of the
    call that first ran it (what a prefix-caching engine reuses)."""

    def __init__(self):
        self.rows: np.ndarray | None = None
        self.drift = 0

    def add(self, prompt_len: int, res: GenerateResult) -> None:
        r = np.asarray(res.routed_experts)
        want = prompt_len + len(res.output_ids) - 1
        shape_ok = r.ndim == 3 and r.shape[0] == want and (
            self.rows is None or r.shape[1:] == self.rows.shape[1:])
        if not shape_ok:
            have = None if self.rows is None else self.rows.shape[1:]
            raise RolloutError(f"routed_experts has shape {r.shape}; expected ({want}, layers, k)"
                               f" with (layers, k) = {have or 'any'}")
        r = r.astype(np.int32)
        if self.rows is None:
            self.rows = r
            return
        n = min(len(self.rows), want)
        self.drift += int(np.any(self.rows[:n] != r[:n], axis=(1, 2)).sum())
        self.rows = np.concatenate([self.rows, r[len(self.rows):]], axis=0)

    def final(self, length: int) -> np.ndarray:
        if self.rows is None:
            raise RolloutError("no generate call returned routes")
        out = np.full((length,) + self.rows.shape[1:], -1, np.int32)
        out[:min(len(self.rows), length)] = self.rows[:length]
        return out


def _stop_ids(tok: Tokenizer, sampling: SamplingParams) -> tuple[int, ...]:
    extra = [i for i in (tok.token_to_id(IM_END), tok.token_to_id(EOT)) if i is not None]
    return tuple(dict.fromkeys(list(sampling.stop_token_ids) + extra))


def run_agent_episode(task, engine: Engine, tokenizer: Tokenizer, sandbox, *,
                      sampling: SamplingParams, max_turns: int = 300,
                      max_tokens: int | None = None, timeout_s: float | None = None,
                      command_timeout_s: float = 180.0, max_observation_bytes: int = 10_000,
                      system_prompt: str = SYSTEM_PROMPT, tito: bool = True) -> Trajectory:
    """Run one episode of `task` in `sandbox` (started by the caller, who also verifies it).

    max_tokens: the whole sequence's budget (default: the engine's max_len). timeout_s: wall
    clock for the episode (default: the task's [agent] timeout_sec). tito=False: every prompt
    and the final sample are the conversation re-rendered as text and re-encoded, with sampled
    log-probs and routes attached by position (the "without TITO" ablation). Raises
    RolloutError only when the rollout's record is unusable; model mistakes become observations.
    """
    max_tokens = int(max_tokens or getattr(engine, "max_len", 32768))
    timeout_s = float(timeout_s if timeout_s is not None
                      else getattr(getattr(task, "agent", None), "timeout_sec", 1800.0))
    deadline = time.monotonic() + timeout_s
    stops = _stop_ids(tokenizer, sampling)
    builder = TrajectoryBuilder(tokenizer) if tito else TextRoundTrip(tokenizer)
    prefix_text = render_prefix(system_prompt, task.instruction)
    prefix = tokenizer.encode(prefix_text, add_special_tokens=False).ids
    if len(prefix) >= max_tokens:
        raise RolloutError(f"the prompt ({len(prefix)} tokens) does not fit max_tokens "
                           f"{max_tokens}")
    builder.start(prefix if tito else prefix_text)
    routes, prompts, records, versions = _Routes(), [], [], []
    finish, n_calls = "turns", 0
    for _ in range(max_turns):
        prompt = builder.prompt_for_next_turn()
        room = max_tokens - len(prompt)
        if room < 1:
            finish = "tokens"
            break
        if records and time.monotonic() >= deadline:  # the first turn always runs
            finish = "timeout"
            break
        params = dataclasses.replace(sampling, stop_token_ids=stops,
                                     max_new_tokens=min(sampling.max_new_tokens, room))
        res = engine.generate([prompt], params)[0]
        routes.add(len(prompt), res)
        prompts.append(prompt)
        versions.append(res.weight_version)
        if tito:
            builder.add_completion(res.output_ids, res.output_logprobs, res.finish_reason)
        else:
            builder.add_result(len(prompt), res)
        text = tokenizer.decode(res.output_ids, skip_special_tokens=False)
        commands, errors = parse_tool_calls(text)
        if not commands and not errors and res.finish_reason == FINISH_LENGTH:
            # A reply cut by max_new_tokens is not a final answer: say so and go on.
            errors.append(f"your reply was cut off after {len(res.output_ids)} tokens, before "
                          "a tool call or a final answer")
        record = TurnRecord(len(res.output_ids), res.finish_reason, [], errors)
        records.append(record)
        if not commands and not errors:
            finish = "done"
            break
        observations = []
        for cmd in commands:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            t0 = time.monotonic()
            result = sandbox.exec(cmd, timeout=min(command_timeout_s, left))
            obs, cut = format_observation(result, max_observation_bytes)
            observations.append(obs)
            record.commands.append(CommandRecord(cmd, result.exit_code, result.timed_out, cut,
                                                 time.monotonic() - t0))
            n_calls += 1
        observations += [f"Error: {e}" for e in errors]
        if time.monotonic() >= deadline:
            finish = "timeout"
            break
        if len(records) < max_turns:  # only glue that a later turn will read
            builder.add_observation(observations)
    if tito:
        report = audit(builder, prompts, builder.completions)
        if not report.ok:
            raise RolloutError(f"TITO audit failed: {report.errors[:3]}")
        route_rows = routes.final(len(builder.tokens))
    else:
        report = AuditReport()  # the audit would fail by design; retokenized_drift counts it
        tokens = builder.finish()
        route_rows = builder.place_routes(routes.final(len(tokens)))
    return Trajectory(
        tokens=list(builder.tokens), loss_mask=list(builder.loss_mask),
        logprobs=list(builder.logprobs), routes=route_rows,
        prompt_len=len(prefix), turns=len(records), tool_calls=n_calls, finish=finish,
        records=records, audit=report, weight_versions=versions, route_drift=routes.drift,
        retokenized_drift=0 if tito else builder.retokenized_drift)
