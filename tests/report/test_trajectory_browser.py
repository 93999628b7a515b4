"""t1jax.report.browser on hand-built data (no runs/ directory): a sample made by the real TITO
builder passes the loss-mask check and each way of moving the mask fails it; the renderings mark
exactly the sampled replies and escape model text; tables sort and aggregate; training samples
read back as trials."""

from __future__ import annotations

import numpy as np
import pytest

from t1jax.report import browser as tb
from t1jax.rollout.chat import IM_END, render_prefix
from t1jax.rollout.sample import Sample
from t1jax.rollout.tito import TrajectoryBuilder, encode_plain
from t1jax.rollout.tokenizer import train_tokenizer

REPLY = '<tool_call>\n{"name": "bash", "arguments": {"command": "ls"}}\n</tool_call>'
EVIL = "<script>alert(1)</script>"


@pytest.fixture(scope="module")
def tokenizer():
    return train_tokenizer(512)


def build_sample(tok, second_reply: str = "Done.") -> Sample:
    """Two model turns the way the agent loop records them: a tool call closed by <|im_end|>,
    an observation, then a reply cut at max tokens (the template's <|im_end|> closes it)."""
    builder = TrajectoryBuilder(tok)
    prompt = tok.encode(render_prefix("Run one command.", "List /app."),
                        add_special_tokens=False).ids
    builder.start(prompt)
    first = encode_plain(tok, REPLY) + [tok.token_to_id(IM_END)]
    builder.add_completion(first, [-0.5] * len(first))
    builder.add_observation(["[exit code: 0]\nfile.txt"])
    second = encode_plain(tok, second_reply)
    builder.add_completion(second, [-0.25] * len(second), finish_reason="length")
    n = len(builder.tokens)
    return Sample(tokens=builder.tokens, loss_mask=builder.loss_mask,
                  rollout_logprobs=builder.logprobs, routes=np.full((n, 1, 1), -1), reward=0.5,
                  metadata={"task_id": "t", "attempt": 0, "turns": 2, "prompt_len": len(prompt)})


def test_builder_sample_passes_the_check(tokenizer):
    sample = build_sample(tokenizer)
    assert tb.check_loss_mask(sample, tokenizer, int(sample.loss_mask.sum())) == []
    counts = tb.mask_counts(sample)
    assert counts["tokens"] == len(sample.tokens)
    assert [t["trained"] for t in counts["turns"]] == [len(encode_plain(tokenizer, REPLY)) + 1,
                                                        len(encode_plain(tokenizer, "Done."))]
    assert counts["turns"][0]["context_before"] == sample.metadata["prompt_len"]
    assert counts["trained"] == sum(t["trained"] for t in counts["turns"])


def _problems(tok, change) -> list[str]:
    sample = build_sample(tok)
    sampled = int(sample.loss_mask.sum())
    change(sample)
    return tb.check_loss_mask(sample, tok, sampled)


def test_each_misplaced_mask_is_caught(tokenizer):
    def prompt_token_trained(s):
        s.loss_mask[s.metadata["prompt_len"] - 1] = 1

    def observation_token_trained(s):
        runs = tb.mask_runs(s.loss_mask)
        s.loss_mask[runs[2][0] + 3] = 1  # inside the observation after the first reply

    def reply_untrained(s):
        start, end, _ = tb.mask_runs(s.loss_mask)[3]
        s.loss_mask[start:end] = 0

    def glue_trained(s):
        s.loss_mask[-1] = 1  # the <|im_end|> the template adds after a cut reply

    def logprob_on_context(s):
        s.rollout_logprobs[2] = -1.0

    found = {name: _problems(tokenizer, change) for name, change in [
        ("prompt", prompt_token_trained), ("observation", observation_token_trained),
        ("untrained reply", reply_untrained), ("glue", glue_trained),
        ("logprob", logprob_on_context)]}
    assert any("prompt tokens are trained" in p for p in found["prompt"])
    assert any("do not follow an assistant header" in p for p in found["observation"])
    assert any("is not trained" in p for p in found["untrained reply"])
    assert any("the agent sampled" in p for p in found["glue"])
    assert any("carry a sampling log-prob" in p for p in found["logprob"])


def test_a_later_chunk_may_replay_earlier_replies_as_context(tokenizer):
    """A compacted trial (t1jax.rollout.context): the second chunk's prompt replays the first
    chunk's replies untrained; its own reply is trained. Without the chunk boundary the same
    tokens hold an untrained model reply."""
    first = build_sample(tokenizer)
    replay = TrajectoryBuilder(tokenizer)
    replay.start(list(first.tokens))  # the whole first chunk again, as context
    replay.add_observation(["[exit code: 0]"])  # ends with the assistant header
    reply = encode_plain(tokenizer, "Done.") + [tokenizer.token_to_id(IM_END)]
    replay.add_completion(reply, [-0.1] * len(reply))
    n = len(first.tokens)
    tokens = np.concatenate([first.tokens, replay.tokens])
    mask = np.concatenate([first.loss_mask, replay.loss_mask])
    logprobs = np.concatenate([first.rollout_logprobs, replay.logprobs])

    def sample(chunk_starts):
        return Sample(tokens=tokens, loss_mask=mask, rollout_logprobs=logprobs,
                      routes=np.full((len(tokens), 1, 1), -1), reward=0.5,
                      metadata=dict(first.metadata), chunk_starts=chunk_starts)

    assert tb.check_loss_mask(sample([0, n]), tokenizer, int(mask.sum())) == []
    assert any("is not trained" in p for p in tb.check_loss_mask(sample([0]), tokenizer))


