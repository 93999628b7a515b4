"""Terminus-2 reply parsing, keystroke mapping and double confirmation."""

import json

import pytest

from t1jax.rollout.terminus import (
    SYSTEM_PROMPT, TerminusCommand, TerminusReply, TerminusSession, keystrokes_to_commands,
    parse_terminus_reply, render_observation)

VALID = {"analysis": "empty dir", "plan": "list it",
         "commands": [{"keystrokes": "ls -la\n", "duration": 0.5}], "task_complete": False}


def reply(*keys, done=False):
    return TerminusReply(commands=[TerminusCommand(k) for k in keys], task_complete=done)


def test_parse_valid():
    r, err = parse_terminus_reply(json.dumps(VALID))
    assert err is None and r.warnings == []
    assert (r.analysis, r.plan, r.task_complete) == ("empty dir", "list it", False)
    assert r.commands == [TerminusCommand("ls -la\n", 0.5)]


def test_parse_fenced_and_prose():
    fenced = "```json\n" + json.dumps(VALID, indent=2) + "\n```"
    r, err = parse_terminus_reply(fenced)
    assert err is None and r.commands[0].keystrokes == "ls -la\n" and r.warnings == []
    r, err = parse_terminus_reply("Sure! Here it is:\n" + fenced + "\nHope that helps.")
    assert err is None and len(r.warnings) == 2
    r, err = parse_terminus_reply('I think {braces} here. ' + json.dumps(VALID) + " done<|im_end|>")
    assert err is None and r.plan == "list it"
    r, err = parse_terminus_reply("<think>hmm {</think>" + json.dumps(VALID))
    assert err is None and r.warnings == []


def test_parse_defaults_and_unknown_fields():
    r, err = parse_terminus_reply('{"task_complete": true, "extra": 1}')
    assert err is None
    assert (r.analysis, r.plan, r.commands, r.task_complete) == ("", "", [], True)
    assert any("extra" in w for w in r.warnings)
    r, err = parse_terminus_reply('{"analysis": null, "commands": [{"keystrokes": "pwd\\n"}]}')
    assert err is None and r.analysis == "" and r.commands[0].duration == 1.0


@pytest.mark.parametrize("text,needle", [
    ("", "no JSON object"),
    ("just prose", "no JSON object"),
    ('{"analysis": "x", "commands": [', "invalid"),
    ("[1, 2]", "no JSON object"),
    ('{"foo": 1}', "none of the fields"),
    ('{"commands": "ls\\n"}', '"commands" must be a list'),
    ('{"commands": ["ls\\n"]}', '"commands"[0] must be an object'),
    ('{"commands": [{"keystrokes": 3}]}', '"keystrokes"] must be a string'),
    ('{"commands": [{"keystrokes": "ls", "duration": "1"}]}', '"duration"] must be'),
    ('{"commands": [{"keystrokes": "ls", "duration": -1}]}', '"duration"] must be'),
    ('{"task_complete": "yes"}', '"task_complete" must be true or false'),
    ('{"analysis": 5}', '"analysis" must be a string'),
])
def test_parse_errors(text, needle):
    r, err = parse_terminus_reply(text)
    assert r is None and needle in err


def test_parse_non_text():
    assert parse_terminus_reply(None)[0] is None


def test_keystrokes_commands_and_buffer():
    cmds, pending, notes = keystrokes_to_commands(
        [TerminusCommand("cd /tmp\n"), {"keystrokes": "echo hi\n", "duration": 0.1}])
    assert (cmds, pending, notes) == (["cd /tmp", "echo hi"], "", [])
    cmds, pending, _ = keystrokes_to_commands([TerminusCommand("echo a"), TerminusCommand("b")])
    assert (cmds, pending) == ([], "echo ab")
    cmds, pending, _ = keystrokes_to_commands([TerminusCommand("c\nls")], pending)
    assert (cmds, pending) == (["echo abc"], "ls")
    heredoc = "cat > f <<'EOF'\nx\nEOF\n"
    assert keystrokes_to_commands([TerminusCommand(heredoc)])[0] == [heredoc[:-1]]
    assert keystrokes_to_commands([TerminusCommand("\n")])[0] == []


