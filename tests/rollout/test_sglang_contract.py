"""SGLang's own /generate JSON contract as the reference for both directions of the wire: every
request body FleetClient sends decodes under SGLang 0.5.23's `GenerateRequest` (the check
`http_server.py` runs on a raw body before building `GenerateReqInput`) with the values we
meant, and every reply our server builds decodes under its `GenerateResponse` (meta_info,
finish reasons stop / length / abort, `[logprob, token_id, text]` entries). The contract
(`sglang/api/v1/api_types.py`, generated, msgspec only) runs in .venv-sglang, where the sglang
package is installed --no-deps: importing `sglang` itself needs its CUDA-era torch and triton.

The contract's schema ignores routed_experts, so their wire format is checked against SGLang's
own functions, taken from its source (their modules import torch) and run on the same routes:
its capturer's slice [routed_experts_start_len, seqlen - 1) of an int32 buffer, its
detokenizer's base64 encoding and its client-side decoder (test_routes_on_the_wire_are_sglangs_own).
Checked by our own tests, citing SGLang's code: the sampler's log-prob semantics
(tests/rollout/test_jax_engine.py, layers/sampler.py), dense layers reported as 0 (RouteLayout).
"""

import json
import subprocess
from pathlib import Path

import numpy as np
import pytest

from t1jax.rollout.engine import FINISH_LENGTH, FINISH_STOP, GenerateResult, SamplingParams
from t1jax.rollout.sglang_protocol import aborted_response, to_response
from t1jax.rollout.sglang import generate_body

REPO = Path(__file__).resolve().parents[2]
PY = REPO / ".venv-sglang" / "bin" / "python"
DECODE = r"""
import importlib.util, json, sys, sysconfig
path = sysconfig.get_paths()["purelib"] + "/sglang/api/v1/api_types.py"
spec = importlib.util.spec_from_file_location("sglang_api_types", path)
api = importlib.util.module_from_spec(spec); sys.modules[spec.name] = api
spec.loader.exec_module(api)
from importlib.metadata import version
out = {"version": version("sglang"), "results": []}
for kind, value in json.load(sys.stdin):
    cls = api.GenerateRequest if kind == "request" else api.GenerateResponse
    try:
        out["results"].append({"ok": cls.from_json_value(value).to_json_value()})
    except api.JsonContractError as err:
        out["results"].append({"error": str(err)})
print(json.dumps(out))
"""


