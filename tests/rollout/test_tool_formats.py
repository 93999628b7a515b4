"""Tool calls in the model's own format, checked against SGLang's own parsers: Qwen3's JSON
form (sglang/srt/function_call/qwen25_detector.py, parser "qwen") and Qwen3.5's XML form
(qwen3_coder_detector.py, parser "qwen3_coder"), loaded from sglang 0.5.23 in .venv-sglang
without sglang/__init__ (which imports torch and triton; the detectors need neither).

Both directions: every call we render, SGLang parses to the same command; on a corpus of
model-written replies (text around calls, two calls, a wrong tool, the JSON form's spelling from
SGLang's own structure_info), our parser finds exactly the calls SGLang finds. And the format
is chosen from a checkpoint's own chat template.
"""

import json
import subprocess
from pathlib import Path

import pytest

from t1jax.rollout.chat import (IM_END, TOOL_FORMATS, parse_tool_calls, render_prefix,
                                render_tool_call, resolve_tool_format, tool_format_from_template,
                                tool_format_of)

PY = Path(__file__).resolve().parents[2] / ".venv-sglang" / "bin" / "python"
SGLANG_PARSE = r"""
import json, sys, sysconfig, types
root = sysconfig.get_paths()["purelib"] + "/sglang"
pkg = types.ModuleType("sglang"); pkg.__path__ = [root]; sys.modules["sglang"] = pkg
from sglang.srt.entrypoints.openai.protocol import Function, Tool
from sglang.srt.function_call.qwen25_detector import Qwen25Detector
from sglang.srt.function_call.qwen3_coder_detector import Qwen3CoderDetector
tools = [Tool(type="function", function=Function(name="bash", parameters={
    "type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}))]
detectors = {"qwen3_json": Qwen25Detector, "qwen3_xml": Qwen3CoderDetector}
info = Qwen25Detector().structure_info()("bash")
out = {"json_begin": info.begin, "json_end": info.end, "parsed": []}
for fmt, text in json.load(sys.stdin):
    calls = detectors[fmt]().detect_and_parse(text, tools).calls
    out["parsed"].append([[c.name, json.loads(c.parameters)] for c in calls])
print(json.dumps(out))
"""
COMMANDS = ["ls -la /app", "cat > /app/out.txt <<'EOF'\na & b < c > d\n\"quoted\" {x: 1}\nEOF",
            "grep -c ERROR logs/*.log | sort -t: -k2nr", "echo 'héllo → wörld'",
            "python3 -c \"print(1 if 2 > 1 else 0)\""]


def sglang_parse(items: list[tuple[str, str]]) -> dict:
    if not PY.exists():
        pytest.fail("no .venv-sglang: run bash scripts/setup_sglang.sh (scripts/test.sh does)")
    proc = subprocess.run([str(PY), "-c", SGLANG_PARSE], input=json.dumps(items), text=True,
                          capture_output=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout)


def test_our_calls_parse_alike_in_sglang_and_ours():
    rendered = [(f, render_tool_call(c, f)) for f in TOOL_FORMATS for c in COMMANDS]
    written = {  # replies as a model writes them, in each form
        "qwen3_json": ["Let me look first.\n" + render_tool_call("ls", "qwen3_json"),
                       render_tool_call("pwd", "qwen3_json") + "\n"
                       + render_tool_call("id -u", "qwen3_json"),
                       '<tool_call>\n{"name": "python", "arguments": {"command": "x"}}\n'
                       '</tool_call>',
                       "The report is written."],
        "qwen3_xml": ["I'll check.\n" + render_tool_call("ls", "qwen3_xml"),
                      render_tool_call("pwd", "qwen3_xml") + "\n"
                      + render_tool_call("id -u", "qwen3_xml"),
                      "<tool_call>\n<function=python>\n<parameter=command>\nx\n</parameter>\n"
                      "</function>\n</tool_call>",
                      "<tool_call>\n<function=bash>\n<parameter=command>\nmkdir -p a/b\n"
                      "</parameter>\n</function>\n</tool_call>",
                      "The report is written."]}
    replies = [(f, t) for f, texts in written.items() for t in texts]
    theirs = sglang_parse(rendered + replies)
    # the JSON form exactly as SGLang's own structure_info spells it
    spelled = [theirs["json_begin"] + " " + json.dumps({"command": c}) + theirs["json_end"]
               for c in COMMANDS]
    spelled_parsed = sglang_parse([("qwen3_json", t) for t in spelled])["parsed"]
    for (fmt, text), got in zip(rendered, theirs["parsed"]):
        command = COMMANDS[[render_tool_call(c, fmt) for c in COMMANDS].index(text)]
        assert got == [["bash", {"command": command}]], (fmt, text, got)
        assert parse_tool_calls(text + IM_END, fmt) == ([command], [])
    for (fmt, text), got in zip(replies, theirs["parsed"][len(rendered):]):
        ours, errors = parse_tool_calls(text + IM_END, fmt)
        bash = [args["command"] for name, args in got if name == "bash"]
        assert ours == bash, (fmt, text)  # (SGLang's XML parser keeps a call to an unknown
        assert len(errors) == text.count("<tool_call>") - len(bash), (fmt, errors)  # tool)
    for command, text, got in zip(COMMANDS, spelled, spelled_parsed):
        assert got == [["bash", {"command": command}]]
        assert parse_tool_calls(text, "qwen3_json") == ([command], [])


def test_the_format_comes_from_the_checkpoints_chat_template(tmp_path):
    xml = ("{%- for tool_call in message.tool_calls %}<tool_call>\n<function="
           "{{ tool_call.name }}>\n{%- endfor %}")
    json_tpl = '<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}'
    assert tool_format_from_template(xml) == "qwen3_xml"
    assert tool_format_from_template(json_tpl) == "qwen3_json"
    assert tool_format_from_template(None) == "qwen3_json"
    cases = {"string": {"chat_template": xml},
             "named": {"chat_template": [{"name": "default", "template": json_tpl},
                                         {"name": "tool_use", "template": xml}]},
             "none": {"model_max_length": 1}}
    for name, config in cases.items():
        (tmp_path / name).mkdir()
        (tmp_path / name / "tokenizer_config.json").write_text(json.dumps(config))
    (tmp_path / "jinja").mkdir()
    (tmp_path / "jinja" / "chat_template.jinja").write_text(xml)
    assert [tool_format_of(tmp_path / n) for n in ("string", "named", "none", "jinja")] == \
        ["qwen3_xml", "qwen3_xml", "qwen3_json", "qwen3_xml"]
    assert resolve_tool_format("", "", str(tmp_path / "missing"), tmp_path / "jinja") == \
        "qwen3_xml"
    assert resolve_tool_format("qwen3_json", tmp_path / "jinja") == "qwen3_json"
    with pytest.raises(ValueError, match="qwen3_xml"):
        resolve_tool_format("hermes")
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "tokenizer_config.json").write_text("{oops")
    with pytest.raises(ValueError, match="tokenizer_config.json"):
        tool_format_of(tmp_path / "bad")
    assert "<function=NAME>" in render_prefix("S", "I", "qwen3_xml")
    assert '{"name": <function-name>' in render_prefix("S", "I", "qwen3_json")
