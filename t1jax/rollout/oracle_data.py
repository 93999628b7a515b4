"""Oracle episodes as SFT data: each task's reference solution replayed as an agent conversation.

Why: the warm start (RST in the T1 report) teaches the policy the tool-call format and the shape
of a solving episode before RL. The cheapest faithful source is each task's own oracle: its
solve.sh, split into the shell commands an agent would issue one tool call at a time, played by
an `OracleEngine` through the real agent loop in a real sandbox and kept only when the real
verifier says the task is solved. The result is a `Sample` like any rollout's (token ids exactly
as the loop records them, loss mask 1 on the assistant tokens), so SFT and RL share one format.
It lives on the rollout side because it drives sandboxes; t1jax.rollout.sample stores them.
"""

from __future__ import annotations

import dataclasses
import re
import subprocess
from pathlib import Path
from typing import Callable

import numpy as np

from t1jax.rollout.agent import run_agent_episode
from t1jax.rollout.chat import IM_END, parse_tool_calls, render_tool_call
from t1jax.rollout.engine import FINISH_STOP, GenerateResult
from t1jax.rollout.fan_out import ImageBuildError, fan_out
from t1jax.rollout.harness import RolloutError
from t1jax.rollout.sample import Sample, make_sample
from t1jax.rollout.settings import EpisodeSettings
from t1jax.rollout.trial import TrialSite, run_trial

FINAL_ANSWER = "The task is complete."
WHOLE_SCRIPT_PATH = "/tmp/solve.sh"

# `set` prologue options that are dropped: errexit/nounset/pipefail only matter to a script run
# in one go (each tool call reports its own exit code) and xtrace would pollute observations.
_SET_FLAGS = set("euxE")
_SET_NAMES = {"errexit", "nounset", "pipefail", "xtrace", "errtrace"}
# Constructs that behave differently in a persistent interactive-style shell than in a script:
# `exit` ends the agent's shell, `exec` replaces it (or redirects it for good), traps outlive
# the command, and $0 / BASH_SOURCE name the shell instead of the script.
_UNFAITHFUL = [
    ("exit", re.compile(r"(?:^|[\s;&|({])exit(?=$|[\s;&|)}])")),
    ("exec", re.compile(r"(?:^|[\s;&|({])exec(?=$|[\s;&|)}<>])")),
    ("trap", re.compile(r"(?:^|[\s;&|({])trap(?=$|\s)")),
    ("$0", re.compile(r"\$(?:0|\{0\})")),
    ("BASH_SOURCE", re.compile(r"BASH_SOURCE")),
]
_HEREDOC = re.compile(r"(?<![<\w$])<<(?!<)(-?)[ \t]*"
                      r"(?:'([^'\n]*)'|\"([^\"\n]*)\"|\\?([A-Za-z_][\w.-]*))")


# -- splitting a solve.sh --------------------------------------------------------------------------
def _bash_parses(chunk: str) -> bool:
    """True when `chunk` is a complete bash program (bash -n only parses; nothing runs)."""
    if re.search(r"(?<!\\)(?:\\\\)*\\$", chunk.rstrip("\n")):
        return False  # a trailing line continuation: the command goes on
    proc = subprocess.run(["bash", "-n"], input=chunk, capture_output=True, text=True,
                          timeout=30)
    return proc.returncode == 0 and "here-document" not in proc.stderr


def _is_set_prologue(line: str) -> bool:
    words = line.split()
    if not words or words[0] != "set" or len(words) == 1:
        return False
    i = 1
    while i < len(words):
        w = words[i]
        if not (len(w) > 1 and w[0] in "-+"):
            return False
        flags = w[1:]
        if flags.endswith("o"):  # -o NAME, or -euo NAME
            if i + 1 >= len(words) or words[i + 1] not in _SET_NAMES:
                return False
            flags, i = flags[:-1], i + 1
        if not set(flags) <= _SET_FLAGS:
            return False
        i += 1
    return True


def _outside_heredocs(text: str) -> tuple[list[str], bool]:
    """The script's lines minus here-document bodies and comment lines; False when a
    here-document never ends (then the scan cannot be trusted)."""
    out: list[str] = []
    pending: list[tuple[str, bool]] = []  # (delimiter, strip leading tabs) still to close
    for line in text.splitlines():
        if pending:
            delim, tabs = pending[0]
            if (line.lstrip("\t") if tabs else line) == delim:
                pending.pop(0)
            continue
        if line.lstrip().startswith("#"):
            continue
        out.append(line)
        for m in _HEREDOC.finditer(line):
            delim = next(g for g in m.groups()[1:] if g is not None)
            pending.append((delim, m.group(1) == "-"))
    return out, not pending


