"""What the SGLang model gateway (smg, .venv-sglang) costs per /generate call: the same
FleetClient requests to one t1jax server (the tiny Qwen3-MoE, one new token, routes returned)
straight, and through the router in front of it (--policy consistent_hashing, as BUILD.md
runs it). Blocks of calls alternate between the two; prints the median and p90 latency of each
and the router's added milliseconds and ratio against the direct calls, same run.

  .venv/bin/python experiments/benchmarks/router_overhead.py [--calls 200]
"""

from __future__ import annotations

import argparse
import os
import platform
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_up(url: str, proc: subprocess.Popen, timeout_s: float = 120) -> None:
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{proc.args[:3]} exited with {proc.returncode}")
        try:
            with urllib.request.urlopen(url + "/health", timeout=1):
                return
        except OSError:
            time.sleep(0.3)
    raise RuntimeError(f"{url} not up in {timeout_s} s")


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--calls", type=int, default=200, help="per arm")
    args = parser.parse_args()

    import numpy as np
    from flax import nnx

    from configs.model.tiny import get_config
    from t1jax.model.config import model_config_from
    from t1jax.model.hf_io import export_hf
    from t1jax.model.transformer import CausalLM
    from t1jax.rollout.engine import SamplingParams
    from t1jax.rollout.sglang import FleetClient, RouteLayout

    router_py = REPO / ".venv-sglang" / "bin" / "python"
    if not router_py.exists():
        sys.exit("no .venv-sglang: run bash scripts/setup_sglang.sh")
    cfg = model_config_from(get_config().model)
    tmp = Path(tempfile.mkdtemp(prefix="t1jax_router_bench_"))
    path = export_hf(CausalLM(cfg, nnx.Rngs(0)), tmp / "v0")
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS" and "proxy" not in k.lower()}
    port, rport = free_port(), free_port()
    server = subprocess.Popen([sys.executable, "-m", "t1jax.rollout.server", "--model_path",
                               str(path), "--port", str(port), "--max_batch", "4",
                               "--max_len", "64"], env=env, cwd=REPO,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url, rurl = f"http://127.0.0.1:{port}", f"http://127.0.0.1:{rport}"
    router = None
    try:
        wait_up(url, server)
        router = subprocess.Popen(
            [str(router_py), "-m", "smg.launch_router", "--worker-urls", url, "--host",
             "127.0.0.1", "--port", str(rport), "--policy", "consistent_hashing",
             "--prometheus-host", "127.0.0.1", "--prometheus-port", str(free_port()),
             "--disable-tokenizer-autoload"], env=env, stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL)
        wait_up(rurl, router)
        layout = RouteLayout.of(cfg)
        clients = {"direct": FleetClient([url], layout, retries=0),
                   "router": FleetClient([url], layout, retries=0, router=rurl)}
        params = SamplingParams(temperature=0.0, max_new_tokens=1)
        prompt = [5, 17, 300, 42, 7, 8, 9, 10]
        for c in clients.values():  # compile and connect
            for _ in range(5):
                c.generate(prompt, params, "warm")
        times = {name: [] for name in clients}
        block = 20
        for start in range(0, args.calls, block):
            for name in (("direct", "router") if start // block % 2 == 0 else
                         ("router", "direct")):
                for i in range(start, min(start + block, args.calls)):
                    t0 = time.perf_counter()
                    clients[name].generate(prompt, params, f"ep-{i}")
                    times[name].append((time.perf_counter() - t0) * 1e3)
    finally:
        for p in (server, router):
            if p is not None:
                p.kill()
                p.wait()
    med = {n: float(np.median(t)) for n, t in times.items()}
    print(f"machine: {platform.node()} {os.cpu_count()} cores; {args.calls} calls per arm, "
          "one new token, 8-token prompt, routes returned, sequential")
    print("\n| path | median ms | p90 ms | vs direct |")
    print("|---|---|---|---|")
    for name, t in times.items():
        print(f"| {name} | {med[name]:.2f} | {np.percentile(t, 90):.2f} | "
              f"{med[name] / med['direct']:.2f}x |")
    print(f"\nrouter adds {med['router'] - med['direct']:.2f} ms per call (median)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
