"""GPU check: SGLang's routed-expert capture and weight reload agree with t1jax on the same weights.

Run on a GPU host with SGLang installed (no internet needed), from the repository root:

  python experiments/gpu_checks/sglang_routed_experts.py [--dtype bfloat16] [--port 30123]

It exits 0 with "SKIP: ..." when SGLang is not installed or there is no CUDA GPU. Otherwise:
  1. builds t1jax's tiny random Qwen3-MoE (configs/model/tiny.py, 4 layers, layer 0 dense,
     top-2 of 16 experts) and writes it with `export_hf` (plus a tokenizer.json);
  2. launches BUILD.md's line, `python -m sglang.launch_server --model-path DIR
     --enable-return-routed-experts --enable-deterministic-inference --host H --port P --tp 1`
     (t1jax.rollout.sglang.launch_command; the routed-experts flag's spelling is read from the
     installed version's `--help`), with no other flag, and waits for /health;
  3. generates through FleetClient, the trainer's own path (the body of
     t1jax.rollout.sglang.generate_body: input_ids, greedy sampling_params with max_new_tokens
     16, return_logprob, return_routed_experts, rid, routing_key), which decodes
     meta_info.routed_experts (base64 int32) to [prompt + output - 1, layers, k] and checks
     it against the model config's layout (dense layers -1, k distinct experts per token);
  4. compares with t1jax on the same (exported, re-loaded) weights: JaxEngine's greedy ids, and,
     teacher-forced on SGLang's own ids, the log-probs (max |Δ|) and the expert sets per
     position and MoE layer (fraction identical);
  5. exports a second random model to another dir, POSTs /update_weights_from_disk with a
     weight_version, and checks that the server reports that version and now generates with the
     new weights (log-probs match the new model teacher-forced);
and prints a PASS/FAIL summary (exit 1 on FAIL). The server's log is in the temp dir printed.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path



def skip(msg: str) -> None:
    print(f"SKIP: {msg}")
    sys.exit(0)


def have_cuda_gpu() -> tuple[bool, str]:
    """Without importing torch or jax: nvidia-smi, else torch if it is installed."""
    smi = shutil.which("nvidia-smi")
    if smi:
        try:
            out = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=30)
            if out.returncode == 0 and "GPU" in out.stdout:
                return True, out.stdout.strip().splitlines()[0]
        except (OSError, subprocess.SubprocessError):
            pass
    if importlib.util.find_spec("torch") is not None:
        import torch
        if torch.cuda.is_available():
            return True, torch.cuda.get_device_name(0)
    return False, "no CUDA GPU (nvidia-smi finds none and torch.cuda is unavailable)"


# -- HTTP ------------------------------------------------------------------------------------

def http(url: str, payload: dict | None = None, timeout: float = 120.0):
    data = None if payload is None else json.dumps(payload).encode()
    req = urllib.request.Request(url, data=data, method="GET" if data is None else "POST",
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            body = resp.read().decode()
            status = resp.status
    except urllib.error.HTTPError as err:
        body, status = err.read().decode(errors="replace"), err.code
    try:
        return status, json.loads(body)
    except json.JSONDecodeError:
        return status, body


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def server_flags() -> str:
    out = subprocess.run([sys.executable, "-m", "sglang.launch_server", "--help"],
                         capture_output=True, text=True, timeout=300)
    return out.stdout + out.stderr


def pick(help_text: str, *spellings: str) -> str | None:
    for s in spellings:
        if s in help_text:
            return s
    return None


def wait_healthy(base: str, proc: subprocess.Popen, log: Path, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the server exited with {proc.returncode}; log tail:\n"
                               + log.read_text(errors="replace")[-4000:])
        try:
            status, _ = http(f"{base}/health", timeout=5)
            if status == 200:
                return
        except (OSError, urllib.error.URLError):
            pass
        time.sleep(2)
    raise RuntimeError(f"/health not ready after {timeout:.0f} s; log tail:\n"
                       + log.read_text(errors="replace")[-4000:])


def weight_version_of(base: str) -> str | None:
    for path in ("/model_info", "/get_weight_version", "/get_model_info", "/server_info"):
        try:
            status, info = http(f"{base}{path}", timeout=30)
        except (OSError, urllib.error.URLError):
            continue
        if status == 200:
            if isinstance(info, dict) and info.get("weight_version") is not None:
                return str(info["weight_version"])
            if isinstance(info, str) and info.strip():
                return info.strip().strip('"')
    return None


# -- the check -------------------------------------------------------------------------------

def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"],
                        help="the exported weights' and SGLang's dtype")
    parser.add_argument("--port", type=int, default=0, help="0: a free port")
    parser.add_argument("--prompt-len", type=int, default=24)
    parser.add_argument("--new", type=int, default=16)
    parser.add_argument("--startup-timeout", type=float, default=600.0)
    parser.add_argument("--keep", action="store_true", help="keep the temp dir")
    args = parser.parse_args()

    if importlib.util.find_spec("sglang") is None:
        skip("sglang not installed (pip install \"sglang[all]\" on a GPU host; see BUILD.md)")
    gpu, gpu_name = have_cuda_gpu()
    if not gpu:
        skip(gpu_name)

    import jax
    import jax.numpy as jnp
    import numpy as np
    from flax import nnx

    from configs.model.tiny import get_config
    from t1jax.model.config import model_config_from
    from t1jax.model.hf_io import export_hf, load_hf
    from t1jax.model.transformer import CausalLM
    from t1jax.rollout.engine import SamplingParams
    from t1jax.rollout.jax_engine import JaxEngine
    from t1jax.rollout.sglang import FleetClient, RouteLayout, launch_command
    from t1jax.rollout.tokenizer import train_tokenizer

    import sglang
    print(f"GPU: {gpu_name}; sglang {getattr(sglang, '__version__', '?')}; jax {jax.__version__} "
          f"({jax.default_backend()})")
    tol_logp = 5e-2 if args.dtype == "bfloat16" else 2e-3
    min_routes = 0.90 if args.dtype == "bfloat16" else 0.99

    cfg = model_config_from(get_config().model)
    tmp = Path(tempfile.mkdtemp(prefix="t1jax_sglang_check_"))
    print(f"work dir: {tmp}")
    tok = train_tokenizer(cfg.vocab_size)

    def export(seed: int, name: str):
        """A random model written as HF (in args.dtype), and the same weights read back."""
        path = export_hf(CausalLM(cfg, nnx.Rngs(seed)), tmp / name, dtype=args.dtype)
        tok.save(str(path / "tokenizer.json"))
        ours = load_hf(CausalLM(cfg, nnx.Rngs(seed)), path)  # bf16-rounded weights, as SGLang's
        return path, ours

    dir0, model0 = export(0, "weights_0")
    dir1, model1 = export(1, "weights_1")

    def teacher_forced(model, seq):
        """log_softmax rows and routes [len(seq), layers, k] of one full forward."""
        out = model(jnp.asarray([seq], jnp.int32))
        return (np.asarray(jax.nn.log_softmax(out.logits[0].astype(jnp.float32), axis=-1)),
                np.asarray(out.routes[0]))

    help_text = server_flags()
    routed_flag = pick(help_text, "--enable-return-routed-experts", "--return-routed-experts",
                       "--enable-routed-experts-capture")
    if routed_flag is None:
        print("FAIL: the installed sglang.launch_server --help lists no routed-experts flag")
        return 1
    port = args.port or free_port()
    base = f"http://127.0.0.1:{port}"
    # BUILD.md's launch line itself (t1jax.rollout.sglang.launch_command), nothing added: the
    # folder holds the weights in args.dtype, config.json and the tokenizer, as a publish does
    cmd = [sys.executable, *launch_command(dir0, port=port, host="127.0.0.1",
                                           routed_flag=routed_flag)]
    log = tmp / "server.log"
    print("launch:", " ".join(cmd))
    proc = subprocess.Popen(cmd, stdout=log.open("w"), stderr=subprocess.STDOUT,
                            start_new_session=True)
    checks: list[tuple[str, bool, str]] = []
    try:
        t = time.monotonic()
        wait_healthy(base, proc, log, args.startup_timeout)
        print(f"/health ok after {time.monotonic() - t:.0f} s")

        rng = np.random.default_rng(0)
        prompt = rng.integers(1, cfg.vocab_size, size=args.prompt_len).tolist()

        # the trainer's own request and parsing path (FleetClient: generate_body, the routes'
        # layout from the model config, their checks), which the CPU tests cover
        client = FleetClient([base], RouteLayout.of(cfg), timeout_s=300, retries=0)

        def generate(version_hint: str):
            res = client.generate(prompt, SamplingParams(temperature=0.0,
                                                         max_new_tokens=args.new),
                                  routing_key=f"gpu-check-{version_hint}")
            return (res.output_ids, np.asarray(res.output_logprobs), res.routed_experts,
                    {"weight_version": res.weight_version})

        def compare(model, ids, logp, routes, label):
            seq = prompt + ids
            ref_logp, ref_routes = teacher_forced(model, seq)
            n = len(prompt)
            want = np.array([ref_logp[n - 1 + i, t] for i, t in enumerate(ids)])
            dlogp = float(np.abs(logp - want).max())
            moe = list(cfg.moe_layers)
            ref = ref_routes[:len(seq) - 1]
            got = routes[:, moe]  # FleetClient checked [rows, layers, k]; dense layers are -1
            same = np.sort(got, axis=-1) == np.sort(ref[:, moe], axis=-1)
            frac = float(same.all(axis=-1).mean())
            print(f"{label}: {len(ids)} ids; max |Δlogprob| {dlogp:.2e} (tol {tol_logp:g}); "
                  f"identical expert sets {frac:.4f} of {same.shape[0]}x{same.shape[1]} "
                  f"(position, MoE layer) (min {min_routes}); routes shape {routes.shape}")
            return dlogp, frac

        # --- weights 0: ids, log-probs, routes ---
        ids, logp, routes, meta = generate("v0")
        engine = JaxEngine(model0, max_batch=1, max_len=128, prefill_buckets=(32, 64, 128))
        ours = engine.generate([prompt], SamplingParams(temperature=0.0,
                                                        max_new_tokens=args.new))[0]
        agree = float(np.mean([a == b for a, b in zip(ours.output_ids, ids)]))
        common = next((i for i, (a, b) in enumerate(zip(ours.output_ids, ids)) if a != b),
                      min(len(ids), len(ours.output_ids)))
        print(f"greedy ids: sglang {ids}\n            t1jax  {ours.output_ids}\n"
              f"            agree {agree:.3f} (identical prefix {common} of {len(ids)})")
        if common:
            d = float(np.abs(np.array(ours.output_logprobs[:common]) - logp[:common]).max())
            print(f"JaxEngine vs SGLang on the identical prefix: max |Δlogprob| {d:.2e}")
        dlogp, frac = compare(model0, ids, logp, routes, "weights_0 teacher-forced")
        checks.append(("routed_experts decoded to [prompt+output-1, layers, k]",
                       routes.shape[0] == len(prompt) + len(ids) - 1
                       and routes.shape[2] == cfg.num_experts_per_tok, str(routes.shape)))
        checks.append(("greedy ids (first 4) equal JaxEngine's", common >= min(4, len(ids)),
                       f"identical prefix {common}, agreement {agree:.3f}"))
        checks.append(("log-probs match t1jax", dlogp <= tol_logp, f"{dlogp:.2e}"))
        checks.append(("expert sets match t1jax", frac >= min_routes, f"{frac:.4f}"))

        # --- weight reload ---
        before = weight_version_of(base)
        status, resp = http(f"{base}/update_weights_from_disk",
                            {"model_path": str(dir1), "weight_version": "1"}, timeout=600)
        ok = status == 200 and (not isinstance(resp, dict) or resp.get("success", True))
        print(f"/update_weights_from_disk: HTTP {status}: {resp}")
        after = weight_version_of(base)
        ids1, logp1, routes1, meta1 = generate("v1")
        meta_version = meta1.get("weight_version")
        print(f"weight version: before {before!r}, after {after!r}, "
              f"meta_info.weight_version {meta_version!r}")
        checks.append(("update_weights_from_disk succeeded", ok, f"HTTP {status}"))
        checks.append(("server reports weight_version 1",
                       after == "1" or str(meta_version) == "1",
                       f"endpoint {after!r}, meta_info {meta_version!r}"))
        dlogp1, frac1 = compare(model1, ids1, logp1, routes1, "weights_1 teacher-forced")
        checks.append(("after reload, log-probs match the new weights", dlogp1 <= tol_logp,
                       f"{dlogp1:.2e}"))
        checks.append(("after reload, expert sets match the new weights", frac1 >= min_routes,
                       f"{frac1:.4f}"))
    except Exception as err:  # noqa: BLE001 - report any failure as FAIL with its cause
        checks.append(("ran to completion", False, f"{type(err).__name__}: {err}"))
    finally:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=30)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        if not args.keep and all(ok for _, ok, _ in checks):
            shutil.rmtree(tmp, ignore_errors=True)

    print("\nSUMMARY")
    for name, ok, detail in checks:
        print(f"  {'PASS' if ok else 'FAIL'}  {name}: {detail}")
    passed = all(ok for _, ok, _ in checks)
    print("PASS" if passed else f"FAIL (server log: {log})")
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