def test_mask_text_and_html_mark_exactly_the_replies(tokenizer):
    sample = build_sample(tokenizer, second_reply=EVIL)
    text = tb.mask_text(sample, tokenizer)
    assert text.count("[[") == 2
    assert f"[[{REPLY}{IM_END}]]" in text and f"[[{EVIL}]]" in text
    html_out = tb.mask_html(sample, tokenizer)
    assert EVIL not in html_out and "&lt;script&gt;alert(1)&lt;/script&gt;" in html_out
    assert html_out.count("background:#c8ecd2") == 2
    cut = tb.mask_text(sample, tokenizer, max_tokens=10)
    assert cut.endswith(f"[{len(sample.tokens) - 10} more tokens]") and "[[" not in cut


def _trial(task_id, attempt, *, turns, reward, resolved, category="write"):
    return {"label": "ppo", "task_id": task_id, "attempt": attempt, "category": category,
            "turns": turns, "reward": reward, "resolved": resolved, "status": "done",
            "failure_mode": "resolved" if resolved else "unresolved", "finish": "done",
            "tokens": 300, "sampled_tokens": 30}


def test_tables_sort_aggregate_and_cut():
    trials = [_trial("b-task", 1, turns=2, reward=1.0, resolved=True),
              _trial("b-task", 0, turns=1, reward=0.25, resolved=False),
              _trial("a-task", 0, turns=3, reward=0.5, resolved=False, category="copy")]
    rows = tb.trial_table(trials)
    assert [(r["task_id"], r["attempt"]) for r in rows] == [("a-task", 0), ("b-task", 0),
                                                            ("b-task", 1)]
    assert list(rows[0]) == list(tb.TRIAL_COLUMNS)
    per_task = tb.task_table(trials)
    assert per_task[0] == {"task_id": "b-task", "category": "write", "attempts": 2,
                           "turns_mean": 1.5, "reward_mean": 0.625, "resolved_rate": 0.5}
    assert per_task[1]["task_id"] == "a-task"
    text = tb.format_table(rows, max_rows=2)
    lines = text.splitlines()
    assert lines[0].split() == list(tb.TRIAL_COLUMNS)
    assert len(lines) == 2 + 2 + 1 and lines[-1] == "... 1 more rows"
    assert lines[2].split()[:5] == ["a-task", "0", "copy", "3", "0.5"]


def test_conversation_text_places_commands_and_observations():
    trial = _trial("t", 0, turns=2, reward=0.25, resolved=False)
    trial.update(instruction="List /app.", passed=1, total=4, segments=[
        {"text": "<|im_start|>system ...<|im_start|>assistant\n", "trained": False},
        {"text": "CALL-LS<|im_end|>", "trained": True},
        {"text": "\n<|im_start|>user\nOBSERVATION-ONE<|im_end|>\n<|im_start|>assistant\n",
         "trained": False},
        {"text": "BAD-CALL<|im_end|>", "trained": True},
        {"text": "\n<|im_start|>user\nError: not JSON<|im_end|>", "trained": False}],
        commands=[{"turn": 0, "command": "ls /app", "exit_code": 0, "timed_out": False,
                   "output": "file.txt"}],
        assertions=[{"name": "test_goal", "status": "failed"}])
    text = tb.conversation_text(trial)
    turn0, turn1 = text.split("TURN 0")[1].split("TURN 1")
    assert "CALL-LS" in turn0 and "$ ls /app   [exit 0]" in turn0 and "file.txt" in turn0
    assert "OBSERVATION-ONE" not in turn0  # the command's own output stands for it
    assert "BAD-CALL" in turn1 and "Error: not JSON" in turn1  # no command: the observation
    assert "VERIFIER: 1/4 assertions passed, reward 0.25, not resolved" in text
    assert "failed  test_goal" in text


def test_training_samples_read_back_as_trials(tokenizer, tmp_path):
    sample = build_sample(tokenizer)
    sample.metadata.update(task_id="write-x", attempt=7, finish="done", tool_calls=1,
                           verifier={"solved": False, "tampered": [], "error": None,
                                     "passed": 2, "total": 4,
                                     "assertions": [{"name": "a", "status": "passed"}]})
    step = tmp_path / "ppo" / "rollouts" / "step_00003"
    step.mkdir(parents=True)
    sample.to_npz(step / "write-x--attempt0007.npz")
    run = {"evals": {"ppo": {"summary": {"tasks": 1, "trials": 1, "resolved_rate": 0.0,
                                         "avg_reward": 0.5, "turns_mean": 2.0,
                                         "tokens_mean": 300.0},
                             "trials": [_trial("t", 2, turns=2, reward=0.5, resolved=False)]}}}
    (trial,) = tb.trials_of(tmp_path, "ppo/rollouts", run, tokenizer)
    assert (trial["step"], trial["task_id"], trial["attempt"]) == (3, "write-x", 7)
    assert trial["reward"] == 0.5 and trial["resolved"] is False
    assert trial["failure_mode"] == "unresolved" and trial["sampled_tokens"] is None
    assert [s["trained"] for s in trial["segments"]] == [False, True, False, True, False]
    assert tb.trial_table([trial])[0]["step"] == 3
    (evaluated,) = tb.trials_of(tmp_path, "ppo", run, tokenizer)
    assert evaluated["sample_path"].endswith("eval/ppo/samples/t--attempt2.npz")
    assert tb.eval_overview(run) == [{"label": "ppo", "tasks": 1, "trials": 1, "records": 1,
                                      "resolved_rate": 0.0, "avg_reward": 0.5, "turns_mean": 2.0,
                                      "tokens_mean": 300.0}]
    with pytest.raises(KeyError, match="labels here"):
        tb.trials_of(tmp_path, "sft", run, tokenizer)
