"""The pinned Qwen-style chat template with one `bash` tool, rendered as exact strings.

Why: TITO needs rendering to be append-only, so every piece of glue between turns is a fixed
string encoded once; pinning the strings here (rather than calling a tokenizer's Jinja template)
means a template update elsewhere cannot silently shift the token boundaries we train on.

Tool calls come in the two forms the Qwen models are trained on (TOOL_FORMATS): "qwen3_json",
Qwen2.5 / Qwen3's `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`, and "qwen3_xml",
Qwen3.5's and Qwen3-Coder's `<tool_call><function=NAME><parameter=KEY>VALUE</parameter>
</function></tool_call>`. A checkpoint's own chat template says which (tool_format_of); the
strings here are ours, written to the forms SGLang's parsers for those models read
(tests/rollout/test_tool_formats.py checks both directions against them).
"""

from __future__ import annotations

import json
from pathlib import Path

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


def xml_tools_block(tools: list[dict] | None = None) -> str:
    """The tool section for models that call tools in the XML form (Qwen3.5, Qwen3-Coder)."""
    lines = "".join("\n" + json.dumps(t, ensure_ascii=False) for t in (tools or [BASH_TOOL]))
    return (
        "\n\n# Tools\n\nThese functions are available, described in <tools></tools> tags:"
        "\n<tools>" + lines + "\n</tools>\n\nTo call one, write the call in this form and "
        "nothing after it:\n<tool_call>\n<function=NAME>\n<parameter=ARGUMENT>\nVALUE\n"
        "</parameter>\n</function>\n</tool_call>"
    )


TOOL_FORMATS = ("qwen3_json", "qwen3_xml")


def _check_format(tool_format: str) -> None:
    if tool_format not in TOOL_FORMATS:
        raise ValueError(f"tool_format={tool_format!r}; choose one of {TOOL_FORMATS}")


def render_prefix(system: str, instruction: str, tool_format: str = "qwen3_json") -> str:
    """System (with the tool) + user instruction + the assistant header the model continues."""
    _check_format(tool_format)
    tools = tools_block() if tool_format == "qwen3_json" else xml_tools_block()
    return (
        f"{IM_START}system\n{system}{tools}{IM_END}\n"
        f"{IM_START}user\n{instruction}{IM_END}\n{ASSISTANT_HEADER}"
    )


def render_tool_call(command: str, tool_format: str = "qwen3_json") -> str:
    """One bash call exactly as the template writes it inside an assistant turn."""
    _check_format(tool_format)
    if tool_format == "qwen3_xml":
        return (f"{CALL_OPEN}\n<function=bash>\n<parameter=command>\n{command}\n</parameter>\n"
                f"</function>\n{CALL_CLOSE}")
    args = json.dumps({"command": command}, ensure_ascii=False)
    return f'{CALL_OPEN}\n{{"name": "bash", "arguments": {args}}}\n{CALL_CLOSE}'


def tool_format_from_template(template: str | None) -> str:
    """qwen3_xml where a chat template writes calls as <function=...> (Qwen3.5, Qwen3-Coder),
    else qwen3_json (Qwen2.5, Qwen3, and no template at all)."""
    return "qwen3_xml" if template and "<function=" in template else "qwen3_json"


def resolve_tool_format(explicit: str, *model_dirs) -> str:
    """A job's tool-call form: `explicit` if set, else that of the first of model_dirs (the
    checkpoint, the tokenizer's folder) holding a chat template, else qwen3_json."""
    if explicit:
        _check_format(explicit)
        return explicit
    for d in model_dirs:
        if d and any((Path(d) / f).is_file()
                     for f in ("chat_template.jinja", "tokenizer_config.json")):
            return tool_format_of(d)
    return "qwen3_json"


def tool_format_of(model_dir) -> str:
    """The tool-call form of a Hugging Face checkpoint, from its own chat template:
    chat_template.jinja, else tokenizer_config.json's chat_template (a string, or a list of
    {name, template} whose "tool_use" or "default" entry is read). qwen3_json without one."""
    model_dir = Path(model_dir)
    jinja = model_dir / "chat_template.jinja"
    if jinja.is_file():
        return tool_format_from_template(jinja.read_text())
    config = model_dir / "tokenizer_config.json"
    if not config.is_file():
        return "qwen3_json"
    try:
        template = json.loads(config.read_text()).get("chat_template")
    except ValueError as err:
        raise ValueError(f"{config}: not JSON ({err})") from None
    if isinstance(template, list):
        named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
        template = named.get("tool_use") or named.get("default")
    return tool_format_from_template(template if isinstance(template, str) else None)


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


def _parse_one_xml(body: str) -> tuple[str | None, str | None]:
    """(command, None) for a valid XML-form bash call, else (None, error message). A value is
    the text between its tags less one newline on each side, as the form writes it."""
    head = body.find("<function=")
    if head == -1:
        return None, f"tool call has no <function=...>: {body[:80]!r}"
    end = body.find(">", head)
    name = body[head + len("<function="):end if end != -1 else len(body)].strip()
    if end == -1 or name != "bash":
        return None, f"unknown tool {name!r}; the only tool is 'bash'"
    open_tag, close_tag = "<parameter=command>", "</parameter>"
    start = body.find(open_tag, end)
    if start == -1:
        return None, "bash call needs <parameter=command>"
    start += len(open_tag)
    stop = body.find(close_tag, start)
    if stop == -1:  # a sampler that stops on </tool_call> may leave the tags open
        stop = body.find("</function>", start)
        stop = len(body) if stop == -1 else stop
    value = body[start:stop]
    value = value[1:] if value.startswith("\n") else value
    return (value[:-1] if value.endswith("\n") else value), None


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


def parse_tool_calls(text: str, tool_format: str = "qwen3_json") -> tuple[list[str], list[str]]:
    """Bash commands from an assistant turn, plus one readable error per bad call; never raises
    (except for an unknown tool_format, a caller's mistake).

    A call missing its closing tag runs to the next <tool_call>, <|im_end|>, or the end of text
    (a sampler that stops on </tool_call> drops the tag); text outside calls is ignored.
    """
    _check_format(tool_format)
    parse_one = _parse_one if tool_format == "qwen3_json" else _parse_one_xml
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
        command, err = parse_one(text[start:end].strip())
        if err is None:
            calls.append(command)
        else:
            errors.append(err)
        pos = text.find(CALL_OPEN, end)
    return calls, errors
