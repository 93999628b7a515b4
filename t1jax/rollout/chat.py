"""The pinned Qwen-style chat template with one `bash` tool, rendered as exact strings.

Why: TITO needs rendering to be append-only, so every piece of glue between turns is a fixed
string encoded once; pinning the strings here (rather than calling a tokenizer's Jinja template)
means a template update elsewhere cannot silently shift the token boundaries we train on.
"""

from __future__ import annotations

import json

IM_START, IM_END, EOT = "<|im_start|>", "<|im_end|>", "<|endoftext|>"
CALL_OPEN, CALL_CLOSE = "<tool_call>", "</tool_call>"
RESP_OPEN, RESP_CLOSE = "<tool_response>", "</tool_response>"
ASSISTANT_HEADER = f"{IM_START}assistant\n"

BASH_TOOL = {
    "type": "function",
    "function": {
        "name": "bash",
        "description": "Run a bash command in the task's sandbox and return its output.",
        "parameters": {
            "type": "object",
            "properties": {"command": {"type": "string", "description": "The command to run."}},
            "required": ["command"],
        },
    },
}


def tools_block(tools: list[dict] | None = None) -> str:
    """The tool section Qwen2.5 appends to the system message."""
    lines = "".join("\n" + json.dumps(t, ensure_ascii=False) for t in (tools or [BASH_TOOL]))
    return (
        "\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
        "You are provided with function signatures within <tools></tools> XML tags:\n<tools>"
        + lines
        + "\n</tools>\n\nFor each function call, return a json object with function name and "
        "arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n"
        '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>'
    )


def render_prefix(system: str, instruction: str) -> str:
    """System (with the tool) + user instruction + the assistant header the model continues."""
    return (
        f"{IM_START}system\n{system}{tools_block()}{IM_END}\n"
        f"{IM_START}user\n{instruction}{IM_END}\n{ASSISTANT_HEADER}"
    )


def render_tool_call(command: str) -> str:
    """One bash call exactly as the template writes it inside an assistant turn."""
    args = json.dumps({"command": command}, ensure_ascii=False)
    return f'{CALL_OPEN}\n{{"name": "bash", "arguments": {args}}}\n{CALL_CLOSE}'


def render_observation(observations: list[str], note: str = "") -> str:
    """Glue after an assistant turn that ended with <|im_end|>: tool results (then a note from
    the harness, e.g. a request to summarise), next header."""
    body = "\n".join(f"{RESP_OPEN}\n{o}\n{RESP_CLOSE}" for o in observations)
    return f"\n{IM_START}user\n{body}{chr(10) + note if note else ''}{IM_END}\n{ASSISTANT_HEADER}"


def render_full(messages: list[dict], add_generation_prompt: bool = False) -> str:
    """A whole conversation re-rendered from text; only used to show why naive rendering drifts.

    Messages: {"role": "system"|"user"|"assistant"|"tool", "content": str}; assistant content is
    the raw sampled text (tool-call markup included). Consecutive tool messages share one user turn.
    """
    out: list[str] = []
    for i, msg in enumerate(messages):
        role, content = msg["role"], msg.get("content") or ""
        if role == "system":
            out.append(f"{IM_START}system\n{content}{tools_block()}{IM_END}\n")
        elif role in ("user", "assistant"):
            out.append(f"{IM_START}{role}\n{content}{IM_END}\n")
        elif role == "tool":
            first = i == 0 or messages[i - 1]["role"] != "tool"
            last = i == len(messages) - 1 or messages[i + 1]["role"] != "tool"
            head = f"{IM_START}user" if first else ""
            out.append(f"{head}\n{RESP_OPEN}\n{content}\n{RESP_CLOSE}")
            if last:
                out.append(f"{IM_END}\n")
        else:
            raise ValueError(f"unknown role {role!r}")
    if add_generation_prompt:
        out.append(ASSISTANT_HEADER)
    return "".join(out)


def _parse_one(body: str) -> tuple[str | None, str | None]:
    """(command, None) for a valid bash call, else (None, error message)."""
    try:
        obj = json.loads(body)
    except (ValueError, RecursionError) as err:
        return None, f"tool call is not valid JSON ({err}): {body[:80]!r}"
    if not isinstance(obj, dict):
        return None, f"tool call must be a JSON object, got {type(obj).__name__}"
    name = obj.get("name")
    if name != "bash":
        return None, f"unknown tool {name!r}; the only tool is 'bash'"
    args = obj.get("arguments")
    if isinstance(args, str):  # some models emit the arguments object as a JSON string
        try:
            args = json.loads(args)
        except (ValueError, RecursionError):
            return None, "tool call 'arguments' is a string that is not JSON"
    if not isinstance(args, dict) or not isinstance(args.get("command"), str):
        return None, "bash call needs arguments {\"command\": <string>}"
    return args["command"], None


def parse_tool_calls(text: str) -> tuple[list[str], list[str]]:
    """Bash commands from an assistant turn, plus one readable error per bad call; never raises.

    A call missing its closing tag runs to the next <tool_call>, <|im_end|>, or the end of text
    (a sampler that stops on </tool_call> drops the tag); text outside calls is ignored.
    """
    if not isinstance(text, str):
        return [], [f"expected text, got {type(text).__name__}"]
    calls: list[str] = []
    errors: list[str] = []
    pos = text.find(CALL_OPEN)
    while pos != -1:
        start = pos + len(CALL_OPEN)
        ends = [e for e in (text.find(CALL_CLOSE, start), text.find(CALL_OPEN, start),
                            text.find(IM_END, start)) if e != -1]
        end = min(ends) if ends else len(text)
        command, err = _parse_one(text[start:end].strip())
        if err is None:
            calls.append(command)
        else:
            errors.append(err)
        pos = text.find(CALL_OPEN, end)
    return calls, errors
