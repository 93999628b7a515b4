"""The SGLang model gateway (smg 1.13, the real Rust router from PyPI, in .venv-sglang) in front
of two real `t1jax.rollout.server` workers, with FleetClient generating through it as the
trainer does (config.rollouts.fleet_router): routes come back intact (return_routed_experts is
forwarded), multi-turn episodes stay on one worker by their X-SMG-Routing-Key (every later turn
a prefix hit on the worker that ran the earlier ones), a worker killed mid-run leaves every
request complete and equal to the in-process engine's, and a weight publish reaches every
worker, confirmed by version, including one that comes back after the kill.
"""

import json
import os
import signal
import subprocess
import time
import urllib.request
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
from pathlib import Path

import pytest
from flax import nnx

from configs.model.tiny import get_config
from t1jax.model.config import model_config_from
from t1jax.model.hf_io import export_hf
from t1jax.model.transformer import CausalLM
from t1jax.rollout.engine import SamplingParams
from t1jax.rollout.jax_engine import JaxEngine
from t1jax.rollout.sglang import FleetClient
from test_rollout_server import LAYOUT, MAX_BATCH, MAX_LEN, assert_same, free_port, \
    start_server, wait_healthy

REPO = Path(__file__).resolve().parents[2]
ROUTER_PY = REPO / ".venv-sglang" / "bin" / "python"
GREEDY = SamplingParams(temperature=0.0, max_new_tokens=5)
pytestmark = pytest.mark.slow


def worker_stats(url: str) -> dict:
    """Our workers' engine counters, read from each one's /get_server_info."""
    with urllib.request.urlopen(url + "/get_server_info", timeout=10) as r:
        return json.loads(r.read())["internal_states"][0]


def start_router(port: int, workers: list[str], log: Path,
                 fast_health: bool = True) -> subprocess.Popen:
    if not ROUTER_PY.exists():
        pytest.fail("no .venv-sglang: run bash scripts/setup_sglang.sh (scripts/test.sh does)")
    env = {k: v for k, v in os.environ.items() if "proxy" not in k.lower()}
    cmd = [str(ROUTER_PY), "-m", "smg.launch_router", "--worker-urls", *workers,
           "--host", "127.0.0.1", "--port", str(port), "--policy", "consistent_hashing",
           "--prometheus-host", "127.0.0.1", "--prometheus-port", str(free_port()),
           "--disable-tokenizer-autoload"]
    if fast_health:  # a dead worker out in ~1 s, a restarted one back in ~2 s (BUILD.md)
        cmd += ["--health-check-interval-secs", "1", "--health-failure-threshold", "1",
                "--health-check-timeout-secs", "1"]
    return subprocess.Popen(cmd, env=env, stdout=log.open("w"), stderr=subprocess.STDOUT)


def wait_router(url: str, proc: subprocess.Popen, timeout_s: float = 60) -> None:
    """Until the router forwards a generate (its workers registered)."""
    deadline = time.time() + timeout_s
    body = json.dumps({"input_ids": [1, 2], "sampling_params": {"max_new_tokens": 1}}).encode()
    while True:
        try:
            req = urllib.request.Request(url + "/generate", data=body,
                                         headers={"Content-Type": "application/json"})
            with urllib.request.urlopen(req, timeout=10) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        assert proc.poll() is None and time.time() < deadline, "the router did not come up"
        time.sleep(0.5)


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    """(router url, [worker url, process], model, checkpoint dir); everything killed at the end."""
    tmp = tmp_path_factory.mktemp("router")
    model = CausalLM(model_config_from(get_config().model), nnx.Rngs(0))
    path = export_hf(model, tmp / "v0")
    workers, router = [], None
    try:
        for _ in range(2):
            port = free_port()
            workers.append([f"http://127.0.0.1:{port}", start_server(path, port)])
        for url, proc in workers:
            wait_healthy(url, proc)
        port = free_port()
        router_url = f"http://127.0.0.1:{port}"
        router = start_router(port, [u for u, _ in workers], tmp / "router.log")
        client = FleetClient([u for u, _ in workers], LAYOUT, timeout_s=60, retries=2,
                             router=router_url)
        deadline = time.time() + 60
        while True:  # ready once it forwards a generate
            try:
                client.generate([1, 2], SamplingParams(temperature=0.0, max_new_tokens=1))
                break
            except Exception:  # noqa: BLE001 (not up yet)
                assert router.poll() is None, (tmp / "router.log").read_text()[-2000:]
                assert time.time() < deadline, (tmp / "router.log").read_text()[-2000:]
                time.sleep(0.5)
        yield router_url, workers, model, path
    finally:
        for _, proc in workers:
            proc.kill()
            proc.wait()
        if router is not None:
            router.kill()
            router.wait()


