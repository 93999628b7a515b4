"""A Terminus-2 style episode run as a TEXT round trip, joined to the sampled ids by repair.

Why: external harnesses (Terminus-2 among them) keep the conversation as text and re-render and
re-encode it every turn, so the new prompt need not extend the ids the model sampled. This
harness does the same on purpose and joins each re-encoded prompt with `tito.repair_boundary`:
strict and retokenized keep every sampled id (loss mask 1), normalized replaces at most a
couple of edge tokens, and split starts a new chunk. The per-case counts tell how far a text
harness drifts from TITO; the audit proves no sampled id drifted inside a chunk.
"""

from __future__ import annotations

import dataclasses
import time
from collections import Counter
from types import SimpleNamespace

import numpy as np
from tokenizers import Tokenizer

from t1jax.rollout import context as ctx
from t1jax.rollout.harness import (Reply, RolloutError, RouteRecord, Trajectory, TurnRecord,
                                   run_turns, stop_ids, truncate_middle)
from t1jax.rollout.chat import IM_END, IM_START
from t1jax.rollout.engine import Engine, SamplingParams
from t1jax.rollout.terminus import (SYSTEM_PROMPT, TerminusSession, first_user_message,
                                    parse_terminus_reply)
from t1jax.rollout.settings import EpisodeSettings
from t1jax.rollout.tito import REPAIR_CASES, AuditReport, audit, encode_plain, repair_boundary


@dataclasses.dataclass
class TerminusTurnRecord(TurnRecord):
    repair: str = ""  # how this turn's prompt joined the previous ids ("" for a chunk's first)
    trained: int = 0  # sampled ids kept with loss mask 1 (a normalized join may trim the edge)


@dataclasses.dataclass
class TerminusTrajectory(Trajectory):
    """A Trajectory of one or more chunks laid end to end; each chunk is its own sequence (a
    split restarts the context), so train chunk by chunk. routes, offsets and the audit's
    relocated completions are in the concatenated coordinates."""
    chunk_starts: list[int] = dataclasses.field(default_factory=list)
    repairs: dict = dataclasses.field(default_factory=dict)  # case -> joins, every REPAIR_CASE
    parse_errors: int = 0

    def chunks(self) -> list[tuple[int, int]]:
        ends = self.chunk_starts[1:] + [len(self.tokens)]
        return list(zip(self.chunk_starts, ends))


def render_ids(tok: Tokenizer, system: str, messages: list[tuple[str, str]]) -> list[int]:
    """The conversation in the Qwen template plus the assistant header, as one encode would
    give it: text between special tokens is encoded as a run; user text is plain (a terminal
    cannot inject `<|im_end|>`), assistant text may hold special tokens the model sampled."""
    start, end = tok.token_to_id(IM_START), tok.token_to_id(IM_END)
    ids: list[int] = []
    for role, content in [("system", system)] + messages + [("assistant", None)]:
        ids.append(start)
        if content is None:
            return ids + encode_plain(tok, "assistant\n")
        if role == "assistant":
            ids += tok.encode(f"assistant\n{content}", add_special_tokens=False).ids
        else:
            ids += encode_plain(tok, f"{role}\n{content}")
        ids += [end] + encode_plain(tok, "\n")
    return ids


def _screen(cmd: str, result, max_bytes: int) -> tuple[str, bool]:
    """What a terminal would show for one command: the typed line and its output."""
    out, cut = truncate_middle(result.output, max_bytes)
    text = f"$ {cmd}\n{out.rstrip(chr(10))}" if out else f"$ {cmd}"
    if result.timed_out:
        text += "\n[command timed out]"
    return text, cut or result.truncated


class _Chunk:
    """One contiguous sequence: ids, mask, log-probs, routes and its engine calls."""

    def __init__(self, prompt: list[int]):
        self.tokens, self.mask, self.lps = list(prompt), [0] * len(prompt), [0.0] * len(prompt)
        self.routes, self.prompts, self.completions = RouteRecord(), [], []

    def extend_to(self, ids: list[int], keep: int) -> None:
        """Become ids, whose first `keep` tokens are ours; the rest is new glue (mask 0)."""
        tail = ids[keep:]
        self.tokens = self.tokens[:keep] + tail
        self.mask = self.mask[:keep] + [0] * len(tail)
        self.lps = self.lps[:keep] + [0.0] * len(tail)
        if self.routes.rows is not None and len(self.routes.rows) > keep:
            self.routes.rows = self.routes.rows[:keep]  # rows of replaced tokens are stale
        if self.completions:  # a normalized join may trim the last completion's edge
            off = len(self.prompts[-1])
            self.completions[-1] = self.completions[-1][:max(keep - off, 0)]


