"""SGLang's own /generate JSON contract as the reference for both directions of the wire: every
request body FleetClient sends decodes under SGLang 0.5.23's `GenerateRequest` (the check
`http_server.py` runs on a raw body before building `GenerateReqInput`) with the values we
meant, and every reply our server builds decodes under its `GenerateResponse` (meta_info,
finish reasons stop / length / abort, `[logprob, token_id, text]` entries). The contract
(`sglang/api/v1/api_types.py`, generated, msgspec only) runs in .venv-sglang, where the sglang
package is installed --no-deps: importing `sglang` itself needs its CUDA-era torch and triton.

What the contract does not cover is checked by our own tests, citing SGLang's code:
routed_experts' layout (tests/rollout/test_rollout_server.py: base64 int32 [start_len .. prompt +
output - 1) x layers x k, SGLang state_capturer/base.py), the sampler's log-prob semantics
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