def sglang_decode(items: list[tuple[str, dict]]) -> list[dict]:
    """SGLang's decoding of each (request | response, JSON value): {"ok": its re-encoding}, or
    {"error": the contract's message}."""
    if not PY.exists():
        pytest.fail("no .venv-sglang: run bash scripts/setup_sglang.sh (scripts/test.sh does)")
    proc = subprocess.run([str(PY), "-c", DECODE], input=json.dumps(items), text=True,
                          capture_output=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = json.loads(proc.stdout)
    assert out["version"] == "0.5.23"
    return out["results"]


def test_fleet_requests_decode_under_sglangs_contract():
    params = [SamplingParams(temperature=0.0, max_new_tokens=4),
              SamplingParams(temperature=0.7, top_p=0.9, top_k=20, max_new_tokens=48, seed=11,
                             stop_token_ids=(5, 9)),
              SamplingParams()]
    bodies = [generate_body([1, 2, 3], p, routing_key=f"ep-{i}", rid=f"r{i}")
              for i, p in enumerate(params)]
    bodies.append(generate_body([7], params[0]))  # no key
    bad = dict(bodies[0], sampling_params={**bodies[0]["sampling_params"], "temprature": 1})
    results = sglang_decode([("request", b) for b in bodies + [bad]])
    for body, res in zip(bodies, results):
        assert "ok" in res, (body, res)
        got = res["ok"]
        assert got["input_ids"] == body["input_ids"] and got["rid"] == body["rid"]
        assert got.get("routing_key") == body.get("routing_key")
        assert got["return_logprob"] is True
        sent, read = body["sampling_params"], got["sampling_params"]
        for key, value in sent.items():  # every key we send means in SGLang what we meant
            assert read[key] == value, (key, read[key], value)
    assert "temprature" in results[-1]["error"]  # the reference does refuse a wrong key


def test_no_truncation_is_sent_as_sglangs_minus_one():
    """Our top_k <= 0 means no truncation; SGLang's verify() accepts only -1 or >= 1 (a 0 is
    an HTTP 400 there, while our own server took it)."""
    for top_k, sent in ((0, -1), (-1, -1), (-5, -1), (1, 1), (20, 20)):
        body = generate_body([1], SamplingParams(top_k=top_k))
        assert body["sampling_params"]["top_k"] == sent, top_k


def test_server_replies_decode_under_sglangs_contract():
    routes = np.arange(6 * 4 * 2, dtype=np.int32).reshape(6, 4, 2) % 16
    stop = GenerateResult([8, 9, 2], [-0.5, -1.25, -0.125], routes, FINISH_STOP, "3")
    length = GenerateResult([8, 9, 4], [-0.5, -1.25, -2.0], routes, FINISH_LENGTH, "3")
    replies = [to_response([1, 2, 3, 4], stop, True, True, rid="a"),
               to_response([1, 2, 3, 4], length, True, False),
               to_response([1, 2, 3, 4], length, False, False),
               aborted_response([1, 2], "b")]
    results = sglang_decode([("response", r) for r in replies])
    for reply, res in zip(replies, results):
        assert "ok" in res, (reply, res)
        got, meta = res["ok"], res["ok"]["meta_info"]
        assert got["output_ids"] == reply["output_ids"] and got["text"] == ""
        for key in ("id", "prompt_tokens", "completion_tokens", "weight_version"):
            assert meta.get(key) == reply["meta_info"].get(key), key
        assert meta["finish_reason"] == reply["meta_info"]["finish_reason"]
    entries = results[0]["ok"]["meta_info"]["output_token_logprobs"]
    assert entries == [[-0.5, 8, None], [-1.25, 9, None], [-0.125, 2, None]]
    assert results[0]["ok"]["meta_info"]["finish_reason"] == {"type": "stop", "matched": 2}
    assert results[3]["ok"]["meta_info"]["finish_reason"]["type"] == "abort"


ROUTES = r"""
import ast, json, sys, sysconfig
import numpy as np, pybase64
root = sysconfig.get_paths()["purelib"] + "/sglang/srt/"

def function(path, name, cls=None):
    # SGLang's own function, taken from its source (its modules import torch, absent here);
    # annotations and decorators dropped, the code itself run as written
    tree = ast.parse(open(root + path).read())
    scope = tree.body if cls is None else next(
        n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == cls).body
    fn = next(n for n in scope if isinstance(n, ast.FunctionDef) and n.name == name)
    fn.decorator_list, fn.returns = [], None
    for arg in fn.args.args + fn.args.kwonlyargs:
        arg.annotation = None
    ns = {"np": np, "pybase64": pybase64}
    exec(compile(ast.Module(body=[fn], type_ignores=[]), root + path, "exec"), ns)
    return ns[name]

class T:  # the torch.Tensor methods those functions call, over numpy
    def __init__(self, a): self.a = np.asarray(a)
    def __getitem__(self, i): return T(self.a[i.a if isinstance(i, T) else i])
    def cpu(self): return self
    def clone(self): return T(self.a.copy())
    def numpy(self): return self.a

get_topk = function("state_capturer/base.py", "get_topk", "BaseTopkCapturer")
encode = function("managers/detokenizer_manager.py", "_b64_encode_per_request",
                  "DetokenizerManager")
decode = function("state_capturer/routed_experts.py", "extract_routed_experts_from_meta_info")
base = open(root + "state_capturer/base.py").read()
case = json.load(sys.stdin)
full = np.asarray(case["routes"], np.int32)  # [seqlen - 1, layers, k] by position
seqlen, start = case["seqlen"], case["start"]
# SGLang's capture: a row per KV-pool slot, the request's positions at scattered slots
slots = np.random.default_rng(0).permutation(64)[:seqlen]
host = type("Host", (), {})()
host.buffer = T(np.zeros((64,) + full.shape[1:], np.int32))
host.buffer.a[slots[:seqlen - 1]] = full
pool = type("Pool", (), {})()
pool.req_to_token = T(slots[None, :])
capturer = type("Capturer", (), {"host_cache": host})()
rows = get_topk(capturer, req_pool_idx=0, seqlen=seqlen, req_to_token_pool=pool,
                start_len=start)
print(json.dumps({"encoded": encode([rows])[0],
                  "decoded": decode(case["reply"]).tolist(),
                  "host_dtype_int32": base.count("dtype=torch.int32") >= 2}))
"""


@pytest.mark.parametrize("start", [0, 5])
def test_routes_on_the_wire_are_sglangs_own(start):
    """The routes' wire format against SGLang's own code, both ways: its capturer's get_topk
    (rows [routed_experts_start_len, seqlen - 1) out of its int32 host buffer) and its
    detokenizer's base64 encoder, run on the same routes, give our server's string byte for
    byte; its client-side decoder reads our reply back to our routes. A change on either side
    (dtype, start offset, row order, base64 layout) fails here."""
    prompt, out = list(range(1, 9)), [11, 12, 13]
    rng = np.random.default_rng(start)
    routes = rng.integers(0, 16, (len(prompt) + len(out) - 1, 4, 2)).astype(np.int32)
    reply = to_response(prompt, GenerateResult(out, [-0.5] * 3, routes, FINISH_STOP, "0"),
                        True, True, routes_start=start)
    if not PY.exists():
        pytest.fail("no .venv-sglang: run bash scripts/setup_sglang.sh (scripts/test.sh does)")
    case = {"routes": routes.tolist(), "seqlen": len(prompt) + len(out), "start": start,
            "reply": reply}
    proc = subprocess.run([str(PY), "-c", ROUTES], input=json.dumps(case), text=True,
                          capture_output=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout)
    assert got["host_dtype_int32"]
    assert got["encoded"] == reply["meta_info"]["routed_experts"]
    assert got["decoded"] == routes[start:].reshape(-1).tolist()


FIELDS = r"""
import importlib.util, json, sys, sysconfig
path = sysconfig.get_paths()["purelib"] + "/sglang/api/v1/api_types.py"
spec = importlib.util.spec_from_file_location("sglang_api_types", path)
api = importlib.util.module_from_spec(spec); sys.modules[spec.name] = api
spec.loader.exec_module(api)
request = api.GenerateRequest
names, defaults = request.__struct_fields__, request.__struct_defaults__
first = len(names) - len(defaults)
out = {}
for i, name in enumerate(names):
    default = defaults[i - first] if i >= first else None
    out[name] = default.factory() if type(default).__name__ == "Factory" else default
print(json.dumps(out))
"""


def test_every_field_of_sglangs_request_is_served_or_refused_by_name():
    """Every field of SGLang's GenerateRequest, at SGLang's own default, is accepted by our
    server (a router or client that fills them in is served as SGLang would serve it); the
    ones this engine does not implement are refused naming the field once set."""
    from t1jax.rollout.sglang_protocol import _UNSET_ONLY, BadRequest, parse_generate
    if not PY.exists():
        pytest.fail("no .venv-sglang: run bash scripts/setup_sglang.sh (scripts/test.sh does)")
    proc = subprocess.run([str(PY), "-c", FIELDS], text=True, capture_output=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    defaults = json.loads(proc.stdout)
    assert len(defaults) > 30 and "routed_experts_start_len" in defaults
    base = {"input_ids": [1, 2, 3], "sampling_params": {"max_new_tokens": 2}}
    for name, default in defaults.items():
        if name not in base:
            parse_generate({**base, name: default}, 16)  # raises BadRequest if refused
    parse_generate({**base, **{k: v for k, v in defaults.items() if k not in base}}, 16)
    for name in _UNSET_ONLY:
        assert name in defaults, name  # a field SGLang has
        with pytest.raises(BadRequest, match=f"^{name}: not implemented"):
            parse_generate({**base, name: "set"}, 16)


def test_the_documented_launch_line_is_the_one_the_gpu_check_runs():
    """BUILD.md tells users the launch line t1jax.rollout.sglang.launch_command builds, and
    experiments/gpu_checks runs that function with no other flag."""
    from t1jax.rollout.sglang import launch_command
    line = " ".join(["python", *launch_command("DIR", port=30000, tp=1)])
    assert f"`{line}`" in (REPO / "BUILD.md").read_text()
    check = (REPO / "experiments" / "gpu_checks" / "sglang_routed_experts.py").read_text()
    assert "cmd = [sys.executable, *launch_command(dir0, port=port, host=\"127.0.0.1\"," in check
    assert "--skip-tokenizer-init" not in check and "--mem-fraction-static" not in check