class _Compactor:
    """Context management for the text harness (t1jax/rollout/context.py's policies, applied
    to the conversation's messages): before a turn whose prompt would leave less than a turn's
    room in the chunk, `stop` ends the episode; `elide` rewrites the conversation with old
    terminal outputs stubbed (the oldest exchanges dropped if need be); `summary` asks the
    policy for a summary in this chunk and continues from the task and that summary, with the
    last terminal output as the terminal's state. A rewrite is a new chunk of the trial: its prompt is the rewritten
    conversation exactly as the engine gets it."""

    def __init__(self, tok, system: str, instruction: str, policy: ctx.ContextPolicy,
                 sampling: SamplingParams, prefix_len: int, budget: int):
        self.tok, self.system, self.instruction, self.policy = tok, system, instruction, policy
        self.max_new, self.prefix_len, self.budget = sampling.max_new_tokens, prefix_len, budget
        self.largest_output, self.asked, self.compactions, self.omitted = 0, False, 0, 0
        self.last_output, self.first = "", first_user_message(instruction)  # without a note
        self.ask = (len(encode_plain(tok, "\n\n" + ctx.SUMMARY_REQUEST)) + policy.summary_tokens
                    if policy.policy == "summary" else 0)  # room a summary turn needs

    def reserve(self) -> int:
        return self.policy.reserve or ctx.auto_reserve(self.max_new, self.largest_output,
                                                       self.budget - self.prefix_len)

    def _length(self, messages) -> int:
        return len(render_ids(self.tok, self.system, messages))

    def before_turn(self, messages):
        """(messages, rewritten): unchanged, rewritten into a new chunk, with the summary
        request added, or (None, False) to stop."""
        if len(messages) > 1 and messages[-1][0] == "user":
            self.last_output = messages[-1][1]
            self.largest_output = max(self.largest_output,
                                      len(encode_plain(self.tok, self.last_output)))
        if self._length(messages) + self.reserve() + self.ask <= self.budget:
            return messages, False
        if self.policy.policy == "elide":
            rewritten = self._elide(messages)
            if rewritten is not None:
                self.compactions += 1
            return rewritten, rewritten is not None
        if self.policy.policy == "summary":
            role, last = messages[-1]
            for shown in (last, ctx.stub([last])[0]):
                asked = messages[:-1] + [(role, f"{shown}\n\n{ctx.SUMMARY_REQUEST}")]
                if self._length(asked) + self.policy.summary_tokens <= self.budget:
                    self.asked = True
                    return asked, False
        return None, False

    def after_summary(self, summary: str) -> list[tuple[str, str]]:
        self.asked, self.compactions = False, self.compactions + 1
        head = f"{self.instruction}\n\n{ctx.SUMMARY_HEADER}\n{summary.strip()}"
        for shown in (self.last_output, ctx.stub([self.last_output])[0], None):
            # the terminal as the summary left it: the output that filled the context
            messages = [("user", first_user_message(head, shown or ""))]
            if shown is None or self._length(messages) + self.reserve() <= self.budget:
                self.first, self.omitted = messages[0][1], 0
                return messages

    def _elide(self, messages):
        """Old terminal outputs stubbed (the newest keep_observations whole), then the oldest
        exchanges dropped until the replay fits its share of the chunk; None if nothing fits."""
        keep, p = self.policy.keep_observations, self.policy
        outputs = [i for i, (role, _) in enumerate(messages) if role == "user" and i > 0]
        old = set(outputs[:max(len(outputs) - keep, 0)])
        stubbed = [(role, ctx.stub([text])[0] if i in old and not text.startswith("[output")
                    else text) for i, (role, text) in enumerate(messages)]
        limit = min(self.budget - self.reserve(), self.prefix_len + int(
            (self.budget - self.prefix_len) * p.replay_fraction))
        rest = stubbed[1:]
        for drop in range(0, len(rest) + 1, 2):  # whole exchanges: a reply and its output
            omitted = self.omitted + drop // 2
            note = "\n\n" + ctx.OMITTED.format(turns=omitted) if omitted else ""
            candidate = [("user", self.first + note)] + rest[drop:]
            if self._length(candidate) <= limit:
                self.omitted = omitted
                return candidate
        return None


