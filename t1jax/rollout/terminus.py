"""Terminus-2 style JSON replies mapped onto our persistent-shell sandbox.

Why: the T1 report evaluates with the Terminus-2 harness (JSON replies, tmux keystrokes, double
confirmation of task_complete), so training and evaluating in that format needs the same reply
contract. We have no tmux: keystrokes are mapped onto `sandbox.exec`, one command per completed
line of typing. A harness built on this re-renders turns as text, so it must join its prompts
with `tito.repair_boundary`, not assume append-only ids.
"""

from __future__ import annotations

import dataclasses
import json
import re

SYSTEM_PROMPT = """\
You are an agent solving a task in a Linux terminal (working directory /app). Each turn you see \
the latest terminal output and answer with exactly one JSON object, nothing else:

{
  "analysis": "What the output shows and what is still missing.",
  "plan": "What the next commands will do and why.",
  "commands": [
    {"keystrokes": "ls -la\\n", "duration": 0.5}
  ],
  "task_complete": false
}

- "keystrokes" is typed into the terminal exactly as written: end a command with "\\n" to run \
it. Text without a trailing newline stays on the command line until a later newline.
- "duration" is how many seconds to wait for the output (short for quick commands, longer for \
builds or downloads).
- The shell is not interactive: avoid editors and pagers, and prefer commands that finish.
- "commands" may be empty when you only need to look or think.
- Set "task_complete" to true only when the task is fully done; you will be asked to confirm \
once more before the task is graded."""

# tmux key names a model may send as a whole keystroke string.
SPECIAL_KEY = re.compile(
    r"(?:[CM]-\S|\^[A-Za-z@\[\]\\]|Enter|Escape|Tab|BSpace|Space|Up|Down|Left|Right|Home|End"
    r"|PageUp|PageDown|PPage|NPage|DC|IC|F\d{1,2})")
DEFAULT_DURATION = 1.0


@dataclasses.dataclass
class TerminusCommand:
    keystrokes: str
    duration: float = DEFAULT_DURATION


@dataclasses.dataclass
class TerminusReply:
    analysis: str = ""
    plan: str = ""
    commands: list[TerminusCommand] = dataclasses.field(default_factory=list)
    task_complete: bool = False
    warnings: list[str] = dataclasses.field(default_factory=list)  # tolerated problems


@dataclasses.dataclass
class Action:
    """What the harness does next. Run `commands` first in every kind (even "done")."""
    kind: str  # "execute" | "confirm" | "done"
    commands: list[str] = dataclasses.field(default_factory=list)
    prompt: str = ""  # for "confirm": the confirmation question on the screen known so far
    notes: list[str] = dataclasses.field(default_factory=list)  # keystroke-mapping notes


_KNOWN = frozenset({"analysis", "plan", "commands", "task_complete"})
_THINK = re.compile(r"<think>.*?</think>", re.DOTALL)
_FENCE = re.compile(r"```[A-Za-z0-9_-]*\s*\n?(.*?)```", re.DOTALL)


def _candidates(text: str):
    """Every JSON object in text as (obj, start, end): fenced ones first, then bare ones."""
    for m in _FENCE.finditer(text):
        try:
            obj = json.loads(m.group(1).strip())
        except (ValueError, RecursionError):
            continue
        if isinstance(obj, dict):
            yield obj, m.start(), m.end()
    dec = json.JSONDecoder()
    pos = text.find("{")
    while pos != -1:
        try:
            obj, end = dec.raw_decode(text, pos)
        except (ValueError, RecursionError):
            obj, end = None, pos + 1
        if isinstance(obj, dict):
            yield obj, pos, end
        pos = text.find("{", end if isinstance(obj, dict) else pos + 1)


def _find_object(text: str) -> tuple[dict | None, int, int]:
    """The first object with a reply field, else the first object, else (None, -1, -1)."""
    first = None
    for obj, start, end in _candidates(text):
        if _KNOWN & set(obj):
            return obj, start, end
        first = first or (obj, start, end)
    return first or (None, -1, -1)


