"""Two real `t1jax.rollout.server` processes behind a FleetClient: HTTP results equal the
in-process JaxEngine's (ids, log-probs, routes), batched input_ids, 400s naming the field, sticky
routing, weight publishing to both, and failover when a server is killed mid-run with complete,
non-duplicated results. The server processes are shared by the module and always killed.
"""

import base64
import dataclasses
import http.client
import json
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
from pathlib import Path

import numpy as np
import pytest
from flax import nnx

from configs.model.tiny import get_config
from t1jax.model.config import model_config_from
from t1jax.model.hf_io import export_hf
from t1jax.model.transformer import CausalLM
from t1jax.rollout.engine import SamplingParams
from t1jax.rollout.jax_engine import JaxEngine
from t1jax.rollout.sglang import FleetClient, RolloutError, RouteLayout

MAX_BATCH, MAX_LEN = 4, 64
PROMPTS = [[5, 17, 300, 42, 7], [9, 1, 2], [100] * 11, [250, 251]]
GREEDY = SamplingParams(temperature=0.0, max_new_tokens=6)
LAYOUT = RouteLayout.of(model_config_from(get_config().model))
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def post(url, body):
    """(status, JSON) of a raw POST; body may be bytes."""
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


def start_server(path, port, max_len=MAX_LEN):
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}  # one CPU device
    # a restarted server reuses the first ones' compiles
    env["JAX_COMPILATION_CACHE_DIR"] = str(path.parent / "jax_cache")
    env["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] = "0"
    return subprocess.Popen(
        [sys.executable, "-m", "t1jax.rollout.server", "--model_path", str(path),
         "--port", str(port), "--max_batch", str(MAX_BATCH), "--max_len", str(max_len)],
        env=env, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def wait_healthy(url, proc, timeout_s=60):
    deadline = time.time() + timeout_s
    while True:
        if proc.poll() is not None:
            pytest.fail(f"server exited: {proc.stderr.read().decode()[-2000:]}")
        try:
            with urllib.request.urlopen(url + "/health", timeout=1) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        assert time.time() < deadline, f"server did not become healthy in {timeout_s} s"
        time.sleep(0.2)


@pytest.fixture(scope="module")
def model():
    return CausalLM(model_config_from(get_config().model), nnx.Rngs(0))


@pytest.fixture(scope="module")
def engine(model):
    return JaxEngine(model, max_batch=MAX_BATCH, max_len=MAX_LEN)


@pytest.fixture(scope="module")
def servers(model, tmp_path_factory):
    """[(url, process)] of two servers of the exported tiny model (a test may replace one)."""
    path = export_hf(model, tmp_path_factory.mktemp("ckpt") / "v0")
    procs = []
    try:
        for _ in range(2):
            port = free_port()
            procs.append((f"http://127.0.0.1:{port}", start_server(path, port)))
        for url, proc in procs:
            wait_healthy(url, proc)
            post(url + "/generate", {"input_ids": [1, 2], "sampling_params": {"max_new_tokens": 2}})  # compile: the next one hits the cache
        yield procs
    finally:
        for _, proc in procs:  # also any restarted in a test
            proc.kill()
            proc.wait()


@pytest.fixture(scope="module")
def client(servers):
    return FleetClient([u for u, _ in servers], LAYOUT, timeout_s=30, retries=2)


def assert_same(a, b):
    assert a.output_ids == b.output_ids and a.finish_reason == b.finish_reason
    np.testing.assert_allclose(a.output_logprobs, b.output_logprobs, rtol=0, atol=1e-5)
    assert a.routed_experts.dtype == np.int32
    np.testing.assert_array_equal(a.routed_experts, b.routed_experts)


@pytest.mark.slow
def test_http_results_equal_in_process_engine(client, engine, servers):
    want = engine.generate(PROMPTS, GREEDY)
    for url, _ in servers:
        c = FleetClient([url], LAYOUT, timeout_s=30, retries=0)
        for prompt, w in zip(PROMPTS, want):
            got = c.generate(prompt, GREEDY)
            assert_same(got, w)
            assert got.routed_experts.shape == (len(prompt) + 6 - 1, 4, 2)
            assert got.weight_version == "0"
    for got, w in zip(client.generate_many(PROMPTS, GREEDY, [f"k{i}" for i in range(4)]), want):
        assert_same(got, w)  # concurrent requests, batched together by the servers
    seeded = SamplingParams(temperature=0.9, top_k=40, max_new_tokens=5, seed=11)
    assert_same(client.generate(PROMPTS[0], seeded), engine.generate([PROMPTS[0]], seeded)[0])
    # only the positions a trial lacks: routed_experts_start_len on the wire, the rest equal
    later = dataclasses.replace(GREEDY, routes_from=3)
    got = client.generate(PROMPTS[0], later)
    assert got.routes_start == 3 and got.output_ids == want[0].output_ids
    np.testing.assert_array_equal(got.routed_experts, want[0].routed_experts[3:])
    with pytest.raises(RolloutError, match="routes_from=99 is past the prompt"):
        client.generate(PROMPTS[0], dataclasses.replace(GREEDY, routes_from=99))


@pytest.mark.slow
def test_batched_input_ids_and_sglang_format(servers, engine):
    url = servers[0][0]
    status, out = post(url + "/generate", {
        "input_ids": PROMPTS[:2], "return_logprob": True, "return_routed_experts": True,
        "sampling_params": {"temperature": 0, "max_new_tokens": 4, "stop_token_ids": []}})
    assert status == 200 and isinstance(out, list) and len(out) == 2
    want = engine.generate(PROMPTS[:2], SamplingParams(temperature=0.0, max_new_tokens=4))
    for prompt, o, w in zip(PROMPTS, out, want):
        meta = o["meta_info"]
        assert o["output_ids"] == w.output_ids and o["text"] == ""
        assert meta["prompt_tokens"] == len(prompt) and meta["completion_tokens"] == 4
        assert meta["finish_reason"]["type"] == "length" and meta["weight_version"] == "0"
        assert [t for _, t, _ in meta["output_token_logprobs"]] == w.output_ids
        routes = np.frombuffer(base64.b64decode(meta["routed_experts"]), dtype=np.int32)
        np.testing.assert_array_equal(routes.reshape(len(prompt) + 3, 4, 2), w.routed_experts)
    status, one = post(url + "/generate", {"input_ids": PROMPTS[1]})
    assert status == 200 and "routed_experts" not in one["meta_info"]


@pytest.mark.parametrize("body,field", [
    ({"sampling_params": {}}, "input_ids"),
    ({"input_ids": []}, "input_ids"),
    ({"input_ids": [1, "a"]}, "input_ids"),
    ({"input_ids": [1, 99999]}, "input_ids"),
    ({"input_ids": [1] * 200}, "input_ids"),  # longer than max_len
    ({"input_ids": [1], "sampling_params": {"top_p": 0}}, "sampling_params.top_p"),
    ({"input_ids": [1], "sampling_params": {"max_new_token": 3}},
     "sampling_params.max_new_token"),
    ({"input_ids": [1], "sampling_params": {"temperature": "hot"}},
     "sampling_params.temperature"),
    ({"input_ids": [1], "return_logprob": "yes"}, "return_logprob"),
    (b"{not json", "body"),
    # SGLang keys this server cannot honour are refused by name, never ignored
    ({"input_ids": [1], "sampling_params": {"stop": ["\n"]}}, "sampling_params.stop"),
    ({"input_ids": [1], "sampling_params": {"n": 2}}, "sampling_params.n"),
    ({"input_ids": [1], "sampling_params": {"repetition_penalty": 1.1}},
     "sampling_params.repetition_penalty"),
    ({"input_ids": [1], "sampling_params": {"regex": "a+"}}, "sampling_params.regex"),
    ({"input_ids": [1], "sampling_params": {"ignore_eos": "yes"}}, "sampling_params.ignore_eos"),
    ({"input_ids": [1], "logprob_start_len": 0}, "logprob_start_len"),
    ({"input_ids": [1], "top_logprobs_num": 5}, "top_logprobs_num"),
    ({"input_ids": [1], "stream": True}, "stream"),
    ({"input_ids": [1], "return_entropy": True}, "return_entropy"),
    ({"input_ids": [1], "log_metrics": "on"}, "log_metrics"),
    ({"input_ids": [1], "text": "hi"}, "text"),
    ({"input_ids": [1], "rid": 5}, "rid"),
    ({"input_ids": [[1], [2]], "rid": ["a"]}, "rid"),
    ({"input_ids": [1, 2], "routed_experts_start_len": 3}, "routed_experts_start_len"),
    ({"input_ids": [1], "routing_key": 7}, "routing_key"),
])
def test_bad_requests_are_400_naming_the_field(servers, body, field):
    status, out = post(servers[0][0] + "/generate", body)
    assert status == 400 and out["field"] == field, out


def test_sglang_keys_rid_routes_start_and_cache_endpoint(servers, engine):
    """The SGLang keys it can honour are honoured: rid echoed as meta_info.id (batched: one per
    prompt), routed_experts from routed_experts_start_len on, the sampling flags accepted;
    /flush_cache answers as SGLang's does."""
    url = servers[0][0]
    want = engine.generate(PROMPTS[:2], SamplingParams(temperature=0.0, max_new_tokens=4))
    sp = {"temperature": 0, "max_new_tokens": 4, "n": 1, "stop": [], "ignore_eos": False,
          "no_stop_trim": True, "skip_special_tokens": True, "min_p": 0.0,
          "repetition_penalty": 1.0, "min_new_tokens": 0, "logit_bias": {}, "regex": None}
    status, out = post(url + "/generate", {
        "input_ids": PROMPTS[0], "rid": "req-1", "return_logprob": True, "logprob_start_len": -1,
        "return_routed_experts": True, "routed_experts_start_len": 3, "stream": False,
        "sampling_params": sp, "routing_key": "ep-1",
        # what sglang-router (smg 1.13) adds to every request it forwards
        "model": "unknown", "log_metrics": True, "background": False, "no_logs": False,
        "return_bytes": False, "return_entropy": False, "return_text_in_logprobs": False})
    assert status == 200 and out["meta_info"]["id"] == "req-1"
    assert out["output_ids"] == want[0].output_ids
    routes = np.frombuffer(base64.b64decode(out["meta_info"]["routed_experts"]), np.int32)
    np.testing.assert_array_equal(routes.reshape(-1, 4, 2), want[0].routed_experts[3:])
    status, outs = post(url + "/generate", {"input_ids": PROMPTS[:2], "rid": ["a", "b"],
                                            "sampling_params": sp})
    assert status == 200 and [o["meta_info"]["id"] for o in outs] == ["a", "b"]
    assert [o["output_ids"] for o in outs] == [w.output_ids for w in want]
    conn = http.client.HTTPConnection(*urllib.parse.urlsplit(url).netloc.split(":"))
    conn.request("POST", "/generate", body=iter([b'{"input_ids": ', json.dumps(PROMPTS[0]).encode(),
                                                 b', "rid": "chunked", "sampling_params": ',
                                                 json.dumps(sp).encode(), b"}"]),
                 headers={"Content-Type": "application/json"}, encode_chunked=True)
    reply = conn.getresponse()  # a body sent chunked, as smg forwards a large one
    out = json.loads(reply.read())
    assert reply.status == 200 and out["meta_info"]["id"] == "chunked", out
    assert out["output_ids"] == want[0].output_ids
    conn.close()
    for method in ("GET", "POST"):
        req = urllib.request.Request(url + "/flush_cache", method=method,
                                     data=b"" if method == "POST" else None)
        with urllib.request.urlopen(req, timeout=30) as r:
            assert r.status == 200 and r.read().startswith(b"Cache flushed")


def test_a_paused_server_aborts_and_the_client_retries_elsewhere(servers, engine):
    """/pause_generation holds new requests; mode=abort answers the held ones with SGLang's
    abort reply, which FleetClient never takes as a turn: it re-issues the request to the
    other server (the result is the engine's) and leaves the paused one out until it serves
    again; /continue_generation runs what is queued."""
    (url_a, _), (url_b, _) = servers
    client = FleetClient([url_a, url_b], LAYOUT, timeout_s=30, retries=1)
    key = next(k for k in (f"pause-{i}" for i in range(100)) if client.server_for(k) == url_a)
    ok = {"message": "Generation paused successfully.", "status": "ok"}
    assert post(url_a + "/pause_generation", {"mode": "in_place"}) == (200, ok)
    try:
        with ThreadPoolExecutor(3) as ex:
            raw = ex.submit(post, url_a + "/generate", {"input_ids": PROMPTS[1], "rid": "r9"})
            retried = ex.submit(client.generate, PROMPTS[2], GREEDY, key)
            time.sleep(1.0)
            assert not raw.done() and not retried.done()  # held while paused
            assert post(url_a + "/pause_generation", {"mode": "abort"})[0] == 200
            status, aborted = raw.result(timeout=60)
            got = retried.result(timeout=60)
            held = ex.submit(post, url_a + "/generate", {"input_ids": PROMPTS[1]})
            time.sleep(0.5)
            assert not held.done()
            assert post(url_a + "/continue_generation", {})[0] == 200
            assert held.result(timeout=60)[0] == 200  # queued while paused, run on continue
    finally:
        post(url_a + "/continue_generation", {})
    assert status == 200 and aborted["output_ids"] == [] and aborted["meta_info"]["id"] == "r9"
    assert aborted["meta_info"]["finish_reason"]["type"] == "abort"
    assert_same(got, engine.generate([PROMPTS[2]], GREEDY)[0])
    assert url_a not in client.live and (url_a, "_ServerError") in client.failures
    assert client.health_check() == [url_a, url_b]  # serving again: back in


def test_route_layout_masks_dense_layers_and_refuses_bad_captures():
    """Dense layers come from the model config (SGLang reports them as expert 0); a capture out
    of range or with an expert repeated within a token (all zeros: a server without
    --enable-return-routed-experts) is an error naming the server and request."""
    assert LAYOUT == RouteLayout(layers=4, k=2, num_experts=16, dense_layers=(0,))
    rng = np.random.default_rng(0)
    good = np.stack([[rng.permutation(16)[:2] for _ in range(4)] for _ in range(6)])
    sglang_style = good.copy()
    sglang_style[:, 0] = 0
    out = LAYOUT.check(sglang_style, "http://w1 (request r1)")
    assert (out[:, 0] == -1).all() and (out[:, 1:] == good[:, 1:]).all()
    assert out.dtype == np.int32 and (sglang_style[:, 0] == 0).all()  # not written in place
    with pytest.raises(RolloutError, match=r"http://w1 \(request r1\).*repeats an expert.*"
                       "6 of 6 positions.*--enable-return-routed-experts"):
        LAYOUT.check(np.zeros((6, 4, 2), np.int32), "http://w1 (request r1)")
    for bad in (16, -1):
        wrong = good.copy()
        wrong[2, 3, 1] = bad
        with pytest.raises(RolloutError, match=f"expert {bad} at position 2, layer 3"):
            LAYOUT.check(wrong, "w")


def test_a_reply_without_routes_names_the_router_and_the_field():
    client = FleetClient(["http://127.0.0.1:9"], LAYOUT)
    reply = {"output_ids": [4], "meta_info": {"output_token_logprobs": [[-0.1, 4, None]],
                                              "finish_reason": {"type": "length"}}}
    with pytest.raises(RolloutError, match="no meta_info.routed_experts.*router"):
        client._parse("http://127.0.0.1:9", [1, 2], GREEDY, reply)


def test_bad_update_and_client_side_400(servers, client, tmp_path):
    url = servers[1][0]
    status, out = post(url + "/update_weights_from_disk", {"model_path": str(tmp_path)})
    assert status == 400 and out["success"] is False and "config" in out["message"]
    status, out = post(url + "/update_weights_from_disk", {})
    assert status == 400 and out["field"] == "model_path"
    with pytest.raises(RolloutError, match="400"):
        client.generate([1] * 200, GREEDY)  # a 4xx is not retried elsewhere
    assert client.live == {u for u, _ in servers}


def test_routing_key_is_sticky(client, servers):
    urls = [u for u, _ in servers]
    keys = {client.server_for(f"episode-{i}"): f"episode-{i}" for i in range(20)}
    assert set(keys) == set(urls)  # the keys spread over both servers
    for url, key in keys.items():
        before = dict(client.served)
        for _ in range(3):
            assert client.server_for(key) == url
            client.generate(PROMPTS[1], SamplingParams(temperature=0.0, max_new_tokens=2), key)
        assert client.served[url] == before[url] + 3
        assert sum(client.served.values()) == sum(before.values()) + 3


def test_publish_weights_reaches_both_servers(client, servers, engine, tmp_path):
    before = engine.generate([PROMPTS[0]], GREEDY)[0]
    new = CausalLM(model_config_from(get_config().model), nnx.Rngs(1))
    path = client.publish_weights(new, tmp_path, "1")
    engine.load_weights(nnx.state(new, nnx.Param), "1")
    want = engine.generate([PROMPTS[0]], GREEDY)[0]
    assert want.output_logprobs != before.output_logprobs
    for url, _ in servers:
        info = client.model_info(url)
        assert info["weight_version"] == "1" and info["model_path"] == str(path)
        got = FleetClient([url], LAYOUT, retries=0).generate(PROMPTS[0], GREEDY)
        assert got.weight_version == "1"
        assert_same(got, want)


@pytest.mark.slow
def test_failover_when_a_server_dies_mid_run(client, servers, engine, tmp_path):
    """Eight long requests all routed to one server, killed once its first results are back:
    the rest are re-issued whole to the other, and every result is complete and the
    in-process engine's. Restarted on old weights, the server rejoins with the published ones."""
    (url_a, _), (url_b, proc_b) = servers
    keys = [k for k in (f"ep-{i}" for i in range(200)) if client.server_for(k) == url_b][:8]
    prompts = [[3 + i, 40 + i, 7] for i in range(8)]
    params = SamplingParams(temperature=0.0, max_new_tokens=24)
    want = engine.generate(prompts, params)
    served = dict(client.served)
    with ThreadPoolExecutor(8) as ex:
        futures = [ex.submit(client.generate, p, params, k) for p, k in zip(prompts, keys)]
        wait(futures, return_when=FIRST_COMPLETED)
        proc_b.kill()
        results = [f.result() for f in futures]
    for got, w in zip(results, want):
        assert len(got.output_ids) == 24
        assert_same(got, w)
    moved = client.served[url_a] - served[url_a]
    assert moved >= 1 and moved + client.served[url_b] - served[url_b] == 8
    assert url_b not in client.live and {u for u, _ in client.failures} == {url_b}
    assert "RemoteDisconnected" in {e for _, e in client.failures}  # died mid-request
    assert client.server_for(keys[0]) == url_a
    assert client.health_check() == [url_a]
    first_version_path = Path(proc_b.args[proc_b.args.index("--model_path") + 1])
    proc_b.wait()
    proc_b = start_server(first_version_path, int(url_b.rsplit(":", 1)[1]))
    servers[1] = (url_b, proc_b)  # the fixture kills it
    wait_healthy(url_b, proc_b)
    assert client.model_info(url_b)["weight_version"] == "0"  # restarted on old weights
    assert client.health_check() == [url_a, url_b]  # back, after being given version 1
    assert client.model_info(url_b)["weight_version"] == "1"
    n = client.served[url_b]
    assert_same(client.generate(prompts[0], params, keys[0]), want[0])  # sticky again
    assert client.served[url_b] == n + 1
    nobody = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    with pytest.raises(RolloutError, match="no live server"):
        FleetClient([nobody], LAYOUT, timeout_s=2).publish_weights(engine.model, tmp_path, "9")


def test_a_server_that_ignores_seeds_is_named(servers, caplog):
    """SGLang honours sampling_seed only with --enable-deterministic-inference: a server whose
    /server_info does not report it is named in a warning, once; ours reports it (a JaxEngine
    seed gives the same sample whatever shares the batch). A server with only the deprecated
    /get_server_info path is still asked."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    class OldSGLang(BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 (http.server's name)
            found = self.path == "/get_server_info"
            body = json.dumps({"enable_deterministic_inference": False} if found
                              else {"detail": "Not Found"}).encode()
            self.send_response(200 if found else 404)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    http_server = ThreadingHTTPServer(("127.0.0.1", 0), OldSGLang)
    threading.Thread(target=http_server.serve_forever, daemon=True).start()
    old = f"http://127.0.0.1:{http_server.server_address[1]}"
    try:
        ours = [u for u, _ in servers]
        client = FleetClient([*ours, old], LAYOUT, timeout_s=30)
        with caplog.at_level("WARNING"):
            assert client.check_seeds_honoured() == [old]
            assert client.check_seeds_honoured() == []  # each server asked once
        warned = [r.getMessage() for r in caplog.records if "sampling_seed" in r.getMessage()]
        assert len(warned) == 1 and old in warned[0]
        assert "--enable-deterministic-inference" in warned[0]
    finally:
        http_server.shutdown()


def test_a_publish_aborts_the_requests_in_flight_and_they_go_again(servers, tmp_path):
    """A publish pauses each server with mode abort before the reload (SGLang's reload would
    otherwise wait for every generation in flight), then continues it. A request it aborted is
    sent again by its client once the publish is over, whole, and sampled by the new weights;
    it is not a failure (no server marked dead, no attempt spent: retries=0 here)."""
    import threading
    url = servers[1][0]
    client = FleetClient([url], LAYOUT, timeout_s=60, retries=0)
    new = CausalLM(model_config_from(get_config().model), nnx.Rngs(1))
    post(url + "/pause_generation", {"mode": "in_place"})  # a busy server: the request waits
    got = {}
    thread = threading.Thread(target=lambda: got.update(r=client.generate(PROMPTS[0], GREEDY)))
    thread.start()
    time.sleep(1.0)  # the request reaches the server and is held there
    client.publish_weights(new, tmp_path, "7")
    thread.join(timeout=120)
    assert got["r"].weight_version == "7" and client.reissued == 1
    assert client.live == {url} and client.failures == []
    engine = JaxEngine(new, max_batch=MAX_BATCH, max_len=MAX_LEN)
    assert_same(got["r"], engine.generate([PROMPTS[0]], GREEDY)[0])