def test_keystrokes_special_keys():
    cmds, pending, notes = keystrokes_to_commands([TerminusCommand("C-c")], "half typed")
    assert (cmds, pending) == ([], "")
    assert len(notes) == 1 and "not interactive" in notes[0] and "discarded" in notes[0]
    cmds, pending, notes = keystrokes_to_commands(
        [TerminusCommand("ls"), TerminusCommand("Space"), TerminusCommand("-l"),
         TerminusCommand("Enter")])
    assert (cmds, pending, notes) == (["ls -l"], "", [])
    _, pending, notes = keystrokes_to_commands([TerminusCommand("Escape")], "x")
    assert pending == "x" and "Escape" in notes[0]


def test_double_confirmation_done():
    s = TerminusSession()
    act = s.step(reply("echo ok\n"))
    assert (act.kind, act.commands) == ("execute", ["echo ok"])
    assert s.observe(["ok\n"]) == "New Terminal Output:\n\nok"
    act = s.step(reply(done=True))
    assert act.kind == "confirm" and "ok" in act.prompt and "task_complete" in act.prompt
    assert s.observe([]) == act.prompt
    act = s.step(reply(done=True))
    assert act.kind == "done" and act.commands == []


def test_double_confirmation_declined():
    s = TerminusSession()
    assert s.step(reply("make\n", done=True)).commands == ["make"]
    assert "built" in s.observe(["built"])  # the confirm question shows fresh output
    act = s.step(reply("make test\n"))
    assert (act.kind, act.commands) == ("execute", ["make test"])
    assert s.observe(["pass"]).startswith("New Terminal Output:")
    assert s.step(reply(done=True)).kind == "confirm"  # asks again after declining


def test_render_observation_warnings_and_prompt():
    text = render_observation(["a", "b\n"], ["extra text before the JSON object was ignored"])
    assert text.startswith("Previous response had warnings:")
    assert text.endswith("New Terminal Output:\n\na\nb")
    assert render_observation([]).endswith("(no output)")
    assert '"task_complete"' in SYSTEM_PROMPT and '"keystrokes"' in SYSTEM_PROMPT


def test_parse_prefers_reply_object():
    text = 'Config is {"a": 1}. ' + json.dumps(VALID)
    r, err = parse_terminus_reply(text)
    assert err is None and r.plan == "list it"


@pytest.mark.slow
def test_episode_on_real_sandbox(docker_backend):
    """Scripted JSON replies drive a real shell: typed text is buffered, state persists."""
    from pathlib import Path

    from t1jax.sandbox.backend import SandboxSpec
    from t1jax.tasks.task import load_task

    task = load_task(Path(__file__).resolve().parents[2] / "t1jax" / "tasks" / "seed_tasks"
                     / "count-log-errors")
    replies = [
        {"commands": [{"keystrokes": "cd /tmp\n"}, {"keystrokes": "echo part"},
                      {"keystrokes": "1 > t.txt\n"}, {"keystrokes": "C-c"}]},
        {"commands": [{"keystrokes": "cat t.txt; pwd\n", "duration": 0.1}],
         "task_complete": True},
        {"analysis": "looks right", "task_complete": True},
    ]
    session, shown = TerminusSession(), []
    with docker_backend.create(SandboxSpec(image=docker_backend.build(task))) as box:
        for raw in replies:
            r, err = parse_terminus_reply("```json\n" + json.dumps(raw) + "\n```")
            assert err is None, err
            act = session.step(r)
            outputs = [box.exec(c, timeout=30).output for c in act.commands]
            if act.kind == "done":
                break
            shown.append(session.observe(outputs, act.notes))
    assert act.kind == "done"
    assert "not interactive" in shown[0]
    assert shown[1].startswith("Current terminal state:\npart1\n/tmp")
