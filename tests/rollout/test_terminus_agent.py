"""The Terminus-2 text round-trip harness: a scripted engine (a test double for the model) solves
the real `count-log-errors` sandbox with double confirmation, once sampling canonical ids (every
join is strict) and once sampling char-split ids (every join is retokenized, the sampled ids
stay in training); malformed JSON is answered with a parse error; a stop on <|endoftext|>
normalizes, undecodable bytes split the episode into chunks, and budgets stop the loop.
"""

from __future__ import annotations

import json
import uuid

import numpy as np
import pytest

from t1jax.rollout.chat import EOT, IM_END
from t1jax.rollout.engine import FINISH_STOP, GenerateResult
from t1jax.rollout.settings import EpisodeSettings
from t1jax.rollout.terminus_agent import render_ids, run_terminus_episode
from t1jax.rollout.trial import task_limits
from t1jax.sandbox.backend import SandboxSpec
from t1jax.sandbox.base import ExecResult, Limits
from t1jax.tasks.task import load_task
from t1jax.verify.reward import GlobalScale
from t1jax.verify.verifier import verify
from conftest import COUNT_LOG_SOLVE, COUNT_LOG_TASK

TASK_DIR = COUNT_LOG_TASK
LAYERS, K = 2, 2
EPISODE = EpisodeSettings(temperature=1.0, max_new_tokens=512)
SOLVE = COUNT_LOG_SOLVE


def reply(keys: list[str], done: bool = False, note: str = "Next step.") -> str:
    return json.dumps({"analysis": note, "plan": note,
                       "commands": [{"keystrokes": k, "duration": 0.5} for k in keys],
                       "task_complete": done}, indent=2)


class ScriptedEngine:
    """A test double for the model: returns pre-written replies as ids of the real tokenizer,
    canonical or split one character at a time (what a sampler may pick), with fake log-probs
    and routes of the contract's shape."""

    weight_version = "scripted"

    def __init__(self, tok, texts, char_split=False, stop=IM_END, tail=(), repeat_last=False):
        self.tok, self.texts, self.split, self.repeat = tok, list(texts), char_split, repeat_last
        self.stop, self.tail = tok.token_to_id(stop), list(tail)  # tail: ids before the stop
        self.prompts: list[list[int]] = []
        self.outputs: list[list[int]] = []

    def ids(self, text):
        if not self.split:
            return self.tok.encode(text, add_special_tokens=False).ids
        return [i for c in text for i in self.tok.encode(c, add_special_tokens=False).ids]

    def generate(self, prompts, sampling):
        (prompt,) = prompts
        assert self.stop in sampling.stop_token_ids
        self.prompts.append(list(prompt))
        text = self.texts.pop(0) if len(self.texts) > 1 or not self.repeat else self.texts[0]
        ids = self.ids(text) + self.tail + [self.stop]
        self.outputs.append(ids)
        rows = len(prompt) + len(ids) - 1
        routes = (np.arange(rows * LAYERS * K) % 5).reshape(rows, LAYERS, K).astype(np.int32)
        return [GenerateResult(ids, [-0.25] * len(ids), routes, FINISH_STOP, "scripted")]

    def load_weights(self, params_state, version):
        raise NotImplementedError


class FakeSandbox:
    """A test double for a sandbox: echoes what it was asked to run."""

    def __init__(self):
        self.ran = []

    def exec(self, cmd, timeout=None):
        self.ran.append(cmd)
        return ExecResult(output=f"ran {cmd}\n", exit_code=0)


@pytest.fixture(scope="module")
def task():
    return load_task(TASK_DIR)


SOLVING = [reply(["ls /app/logs\n"], note="Look at the logs first."),
           '{"analysis": "oops", "commands": [ {"keystrokes": "ls"',  # malformed JSON
           reply([SOLVE + "\n"], done=True, note="Count errors per service."),
           reply([], done=True, note="The report is written.")]


def check_sampled(traj, engine):
    """Every sampled id sits where it was sampled with mask 1; nothing else is trained."""
    assert traj.audit.ok and traj.audit.drift_tokens_in_loss_region == 0, traj.audit.errors
    n = len(traj.tokens)
    assert len(traj.loss_mask) == len(traj.logprobs) == n
    assert traj.routes.shape == (n, LAYERS, K) and traj.routes.dtype == np.int32
    want = np.zeros(n, int)
    for off, out, rec in zip(traj.audit.relocated, engine.outputs, traj.records):
        kept = out[:rec.trained]
        assert traj.tokens[off:off + len(kept)] == kept
        want[off:off + len(kept)] = 1
    assert (np.asarray(traj.loss_mask) == want).all()
    assert all(lp == 0.0 for lp, m in zip(traj.logprobs, traj.loss_mask) if not m)
    assert all(lp == -0.25 for lp, m in zip(traj.logprobs, traj.loss_mask) if m)