def _blank_single_quoted(text: str) -> str:
    """`text` with the bodies of single-quoted strings blanked (awk's $0, `bash -c 'exit 1'`
    are literal to this shell) and comments dropped; double quotes and backslash escapes are
    honoured."""
    out, i, dq = [], 0, False
    while i < len(text):
        c = text[i]
        if c == "\\" and i + 1 < len(text):
            out.append(text[i:i + 2])
            i += 2
            continue
        if c == "#" and not dq and (i == 0 or text[i - 1] in " \t\n;"):
            end = text.find("\n", i)  # a comment: drop it (its apostrophes quote nothing)
            i = len(text) if end == -1 else end
            continue
        if c == '"':
            dq = not dq
        elif c == "'" and not dq:
            end = text.find("'", i + 1)
            if end == -1:
                end = len(text) - 1
            out.append("'" + re.sub(r"[^\n]", " ", text[i + 1:end]) + "'")
            i = end + 1
            continue
        out.append(c)
        i += 1
    return "".join(out)


def unfaithful_constructs(script_text: str) -> list[str]:
    """Why splitting this script into separate tool calls would change what it does (empty:
    splitting is faithful, since the agent's shell keeps cwd, variables and functions)."""
    lines, closed = _outside_heredocs(script_text)
    lines = _blank_single_quoted("\n".join(lines)).splitlines()
    found = [] if closed else ["an unterminated here-document"]
    for name, pattern in _UNFAITHFUL:
        if any(pattern.search(line) for line in lines):
            found.append(name)
    return found


def whole_script_command(script_text: str, path: str = WHOLE_SCRIPT_PATH) -> str:
    """One tool call that writes the script to a file and runs it with bash (what an agent
    does with a script whose exit/trap/$0 must keep their script semantics)."""
    body = script_text if script_text.endswith("\n") else script_text + "\n"
    lines = set(body.splitlines())
    delim = "T1JAX_SOLVE_EOF"
    while delim in lines:
        delim += "_"
    return f"cat > {path} <<'{delim}'\n{body}{delim}\nbash {path}"


def split_solution(script_text: str, source: str = "solve.sh") -> tuple[list[str], list[str]]:
    """(commands, reasons): the script as tool-call commands, or as one whole-script command
    when `reasons` (unfaithful constructs) is non-empty. Raises ValueError naming `source`
    when the script does not parse."""
    reasons = unfaithful_constructs(script_text)
    if reasons:
        if not _bash_parses(script_text):
            raise ValueError(f"{source}: bash -n rejects the script")
        return [whole_script_command(script_text)], reasons
    commands: list[str] = []
    chunk: list[str] = []
    for line in script_text.splitlines():
        if not chunk:  # between commands: drop the shebang, comments, blanks, `set -e...`
            stripped = line.strip()
            if not stripped or stripped.startswith("#") or _is_set_prologue(stripped):
                continue
        chunk.append(line)
        text = "\n".join(chunk) + "\n"
        if _bash_parses(text):
            commands.append("\n".join(chunk).rstrip())
            chunk = []
    if chunk:
        raise ValueError(f"{source}: the script ends inside an incomplete command: "
                         f"{chr(10).join(chunk)[:200]!r}")
    return commands, []


def solution_commands(script_text: str) -> list[str]:
    """Split a solve.sh into the shell commands an agent would issue one tool call at a time.

    Drops the shebang, `set -e`-style prologue lines, blank and comment lines between commands;
    each command is syntactically complete (here-documents, if/for/while blocks, functions and
    line continuations stay whole). Scripts using exit/exec/trap/$0/BASH_SOURCE outside
    here-documents come back as one command that writes the script to a file and runs it.
    """
    return split_solution(script_text)[0]


def oracle_commands(task) -> tuple[list[str], list[str]]:
    """(commands, whole-script reasons) for a task's reference solution, its [solution] env
    exported first."""
    if task.solution_script is None:
        raise ValueError(f"task {task.task_id} has no reference solution (solution/solve.sh)")
    path = Path(task.solution_script)
    commands, reasons = split_solution(path.read_text(), f"task {task.task_id}: {path}")
    env = task.solution.env
    if env:
        quoted = " ".join(f"{k}='" + str(v).replace("'", "'\\''") + "'" for k, v in env.items())
        commands = [f"export {quoted}"] + commands
    return commands, reasons