def _json_error(text: str) -> str:
    """Why the most plausible JSON candidate in text does not parse."""
    start, end = text.find("{"), text.rfind("}")
    if start == -1:
        return "no JSON object found in the reply; answer with one JSON object"
    try:
        json.loads(text[start:end + 1] if end > start else text[start:])
    except (ValueError, RecursionError) as err:
        return f"the reply's JSON is invalid ({err}); answer with one valid JSON object"
    return "no JSON object found in the reply; answer with one JSON object"


def _parse_commands(raw) -> tuple[list[TerminusCommand] | None, str | None]:
    if raw is None:
        return [], None
    if not isinstance(raw, list):
        return None, f'"commands" must be a list of objects, got {type(raw).__name__}'
    out = []
    for i, item in enumerate(raw):
        if not isinstance(item, dict):
            return None, f'"commands"[{i}] must be an object, got {type(item).__name__}'
        keys = item.get("keystrokes")
        if not isinstance(keys, str):
            return None, (f'"commands"[{i}]["keystrokes"] must be a string, got '
                          f"{type(keys).__name__}")
        dur = item.get("duration", DEFAULT_DURATION)
        if dur is None:
            dur = DEFAULT_DURATION
        if isinstance(dur, bool) or not isinstance(dur, (int, float)) or dur != dur or dur < 0:
            return None, (f'"commands"[{i}]["duration"] must be a non-negative number of '
                          f"seconds, got {dur!r}")
        out.append(TerminusCommand(keys, float(dur)))
    return out, None


def parse_terminus_reply(text) -> tuple[TerminusReply | None, str | None]:
    """(reply, None) or (None, an error the model can read); never raises.

    Tolerates code fences, prose around the object, <think> blocks and missing optional fields;
    wrong types are errors, not guesses.
    """
    if not isinstance(text, str):
        return None, f"expected text, got {type(text).__name__}"
    text = _THINK.sub("", text).replace("<|im_end|>", "").strip()
    obj, start, end = _find_object(text)
    if obj is None:
        return None, _json_error(text)
    warnings = []
    if text[:start].strip():
        warnings.append("extra text before the JSON object was ignored")
    if text[end:].strip():
        warnings.append("extra text after the JSON object was ignored")
    if not _KNOWN & set(obj):
        return None, ('the JSON object has none of the fields "analysis", "plan", "commands", '
                      '"task_complete"')
    extra = sorted(set(obj) - _KNOWN)
    if extra:
        warnings.append(f"unknown fields ignored: {', '.join(extra)}")
    fields = {}
    for name in ("analysis", "plan"):
        value = obj.get(name)
        if value is not None and not isinstance(value, str):
            return None, f'"{name}" must be a string, got {type(value).__name__}'
        fields[name] = value or ""
    done = obj.get("task_complete", False)
    if done is None:
        done = False
    if not isinstance(done, bool):
        return None, f'"task_complete" must be true or false, got {json.dumps(done)}'
    commands, err = _parse_commands(obj.get("commands"))
    if err:
        return None, err
    return TerminusReply(fields["analysis"], fields["plan"], commands, done, warnings), None


def _special(name: str, pending: str) -> tuple[list[str], str, str | None]:
    """A tmux key name against our line buffer: (commands, new pending, note or None)."""
    if name in ("Enter", "C-m", "C-j"):
        return ([pending] if pending.strip() else []), "", None
    if name in ("C-c", "^C", "C-u"):
        note = (f"{name}: the shell is not interactive (each command runs to completion or its "
                "timeout); nothing to interrupt")
        if pending:
            note += "; the unfinished line was discarded"
        return [], "", note
    if name == "Space":
        return [], pending + " ", None
    if name == "Tab":
        return [], pending + "\t", None
    if name == "BSpace":
        return [], pending[:-1], None
    return [], pending, f"{name}: key ignored, the shell is not interactive"