@pytest.mark.parametrize("char_split", [False, True], ids=["canonical", "char-split"])
def test_solves_task_with_double_confirmation(tok, task, docker_backend, char_split):
    run_id = f"test-terminus-{uuid.uuid4().hex[:8]}"
    image = docker_backend.build(task)
    limits = task_limits(task, Limits())
    engine = ScriptedEngine(tok, SOLVING, char_split=char_split)
    try:
        with docker_backend.create(SandboxSpec(image=image, limits=limits, workdir="/app",
                                               run_id=run_id)) as box:
            traj = run_terminus_episode(task, engine, tok, box, EPISODE.replace(max_tokens=8192))
            report = verify(task, box, docker_backend, GlobalScale(5, "test"), run_id=run_id,
                            limits=limits)
    finally:
        docker_backend.reap(run_id)
    assert report.solved and report.reward > 0, report.log[-2000:]
    assert traj.finish == "done" and traj.turns == 4 and traj.tool_calls == 2
    assert traj.parse_errors == 1 and traj.records[1].errors and not traj.records[1].commands
    case = "retokenized" if char_split else "strict"
    assert traj.repairs == {"strict": 0, "normalized": 0, "retokenized": 0, "split": 0,
                            case: 3}
    assert [r.repair for r in traj.records] == ["", case, case, case]
    assert traj.chunk_starts == [0] and traj.route_drift == 0
    assert all(r.trained == r.sampled for r in traj.records)
    check_sampled(traj, engine)
    for prev, nxt in zip(engine.prompts, engine.prompts[1:]):
        assert nxt[:len(prev)] == prev  # within a chunk every prompt extends the last
    if char_split:  # what a re-encode would have trained on is not what was sampled
        assert tok.encode(SOLVING[0], add_special_tokens=False).ids != engine.outputs[0][:-1]
    seen = [tok.decode(b[len(a):], skip_special_tokens=False)
            for a, b in zip(engine.prompts, engine.prompts[1:])]
    assert "New Terminal Output" in seen[0] and "backend.log" in seen[0]
    assert "Previous response had parsing errors" in seen[1]
    assert "TOTAL:" in seen[2] and "You set task_complete to true" in seen[2]


def test_prefix_is_the_plain_template(tok):
    ids = render_ids(tok, "SYS", [("user", "hi <|im_end|>")])
    text = tok.decode(ids, skip_special_tokens=False)
    assert text == "<|im_start|>system\nSYS<|im_end|>\n<|im_start|>user\nhi <|im_end|>" \
        "<|im_end|>\n<|im_start|>assistant\n"
    assert ids.count(tok.token_to_id(IM_END)) == 2  # the user's text cannot close its turn
    assert "# Tools" not in tok.decode(render_ids(tok, "S", []))


def test_stop_on_endoftext_is_normalized(tok, task):
    engine = ScriptedEngine(tok, [reply(["echo hi\n"]), reply([], done=True),
                                  reply([], done=True)], stop=EOT)
    box = FakeSandbox()
    traj = run_terminus_episode(task, engine, tok, box, EPISODE.replace(max_tokens=8192))
    assert traj.finish == "done" and traj.turns == 3 and box.ran == ["echo hi"]
    assert traj.repairs["normalized"] == 2 and traj.chunk_starts == [0]
    # The re-rendered <|im_end|> replaced each sampled <|endoftext|>; only that id is untrained.
    assert [r.trained for r in traj.records] == [r.sampled - 1 for r in traj.records[:2]] \
        + [traj.records[2].sampled]
    check_sampled(traj, engine)


