"""The turn loop both agent harnesses share, and what an episode records.

Why one loop: the tools agent (agent.py: TITO, tool calls) and the Terminus-2 agent
(terminus_agent.py: a text round trip, JSON commands) differ only in how a turn's prompt is
built, how a reply is parsed and how outputs are shown (a `Harness`). The episode's rules (turn
and token budgets, the wall clock, sandbox limits, when an episode is done, the record of every
turn and generate call) are written here once, so both end episodes for the same reasons.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Protocol

import numpy as np
from tokenizers import Tokenizer

from t1jax.rollout.chat import EOT, IM_END
from t1jax.rollout.engine import Engine, GenerateResult, SamplingParams
from t1jax.rollout.tito import AuditReport
from t1jax.sandbox.base import SandboxLimitExceeded

# sandbox_limit: a budget enforced outside the sandbox ran out (storage quota, episode output)
FINISHES = ("done", "turns", "tokens", "timeout", "context", "sandbox_limit")


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
    # keyword-only, so subclasses' positional fields (TerminusTurnRecord.repair) keep their place
    summary: bool = dataclasses.field(default=False, kw_only=True)  # a summary request's reply
    limit: str = dataclasses.field(default="", kw_only=True)  # the sandbox budget that ran out
    chunk: int = dataclasses.field(default=0, kw_only=True)  # the trial's chunk the turn is in


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
    chunk_starts: list[int] = dataclasses.field(default_factory=lambda: [0],
                                                kw_only=True)  # see context.py
    compactions: int = dataclasses.field(default=0, kw_only=True)  # each starts a chunk
    # positions whose routes a later call returned again, so route_drift could compare them
    # (0 when each call returned only new positions' routes, as a fleet does)
    route_compared: int = dataclasses.field(default=0, kw_only=True)


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


class RouteRecord:
    """Stitches each generate call's routes into one record; a position keeps the routes of the
    call that first ran it (what a prefix-caching engine reuses). Each call needs only the
    positions the record lacks (routes_from): a fleet then sends each position's routes once
    per trial, linear in its tokens, not the whole trial's every turn. Where an engine returns
    earlier rows too, they are compared with the record: `drift` counts the positions whose
    routes differed, out of `compared`.

    by_token=False (the text round trip of configs/ablations.py:no_tito, whose re-encoded
    prompts may shift): rows are kept by position whatever token now sits there, as a
    framework stitching per-call routes would, and every call returns them all."""

    def __init__(self, by_token: bool = True):
        self.by_token = by_token
        self._buf: np.ndarray | None = None  # grows by doubling: a turn costs its new rows
        self._n = 0
        self.ids: np.ndarray = np.zeros(0, np.int64)  # the tokens the rows were run for
        self.drift = 0
        self.compared = 0

    @property
    def rows(self) -> np.ndarray | None:
        return None if self._buf is None else self._buf[:self._n]

    def _put(self, at: int, new: np.ndarray) -> None:
        """Rows [at, at + len(new)) become `new`; rows after them are dropped."""
        end = at + len(new)
        if self._buf is None or end > len(self._buf):
            grown = np.empty((max(end, 2 * (0 if self._buf is None else len(self._buf))),)
                             + new.shape[1:], np.int32)
            if self._buf is not None:
                grown[:at] = self._buf[:at]
            self._buf = grown
        self._buf[at:end] = new
        self._n = end

    def routes_from(self, prompt) -> int:
        """The first position of `prompt` whose routes the record lacks: its rows, as far as
        the prompt repeats the tokens they were run for."""
        prompt = np.asarray(prompt, np.int64)
        n = min(len(self.ids), len(prompt))
        differs = np.flatnonzero(prompt[:n] != self.ids[:n])
        return int(differs[0]) if len(differs) else n

    def add(self, prompt, res: GenerateResult) -> None:
        prompt = np.asarray(prompt, np.int64)
        r = np.asarray(res.routed_experts)
        start = int(getattr(res, "routes_start", 0))
        want = len(prompt) + len(res.output_ids) - 1
        shape_ok = r.ndim == 3 and start + r.shape[0] == want and (
            self.rows is None or r.shape[1:] == self.rows.shape[1:])
        if not shape_ok:
            have = None if self.rows is None else self.rows.shape[1:]
            raise RolloutError(f"routed_experts has shape {r.shape} from position {start}; "
                               f"expected ({want - start}, layers, k) with (layers, k) = "
                               f"{have or 'any'}")
        # the rows still valid for this prompt (by_token: as far as its tokens repeat theirs)
        keep = 0 if self.rows is None else (self.routes_from(prompt) if self.by_token
                                            else len(self.rows))
        if start > keep:
            raise RolloutError(f"routed_experts start at position {start}, but the record "
                               f"holds this prompt's routes only up to {keep}")
        r = np.asarray(r, np.int32)
        fed = np.concatenate([prompt, np.asarray(res.output_ids, np.int64)])[:want]
        if self._buf is None:
            self._put(0, r)
            self.ids = fed
            return
        n = min(keep, want)
        if n > start:  # earlier rows returned again: do they agree?
            self.drift += int(np.any(self.rows[start:n] != r[:n - start], axis=(1, 2)).sum())
            self.compared += n - start
        self._put(keep, r[keep - start:])
        self.ids = fed

    def final(self, length: int) -> np.ndarray:
        if self.rows is None:
            raise RolloutError("no generate call returned routes")
        out = np.full((length,) + self.rows.shape[1:], -1, np.int32)
        out[:min(len(self.rows), length)] = self.rows[:length]
        return out


def stop_ids(tok: Tokenizer, sampling: SamplingParams) -> tuple[int, ...]:
    """The ids that end a turn: the sampling's own plus the template's end-of-turn markers."""
    extra = [i for i in (tok.token_to_id(IM_END), tok.token_to_id(EOT)) if i is not None]
    return tuple(dict.fromkeys(list(sampling.stop_token_ids) + extra))


def exec_within_limits(sandbox, cmd: str, timeout: float, record: TurnRecord):
    """Run one command; None when a budget the sandbox enforces ran out (the episode ends,
    and record.limit says why)."""
    t0 = time.monotonic()
    try:
        return sandbox.exec(cmd, timeout=timeout)
    except SandboxLimitExceeded as err:
        record.commands.append(CommandRecord(cmd, None, False, False, time.monotonic() - t0))
        record.limit = str(err)
        return None


def run_commands(sandbox, commands, record: TurnRecord, *, deadline: float,
                 command_timeout_s: float, render) -> list[str]:
    """A turn's commands, run in order until the episode's deadline or a sandbox limit stops
    them (both agent loops run their commands here). Each result is shown to the model as
    `render(cmd, result)` -> (text, cut) and recorded on `record`; returns the texts."""
    outputs = []
    for cmd in commands:
        left = deadline - time.monotonic()
        if left <= 0:
            break
        t0 = time.monotonic()
        result = exec_within_limits(sandbox, cmd, min(command_timeout_s, left), record)
        if result is None:
            break
        text, cut = render(cmd, result)
        outputs.append(text)
        record.commands.append(CommandRecord(cmd, result.exit_code, result.timed_out, cut,
                                             time.monotonic() - t0))
    return outputs


@dataclasses.dataclass
class Reply:
    """A sampled reply as the harness read it."""
    record: TurnRecord  # the turn's record (commands are added as they run)
    commands: list[str] = dataclasses.field(default_factory=list)  # to run, in order
    done: bool = False  # the agent says the task is complete: the episode ends after `commands`
    summary: bool = False  # a compaction summary, not a turn: nothing runs


class Harness(Protocol):
    """How one agent builds prompts, reads replies and shows outputs. The loop appends each
    reply's record and weight version to `records` and `versions` (a harness that samples on
    its own, as the tools agent's summaries do, appends there too)."""
    records: list[TurnRecord]
    versions: list[str]

    def prepare(self) -> int | str:
        """The next turn's max_new_tokens, or the finish ("tokens", "context") if none fits."""

    def generate(self, engine: Engine, params: SamplingParams) -> GenerateResult:
        """Sample the reply to the prepared prompt and add it to the trial's record."""

    def read(self, result: GenerateResult) -> Reply:
        """Parse the sampled reply."""

    def render(self, command: str, result) -> tuple[str, bool]:
        """One command's result as the model will see it, and whether it was cut."""

    def observe(self, reply: Reply, outputs: list[str]) -> bool:
        """Show the turn's outputs; False: the context is exhausted."""