def _lcp(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    return next((i for i in range(n) if a[i] != b[i]), n)


class _TerminusHarness:
    """The Terminus-2 agent's side of the shared loop (harness.run_turns): each prompt is the
    whole conversation re-rendered and joined to the ids already held (`repair_boundary`), or
    a new chunk after a split or a compaction; replies are Terminus-2 JSON."""

    def __init__(self, tok: Tokenizer, system: str, instruction: str, sampling: SamplingParams,
                 stops, *, budget: int, max_tokens: int, max_observation_bytes: int,
                 compactor: _Compactor | None):
        self.tok, self.system, self.stops = tok, system, stops
        self.budget, self.max_tokens, self.compactor = budget, max_tokens, compactor
        self.max_new, self.max_observation_bytes = sampling.max_new_tokens, max_observation_bytes
        self.im_end = tok.token_to_id(IM_END)
        self.session = TerminusSession()
        self.messages = [("user", first_user_message(instruction))]
        self.prefix = render_ids(tok, system, self.messages)
        self.chunks = [_Chunk(self.prefix)]
        self.counts: Counter = Counter()
        self.records: list[TurnRecord] = []
        self.versions: list[str] = []
        self.n_parse = 0
        self.fresh = False  # the conversation was just rewritten: the next prompt starts a chunk
        self.pending = None  # the prepared join: (repair, ids, new chunk or None, keep)

    def prepare(self) -> int | str:
        chunk, compactor, repair = self.chunks[-1], self.compactor, ""
        ids, nxt, keep = chunk.tokens, None, len(chunk.tokens)
        if self.records:  # re-render the whole conversation and join it to the ids we hold
            if compactor is not None and not self.fresh:
                self.messages, self.fresh = compactor.before_turn(self.messages)
                if self.messages is None:
                    return "context"
            new = render_ids(self.tok, self.system, self.messages)
            if self.fresh:  # a compaction's rewrite: a new chunk, not a join
                ids, nxt = new, _Chunk(new)
                if sum(len(c.tokens) for c in self.chunks) + len(new) + compactor.reserve() \
                        > self.max_tokens:
                    return "context"
            else:
                repair, ids = repair_boundary(chunk.tokens, new, chunk.completions[-1], self.tok)
                if repair == "split":
                    nxt = _Chunk(new)
                elif repair not in ("strict", "retokenized"):
                    keep = _lcp(chunk.tokens, ids)
            if len(ids) >= self.budget:
                return "tokens"
        self.pending = (repair, ids, nxt, keep)
        summarising = compactor is not None and compactor.asked
        return min(compactor.policy.summary_tokens if summarising else self.max_new,
                   self.budget - len(ids))

    def generate(self, engine: Engine, params: SamplingParams):
        repair, ids, nxt, keep = self.pending  # applied only now: a timeout leaves it out
        if repair:
            self.counts[repair] += 1
        if nxt is not None:
            self.chunks.append(nxt)
        elif self.records:
            self.chunks[-1].extend_to(ids, keep)
        self.fresh, self.repair = False, repair
        chunk = self.chunks[-1]
        prompt = list(chunk.tokens)
        res = engine.generate([prompt], dataclasses.replace(
            params, routes_from=chunk.routes.routes_from(prompt)))[0]
        chunk.routes.add(prompt, res)
        chunk.prompts.append(prompt)
        sampled = [int(t) for t in res.output_ids]
        if len(sampled) != len(res.output_logprobs):
            raise RolloutError(f"{len(sampled)} sampled ids but {len(res.output_logprobs)} "
                               "logprobs")
        chunk.completions.append(sampled)
        chunk.tokens += sampled
        chunk.mask += [1] * len(sampled)
        chunk.lps += [float(x) for x in res.output_logprobs]
        self.body = sampled[:-1] if sampled and sampled[-1] in self.stops else sampled
        if len(self.body) == len(sampled):  # cut on max tokens: the template closes the turn
            chunk.tokens.append(self.im_end)
            chunk.mask.append(0)
            chunk.lps.append(0.0)
        return res

    def read(self, res) -> Reply:
        text = self.text = self.tok.decode(self.body, skip_special_tokens=False)
        summarising = self.compactor is not None and self.compactor.asked
        record = TerminusTurnRecord(len(res.output_ids), res.finish_reason, [], [],
                                    repair=self.repair, summary=summarising,
                                    chunk=len(self.chunks) - 1)
        if summarising:  # the reply is the summary; the next chunk starts from it
            self.messages, self.fresh = self.compactor.after_summary(text), True
            return Reply(record, summary=True)
        self.reply, err = parse_terminus_reply(text)
        if err is not None:  # answered with the parse error; nothing runs
            self.n_parse += 1
            record.errors.append(err)
            self.action = None
            return Reply(record)
        self.action = self.session.step(self.reply)
        return Reply(record, list(self.action.commands), done=self.action.kind == "done")

    def render(self, command: str, result) -> tuple[str, bool]:
        return _screen(command, result, self.max_observation_bytes)

    def observe(self, reply: Reply, outputs: list[str]) -> bool:
        if self.action is None:
            note = self.session.parse_error(reply.record.errors[0])
        else:
            note = self.session.observe(outputs, self.reply.warnings + self.action.notes)
        self.messages += [("assistant", self.text), ("user", note)]
        return True


def run_terminus_episode(task, engine: Engine, tokenizer: Tokenizer, sandbox,
                         episode: EpisodeSettings = EpisodeSettings()) -> TerminusTrajectory:
    """Run one Terminus-2 episode of `task` in `sandbox` (started and verified by the caller),
    as `episode` says (settings.EpisodeSettings; the system prompt defaults to Terminus-2's;
    its tool_format and tito do not apply: Terminus-2 writes JSON commands, read as text).

    episode.max_tokens bounds each engine prompt plus its completion (default: the engine's
    max_len); with episode.context it is the whole trial's budget, and each chunk holds
    context.budget tokens (compaction: _Compactor). episode.timeout_s is the episode's wall
    clock (default: the task's [agent] timeout_sec). The episode ends "done" on a confirmed
    task_complete. Raises RolloutError when the record is unusable.
    """
    e = episode.resolved(task, engine, SYSTEM_PROMPT)
    sampling, max_tokens, context, system_prompt = (e.sampling(), e.max_tokens, e.context,
                                                     e.system_prompt)
    deadline = time.monotonic() + e.timeout_s
    stops = stop_ids(tokenizer, sampling)
    budget = min(context.budget, max_tokens) if context is not None else max_tokens
    prefix_len = len(render_ids(tokenizer, system_prompt,
                                [("user", first_user_message(task.instruction))]))
    if prefix_len >= budget:
        raise RolloutError(f"the prompt ({prefix_len} tokens) does not fit max_tokens "
                           f"{budget}")
    compactor = _Compactor(tokenizer, system_prompt, task.instruction, context, sampling,
                           prefix_len, budget) if context is not None else None
    harness = _TerminusHarness(tokenizer, system_prompt, task.instruction, sampling, stops,
                               budget=budget, max_tokens=max_tokens,
                               max_observation_bytes=e.max_observation_bytes, compactor=compactor)
    finish, n_calls = run_turns(harness, engine, sandbox, sampling=sampling, stops=stops,
                                max_turns=e.max_turns, deadline=deadline,
                                command_timeout_s=e.command_timeout_s)
    return _assemble(harness.chunks, prefix_len, harness.records, harness.versions,
                     harness.counts, finish, n_calls, harness.n_parse,
                     compactor.compactions if compactor is not None else 0)


def _assemble(chunks, prompt_len, records, versions, counts, finish, n_calls,
              n_parse, compactions) -> TerminusTrajectory:
    """Concatenate the chunks and audit each: sampled ids must sit unchanged where sampled."""
    tokens, mask, lps, routes, starts = [], [], [], [], []
    report, drift, compared, turn = AuditReport(), 0, 0, 0
    for chunk in chunks:
        base = len(tokens)
        starts.append(base)
        rep = audit(SimpleNamespace(tokens=chunk.tokens), chunk.prompts, chunk.completions)
        report.drift_tokens_in_loss_region += rep.drift_tokens_in_loss_region
        report.relocated += [r + base if r >= 0 else r for r in rep.relocated]
        report.errors += rep.errors
        for comp in chunk.completions:
            records[turn].trained = len(comp)
            turn += 1
        rows = chunk.routes.final(len(chunk.tokens))
        if rows.shape[0] != len(chunk.tokens):
            raise RolloutError(f"routes cover {rows.shape[0]} of {len(chunk.tokens)} tokens")
        tokens += chunk.tokens
        mask += chunk.mask
        lps += chunk.lps
        routes.append(rows)
        drift += chunk.routes.drift
        compared += chunk.routes.compared
    if not report.ok:
        raise RolloutError(f"TITO audit failed: {report.errors[:3]}")
    return TerminusTrajectory(
        tokens=tokens, loss_mask=mask, logprobs=lps, routes=np.concatenate(routes, axis=0),
        prompt_len=prompt_len, turns=sum(not r.summary for r in records), tool_calls=n_calls,
        finish=finish, records=records, audit=report, weight_versions=versions,
        route_drift=drift, chunk_starts=starts, compactions=compactions,
        route_compared=compared,
        repairs={c: counts.get(c, 0) for c in REPAIR_CASES}, parse_errors=n_parse)