def test_undecodable_bytes_split_into_chunks(tok, task):
    half = tok.token_to_id("Ã")  # the byte 0xC3 alone: decodes to U+FFFD, re-encodes otherwise
    tail = [half] + tok.encode("\nThat is all.").ids  # too far from the end to normalize
    engine = ScriptedEngine(tok, [reply(["echo a\n"])], tail=tail, repeat_last=True)
    traj = run_terminus_episode(task, engine, tok, FakeSandbox(),
                                EPISODE.replace(max_turns=3, max_tokens=8192))
    assert traj.finish == "turns" and traj.repairs["split"] == 2
    assert len(traj.chunk_starts) == 3
    for (start, end), prompt in zip(traj.chunks(), engine.prompts):
        assert traj.tokens[start:start + len(prompt)] == prompt  # each chunk starts anew
        assert (traj.routes[end - 1] == -1).all() and (traj.routes[start:end - 1] >= 0).all()
    check_sampled(traj, engine)


def test_parse_errors_continue_until_turn_budget(tok, task):
    engine = ScriptedEngine(tok, ["not json at all"], repeat_last=True)
    traj = run_terminus_episode(task, engine, tok, FakeSandbox(),
                                EPISODE.replace(max_turns=3, max_tokens=8192))
    assert traj.finish == "turns" and traj.turns == 3 and traj.parse_errors == 3
    assert "no JSON object found" in tok.decode(engine.prompts[-1])
    check_sampled(traj, engine)


def test_token_and_time_budgets(tok, task):
    engine = ScriptedEngine(tok, [reply(["echo again\n"])], repeat_last=True)
    traj = run_terminus_episode(task, engine, tok, FakeSandbox(), EPISODE.replace(max_tokens=1500))
    assert traj.finish == "tokens" and 1 <= traj.turns < 20
    assert all(len(p) < 1500 for p in engine.prompts)
    check_sampled(traj, engine)
    traj = run_terminus_episode(task, ScriptedEngine(tok, [reply(["true\n"])], repeat_last=True),
                                tok, FakeSandbox(),
                                EPISODE.replace(timeout_s=0.0))
    assert traj.finish == "timeout" and traj.turns == 1


# -- context compaction in the text harness ------------------------------------------------------


def _chunk_prompts_are_exact(traj, engine, budget):
    """Every chunk fits the budget, and every engine prompt is the start of its chunk, in
    order, each chunk started by one (a compaction's rewrite is what the engine got)."""
    spans = traj.chunks()
    assert all(0 < b - a <= budget for a, b in spans), spans
    at = -1
    for i, prompt in enumerate(engine.prompts):
        if i == 0 or prompt[:len(engine.prompts[i - 1])] != engine.prompts[i - 1]:
            at += 1
        a, _ = spans[at]
        assert traj.tokens[a:a + len(prompt)] == prompt, f"chunk {at}"
    assert at == len(spans) - 1


@pytest.mark.parametrize("policy", ["stop", "elide", "summary"])
def test_compaction_keeps_every_chunk_exact(tok, task, policy):
    from t1jax.rollout import context as ctx
    prefix = len(render_ids(tok, "Use the terminal.",
                            [("user", "Task:\n" + task.instruction.strip())]))
    budget = prefix + 2000  # a turn here: a ~190-token reply and its output
    engine = ScriptedEngine(tok, [reply(["printf 'row %s\\n' 1 2 3 4 5 6\n"])],
                            repeat_last=True)
    traj = run_terminus_episode(task, engine, tok, FakeSandbox(),
                                EPISODE.replace(max_turns=20, max_tokens=1 << 16,
                                                system_prompt="Use the terminal.",
                                                context=ctx.ContextPolicy(budget, policy,
                                                                          summary_tokens=200)))
    check_sampled(traj, engine)
    _chunk_prompts_are_exact(traj, engine, budget)
    if policy == "stop":
        assert traj.finish == "context" and traj.compactions == 0 and traj.turns < 20
        return
    assert traj.finish == "turns" and traj.turns == 20 and traj.compactions >= 2
    assert len(traj.chunk_starts) == traj.compactions + 1  # no split joins here
    later = tok.decode(traj.tokens[traj.chunk_starts[1]:], skip_special_tokens=False)
    if policy == "elide":
        assert "[output elided:" in later
    else:
        summaries = [r for r in traj.records if r.summary]
        assert len(summaries) == traj.compactions and summaries[0].commands == []
        first = tok.decode(traj.tokens[:traj.chunk_starts[1]], skip_special_tokens=False)
        assert ctx.SUMMARY_REQUEST in first
        assert ctx.SUMMARY_HEADER in later
        state = later.split(ctx.SUMMARY_HEADER)[1].split("Current terminal state:")[1]
        assert "ran printf 'row %s" in state.split("<|im_end|>")[0]  # the last output
        assert traj.turns == sum(not r.summary for r in traj.records)