def run_turns(harness: Harness, engine: Engine, sandbox, *, sampling: SamplingParams,
              stops: tuple[int, ...], max_turns: int, deadline: float,
              command_timeout_s: float) -> tuple[str, int]:
    """Turns until the agent is done or a budget ends the episode: (finish, commands run).
    The first turn always runs, whatever the clock says; a summary does not count as a turn;
    the last turn's outputs are not shown (no later turn would read them)."""
    finish, n_calls, turns = "turns", 0, 0
    while turns < max_turns:
        max_new = harness.prepare()
        if isinstance(max_new, str):
            finish = max_new
            break
        if harness.records and time.monotonic() >= deadline:
            finish = "timeout"
            break
        res = harness.generate(engine, dataclasses.replace(
            sampling, stop_token_ids=stops, max_new_tokens=max_new))
        harness.versions.append(res.weight_version)
        reply = harness.read(res)
        harness.records.append(reply.record)
        if reply.summary:
            continue
        turns += 1
        outputs = run_commands(sandbox, reply.commands, reply.record, deadline=deadline,
                               command_timeout_s=command_timeout_s, render=harness.render)
        n_calls += len(outputs)
        if reply.record.limit:
            finish = "sandbox_limit"
            break
        if reply.done:
            finish = "done"
            break
        if time.monotonic() >= deadline:
            finish = "timeout"
            break
        if turns >= max_turns:
            break
        if not harness.observe(reply, outputs):
            finish = "context"  # the next turn would not fit, and compaction cannot help
            break
    return finish, n_calls