def keystrokes_to_commands(commands, pending: str = "") -> tuple[list[str], str, list[str]]:
    """Shell commands typed by `commands` (TerminusCommand or dicts), the still-unfinished line,
    and notes for the model.

    All text up to the last newline runs as one command (heredocs and multi-line scripts stay
    whole); text after it waits in `pending` and prefixes the next command, as typing would.
    A whole keystroke string naming a tmux key (C-c, Enter, ...) acts on the line buffer.
    Durations are not used: `exec` waits for each command itself.
    """
    out: list[str] = []
    notes: list[str] = []
    for cmd in commands:
        keys = cmd["keystrokes"] if isinstance(cmd, dict) else cmd.keystrokes
        if SPECIAL_KEY.fullmatch(keys.strip()) and "\n" not in keys:
            ran, pending, note = _special(keys.strip(), pending)
            out += ran
            if note:
                notes.append(note)
            continue
        typed = (pending + keys).replace("\r\n", "\n").replace("\r", "\n")
        cut = typed.rfind("\n")
        if cut == -1:
            pending = typed
            continue
        line, pending = typed[:cut], typed[cut + 1:]
        if line.strip():
            out.append(line)
    return out, pending, notes


def render_observation(outputs: list[str], warnings: list[str] = ()) -> str:
    """The next user message after executing commands, in Terminus-2's shape."""
    screen = "\n".join(o.rstrip("\n") for o in outputs if o) or "(no output)"
    body = f"New Terminal Output:\n\n{screen}"
    if warnings:
        listed = "\n".join(f"- {w}" for w in warnings)
        body = f"Previous response had warnings:\nWARNINGS:\n{listed}\n\n{body}"
    return body


def render_parse_error(error: str) -> str:
    """The next user message when a reply could not be parsed (nothing was executed)."""
    return (f"Previous response had parsing errors:\nERROR: {error}\n\n"
            "Please fix this and answer with one JSON object in the required format.")


def render_confirmation(screen: str) -> str:
    """The double-confirmation question, showing the terminal as it is now."""
    return (f"Current terminal state:\n{screen.rstrip(chr(10)) or '(no output)'}\n\n"
            "You set task_complete to true. Once you confirm, your work is graded and you "
            "cannot change anything afterwards. If the task is truly finished, reply again "
            'with "task_complete": true. Otherwise reply with "task_complete": false and the '
            "commands that finish the job.")


def first_user_message(instruction: str, screen: str = "") -> str:
    """The opening user turn: the task and the terminal as it starts."""
    return (f"Task:\n{instruction.strip()}\n\nCurrent terminal state:\n"
            f"{screen.rstrip(chr(10)) or '(empty prompt)'}")


class TerminusSession:
    """Double confirmation and the typed-line buffer across one episode's replies.

    Per reply: act = step(reply); run act.commands; stop if act.kind == "done"; else send
    observe(outputs, reply.warnings + act.notes), the confirmation question while one pends.
    Parse errors go through parse_error() and leave the state unchanged (as in Terminus-2).
    """

    def __init__(self):
        self.pending = ""  # typed text not yet ended by a newline
        self.awaiting_confirmation = False
        self.screen = ""  # the latest terminal output shown to the model

    def step(self, reply: TerminusReply) -> Action:
        commands, self.pending, notes = keystrokes_to_commands(reply.commands, self.pending)
        if reply.task_complete and self.awaiting_confirmation:
            return Action("done", commands, notes=notes)
        if reply.task_complete:
            self.awaiting_confirmation = True
            return Action("confirm", commands, render_confirmation(self.screen), notes)
        self.awaiting_confirmation = False
        return Action("execute", commands, notes=notes)

    def observe(self, outputs: list[str], warnings: list[str] = ()) -> str:
        """The next user message once the step's commands ran; remembers the screen."""
        if outputs:
            self.screen = "\n".join(o.rstrip("\n") for o in outputs if o)
        if self.awaiting_confirmation:
            return render_confirmation(self.screen)
        return render_observation(outputs, warnings)

    def parse_error(self, error: str) -> str:
        return render_parse_error(error)