# -- the oracle as an engine ----------------------------------------------------------------------
class OracleEngine:
    """An Engine that plays a fixed list of commands: turn i emits `render_tool_call(commands[i])`
    closed by <|im_end|> (finish "stop", as a real model stopping on it), then one final answer
    without a tool call. Ids are the tokenizer's encoding of that text, log-probs 0.0, routes -1
    rows of shape [prompt + output - 1, num_layers, top_k] (the model never ran).

    One engine per episode: it counts the generate calls to know the turn.
    """

    weight_version = "oracle"

    def __init__(self, tokenizer, commands: list[str], *, num_layers: int, top_k: int,
                 max_len: int = 32768, final_answer: str = FINAL_ANSWER, name: str = "oracle",
                 tool_format: str = "qwen3_json"):
        if num_layers < 1 or top_k < 1:
            raise ValueError(f"{name}: need num_layers >= 1 and top_k >= 1, got "
                             f"{num_layers}, {top_k}")
        self.tok, self.name = tokenizer, name
        self.num_layers, self.top_k, self.max_len = int(num_layers), int(top_k), int(max_len)
        self.im_end = tokenizer.token_to_id(IM_END)
        if self.im_end is None:
            raise ValueError(f"{name}: the tokenizer has no {IM_END} token")
        self.tool_format = tool_format
        self.texts = [render_tool_call(c, tool_format) for c in commands] + [final_answer]
        self.turn_ids = [self._encode(t, commands[i] if i < len(commands) else None, i)
                         for i, t in enumerate(self.texts)]
        self.calls = 0

    def _encode(self, text: str, command: str | None, turn: int) -> list[int]:
        ids = self.tok.encode(text + IM_END, add_special_tokens=False).ids
        back = self.tok.decode(ids, skip_special_tokens=False)
        calls, errors = parse_tool_calls(back, self.tool_format)
        want = [command] if command is not None else []
        if ids[-1:] != [self.im_end] or ids.count(self.im_end) != 1 or calls != want or errors:
            raise ValueError(f"{self.name}: turn {turn} does not round-trip through the "
                             f"tokenizer and parse_tool_calls (a command containing chat "
                             f"markup?): {text[:120]!r}")
        return ids

    def generate(self, prompts, sampling) -> list[GenerateResult]:
        if len(prompts) != 1:
            raise ValueError(f"{self.name}: an OracleEngine plays one episode; got "
                             f"{len(prompts)} prompts")
        if isinstance(sampling, (list, tuple)):
            (sampling,) = sampling
        (prompt,) = prompts
        if self.calls >= len(self.turn_ids):
            raise RolloutError(f"{self.name}: generate called after the final answer "
                               f"(turn {self.calls})")
        ids = self.turn_ids[self.calls]
        if len(ids) > sampling.max_new_tokens or len(prompt) + len(ids) > self.max_len:
            raise RolloutError(
                f"{self.name}: turn {self.calls} needs {len(ids)} tokens but only "
                f"{min(sampling.max_new_tokens, self.max_len - len(prompt))} are left "
                f"(prompt {len(prompt)}, max_len {self.max_len})")
        self.calls += 1
        routes = np.full((len(prompt) + len(ids) - 1, self.num_layers, self.top_k), -1,
                         np.int32)
        return [GenerateResult(list(ids), [0.0] * len(ids), routes, FINISH_STOP,
                               self.weight_version)]

    def load_weights(self, params_state, version: str) -> None:
        raise NotImplementedError(f"{self.name}: the oracle has no weights")


# -- oracle episodes in real sandboxes -----------------------------------------------------------
class _Unfinished(Exception):
    """The oracle's episode stopped before its final answer (nothing to verify)."""


@dataclasses.dataclass(frozen=True)
class Teacher:
    """Who plays the SFT episodes and which are kept: each task's reference solution (the
    default), or another teacher's commands (commands_of(task) -> (commands, whole-script
    reasons)); the closing answer it gives; whether the kept episodes are those the verifier
    solves (want_solved) or, False, a slipping teacher's clean misses (which must really miss
    the goal); and the attempt index and source tag its samples carry."""
    commands_of: Callable = oracle_commands
    final_answer: str = FINAL_ANSWER
    want_solved: bool = True
    source: str = "oracle"
    attempt: int = 0