def test_episodes_through_the_router(fleet, tmp_path):
    router_url, workers, model, path = fleet
    client = FleetClient([u for u, _ in workers], LAYOUT, timeout_s=60, retries=2,
                         router=router_url)
    engine = JaxEngine(model, max_batch=MAX_BATCH, max_len=MAX_LEN)

    # multi-turn episodes, keyed: routes intact, every later turn a prefix hit on its worker
    hits0 = sum(worker_stats(u)["session_hits"] for u, _ in workers)
    prompts = {f"episode-{i}": [3 + i, 40 + i, 7] for i in range(MAX_BATCH)}  # rows for all
    for turn in range(3):
        with ThreadPoolExecutor(MAX_BATCH) as ex:
            got = dict(zip(prompts, ex.map(lambda k: client.generate(prompts[k], GREEDY, k),
                                           prompts)))
        for key, res in got.items():
            assert_same(res, engine.generate([prompts[key]], GREEDY)[0])
            prompts[key] = prompts[key] + res.output_ids + [11, 12]
    counts = [worker_stats(u) for u, _ in workers]
    assert sum(c["session_hits"] for c in counts) - hits0 == MAX_BATCH * 2  # sticky by key

    # a body past smg's 1 MiB buffer is forwarded chunked (and without retries): still served
    rid = "r" * (1 << 20)
    big = client._call(router_url, "POST", "/generate", {
        "input_ids": [3, 40, 7], "rid": rid, "sampling_params": {"max_new_tokens": 2}})
    assert big[0] == 200 and big[1]["meta_info"]["id"] == rid

    # a frozen worker (SIGSTOP), under a router with its default (slow) health checks: a
    # request that timed out on it is retried through the router under another key, so it is
    # not sent back to the frozen worker, and completes with the engine's result
    port = free_port()
    slow = start_router(port, [u for u, _ in workers], tmp_path / "slow.log", fast_health=False)
    try:
        slow_url = f"http://127.0.0.1:{port}"
        wait_router(slow_url, slow)

        def worker_of(key: str) -> str:
            req = urllib.request.Request(slow_url + "/generate", data=json.dumps(
                {"input_ids": [1, 2], "sampling_params": {"max_new_tokens": 1}}).encode(),
                headers={"Content-Type": "application/json", "X-SMG-Routing-Key": key})
            with urllib.request.urlopen(req, timeout=30) as r:
                return r.headers["x-smg-routed-worker-id"].rstrip("/")
        frozen = workers[1][0]
        key = next(k for k in (f"freeze-{i}" for i in range(200))
                   if worker_of(k) == frozen and worker_of(f"{k}#retry1") != frozen)
        impatient = FleetClient([u for u, _ in workers], LAYOUT, timeout_s=3, retries=1,
                                router=slow_url)
        prompt = [4, 50, 8]
        os.kill(workers[1][1].pid, signal.SIGSTOP)
        t0 = time.time()
        try:
            res = impatient.generate(prompt, GREEDY, key)
        finally:
            os.kill(workers[1][1].pid, signal.SIGCONT)
        assert time.time() - t0 >= 3  # the first attempt waited out its timeout
        assert_same(res, engine.generate([prompt], GREEDY)[0])
        assert impatient.served[slow_url] == 1
    finally:
        slow.kill()
        slow.wait()

    # a worker killed mid-run: every request completes, once, with the engine's result
    long = SamplingParams(temperature=0.0, max_new_tokens=24)
    batch = [[5 + i, 60 + i, 9] for i in range(8)]
    want = engine.generate(batch, long)
    with ThreadPoolExecutor(8) as ex:
        futures = [ex.submit(client.generate, p, long, f"kill-{i}") for i, p in enumerate(batch)]
        wait(futures, return_when=FIRST_COMPLETED)
        workers[1][1].kill()
        results = [f.result(timeout=120) for f in futures]
    for res, w in zip(results, want):
        assert len(res.output_ids) == 24
        assert_same(res, w)
    workers[1][1].wait()

    # a publish reaches every live worker; the restarted one is brought to it before it serves
    new = CausalLM(model_config_from(get_config().model), nnx.Rngs(1))
    client.publish_weights(new, tmp_path, "1")
    assert client.model_info(workers[0][0])["weight_version"] == "1"
    url_b = workers[1][0]
    workers[1][1] = start_server(path, int(url_b.rsplit(":", 1)[1]))
    wait_healthy(url_b, workers[1][1])
    assert client.model_info(url_b)["weight_version"] == "0"
    assert client.health_check() == [u for u, _ in workers]
    assert client.model_info(url_b)["weight_version"] == "1"
    engine.load_weights(nnx.state(new, nnx.Param), "1")
    deadline, i = time.time() + 30, 0
    while worker_stats(url_b)["prefilled_tokens"] == 0:  # the router's 1 s health check
        assert time.time() < deadline, "the router never sent the restarted worker a request"
        p = batch[i % len(batch)]
        res = client.generate(p, GREEDY, f"after-{i}")
        assert res.weight_version == "1"
        assert_same(res, engine.generate([p], GREEDY)[0])
        i += 1


def test_an_old_router_that_drops_routes_is_named(fleet, tmp_path):
    """sglang-router 0.3.2 (before smg) forwards /generate without return_routed_experts and
    adds return_hidden_states: false to every body. Our worker serves it (false changes
    nothing), and the client names the router and the dropped field instead of training on a
    reply without routes; again and again, never another error."""
    from t1jax.rollout.sglang import RolloutError
    _, workers, _, _ = fleet
    port = free_port()
    log = tmp_path / "old_router.log"
    env = {k: v for k, v in os.environ.items() if "proxy" not in k.lower()}
    router = subprocess.Popen(
        [str(ROUTER_PY), "-m", "sglang_router.launch_router", "--worker-urls", workers[0][0],
         "--host", "127.0.0.1", "--port", str(port), "--policy", "round_robin",
         "--prometheus-host", "127.0.0.1", "--prometheus-port", str(free_port())],
        env=env, stdout=log.open("w"), stderr=subprocess.STDOUT)
    try:
        url = f"http://127.0.0.1:{port}"
        wait_router(url, router)
        client = FleetClient([workers[0][0]], LAYOUT, timeout_s=60, retries=0, router=url)
        for _ in range(3):
            with pytest.raises(RolloutError, match="router in front that drops the field"):
                client.generate([1, 2, 3], GREEDY, routing_key="episode")
    finally:
        router.kill()
        router.wait()