def oracle_samples(tasks, site: TrialSite, tokenizer, *, num_layers: int, top_k: int,
                   episode: EpisodeSettings = EpisodeSettings(), teacher: Teacher = Teacher(),
                   progress=None) -> tuple[list[Sample], list[tuple[str, str]]]:
    """Play every task's reference solution (or `teacher`'s) through the agent loop in a
    fresh sandbox at `site` (at most site.concurrency at once, graded on site.scale, images
    built once), verify it, and keep the solved episodes as Samples (task order). `skipped`
    lists (task_id, reason) for the rest: no or unsplittable solution, build failure, rollout
    error, verifier failure, or unresolved. num_layers, top_k: the policy's routes' shape.
    episode: the policy's own EpisodeSettings, whose system prompt (default: the agent's),
    tool format, token budget (max_tokens, default 32768), observation cap and verifier the
    teacher's episodes take; the teacher decides its turns (one per command, then the
    answer), greedily, with the task's own timeout. progress(task_id, reason or None)."""
    if site.scale is None:
        raise ValueError("oracle_samples grades every episode: give the site a scale")
    max_len = episode.max_tokens or 32768
    tool_format = episode.tool_format
    commands_of, final_answer = teacher.commands_of, teacher.final_answer
    want_solved, source, attempt = teacher.want_solved, teacher.source, teacher.attempt

    def one(task) -> tuple[Sample | None, str | None]:
        tid = task.task_id
        try:
            commands, reasons = commands_of(task)
        except (ValueError, OSError) as err:
            return None, f"solution: {err}"
        try:
            site.images.get(task)
        except ImageBuildError as err:  # named; one bad task must not sink the dataset
            return None, str(err)
        engine = OracleEngine(tokenizer, commands, num_layers=num_layers, top_k=top_k,
                              max_len=max_len, final_answer=final_answer,
                              name=f"task {tid} oracle", tool_format=tool_format)

        def play(box):
            # the policy's prompt, tool format and observation cap; the teacher's own turns,
            # greedy, one chunk, with the task's timeout per command and for the episode
            teacher = episode.replace(
                temperature=0.0, top_p=1.0, max_new_tokens=max_len, max_turns=len(commands) + 1,
                max_tokens=max_len, command_timeout_s=task.agent.timeout_sec, timeout_s=None,
                tito=True, context=None)
            traj = run_agent_episode(task, engine, tokenizer, box, teacher)
            if traj.finish != "done":
                raise _Unfinished(f"episode ended with {traj.finish!r} before the final answer")
            return traj

        outcome = run_trial(task, site, play, verifier=episode.verifier,
                            grade_failed_play=False)
        if isinstance(outcome.play_error, _Unfinished):
            return None, str(outcome.play_error)
        if outcome.play_error is not None:
            return None, f"episode failed: {outcome.error}"
        if outcome.verify_error is not None:
            return None, f"verifier failed: {outcome.error}"
        traj, report, agent_s = outcome.played, outcome.report, outcome.play_s
        why = report.error or (f"tampered {report.tampered}" if report.tampered else "")
        if report.solved != want_solved or (why and not want_solved):
            # a slip is kept only as a clean miss: a verifier error or tampering is no lesson
            # name the assertions that failed: "7/8 passed" alone cannot be chased down
            failed = [f"{a.name}: {a.message.splitlines()[0][:160] if a.message else a.status}"
                      for a in report.assertions if a.status in ("failed", "error")]
            return None, (("unresolved" if want_solved else "not a clean miss")
                          + f": {report.passed}/{report.total} assertions passed"
                          + (f" ({why})" if why else "")
                          + (f"; failed {'; '.join(failed[:3])}" if want_solved and failed
                             else ""))
        sample = make_sample(traj, report, tid, attempt)
        failed = [(c.command.splitlines()[0][:80], c.exit_code)
                  for r in traj.records for c in r.commands if c.exit_code != 0]
        sample.metadata.update(source=source, commands=len(commands),
                               whole_script=reasons, nonzero_exits=failed,
                               agent_s=round(agent_s, 3))
        return sample, None

    def guarded(task):
        try:
            return one(task)
        except Exception as err:  # noqa: BLE001 - named on the task, never sinks the others
            return None, f"{type(err).__name__}: {err}"

    tasks = list(tasks)
    results = fan_out(tasks, guarded, workers=site.concurrency, backend=site.backend,
                      run_id=site.run_id, name="sft-oracle",
                      on_done=progress and (lambda task, out: progress(task.task_id, out[1])))
    samples = [s for s, _ in results if s is not None]
    skipped = [(t.task_id, why) for t, (s, why) in zip(tasks, results) if s is None]
    return samples, skipped


__all__ = ["FINAL_ANSWER", "OracleEngine", "Teacher", "oracle_commands", "oracle_samples",
           "solution_commands", "split_solution", "unfaithful_constructs",
           "whole_script_command"]
