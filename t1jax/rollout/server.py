"""A JaxEngine behind SGLang's native HTTP API (/generate, /update_weights_from_disk, /health,
/get_model_info), so the fleet client and the trainer treat our engine and SGLang alike.

Why: a fleet of rollout servers (failover, sticky routing, weight publishing) can be built and
tested on CPU with our own engine, and swapped for SGLang servers without changing the client.

How: `ThreadingHTTPServer` handles requests on threads; they hand their prompts to one batching
worker, which takes every request queued at that moment and runs them through a single
`engine.generate` call (continuous batching inside the engine). Weight updates take the same
lock as generation, so a batch never mixes weight versions.

Usage: python -m t1jax.rollout.server --model_path DIR --port N [--max_batch 8 --max_len 1024]
(DIR: a checkpoint written by `export_hf`).
"""

from __future__ import annotations

import argparse
import base64
import json
import queue
import threading
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np
from flax import nnx

from t1jax.model.config import ModelConfig
from t1jax.model.hf_io import load_hf
from t1jax.model.transformer import CausalLM
from t1jax.rollout.engine import FINISH_STOP, GenerateResult, SamplingParams
from t1jax.rollout.jax_engine import JaxEngine


class BadRequest(ValueError):
    """A client error (HTTP 400) naming the offending field."""

    def __init__(self, field: str, message: str):
        super().__init__(f"{field}: {message}")
        self.field = field


_SAMPLING_KEYS = {"temperature": float, "top_p": float, "top_k": int, "max_new_tokens": int}


def parse_sampling(d, field: str = "sampling_params") -> SamplingParams:
    """SGLang's sampling_params dict -> SamplingParams; unknown keys are rejected (a typo would
    otherwise silently sample with defaults)."""
    if not isinstance(d, dict):
        raise BadRequest(field, "must be an object")
    known = set(_SAMPLING_KEYS) | {"stop_token_ids", "sampling_seed"}
    for k in d:
        if k not in known:
            raise BadRequest(f"{field}.{k}", f"unsupported; supported: {sorted(known)}")
    kw = {}
    for k, typ in _SAMPLING_KEYS.items():
        if d.get(k) is not None:
            v = d[k]
            if isinstance(v, bool) or not isinstance(v, (int, float)) or \
                    (typ is int and v != int(v)):
                raise BadRequest(f"{field}.{k}", f"must be a number{' (integer)' * (typ is int)}")
            kw[k] = typ(v)
    stop = d.get("stop_token_ids") or []
    if not isinstance(stop, list) or not all(_is_int(t) for t in stop):
        raise BadRequest(f"{field}.stop_token_ids", "must be a list of integers")
    kw["stop_token_ids"] = tuple(stop)
    if d.get("sampling_seed") is not None:
        if not _is_int(d["sampling_seed"]):
            raise BadRequest(f"{field}.sampling_seed", "must be an integer")
        kw["seed"] = int(d["sampling_seed"])
    try:
        return SamplingParams(**kw)
    except ValueError as err:
        name = str(err).split(" ")[0]
        raise BadRequest(f"{field}.{name}", str(err)) from None


def _is_int(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def parse_generate(body, vocab_size: int):
    """(prompts, sampling list, batched?, return_logprob, return_routed_experts) from a body."""
    if not isinstance(body, dict):
        raise BadRequest("body", "must be a JSON object")
    ids = body.get("input_ids")
    if ids is None:
        raise BadRequest("input_ids", "is required (text input is not supported)")
    batched = isinstance(ids, list) and bool(ids) and isinstance(ids[0], list)
    prompts = ids if batched else [ids]
    for i, p in enumerate(prompts):
        if not isinstance(p, list) or not p or not all(_is_int(t) for t in p):
            raise BadRequest("input_ids", f"prompt {i} must be a non-empty list of integers")
        if min(p) < 0 or max(p) >= vocab_size:
            raise BadRequest("input_ids", f"prompt {i} has ids outside [0, {vocab_size})")
    sp = body.get("sampling_params", {})
    if isinstance(sp, list):
        if len(sp) != len(prompts):
            raise BadRequest("sampling_params", f"{len(sp)} entries for {len(prompts)} prompts")
        sampling = [parse_sampling(s, f"sampling_params[{i}]") for i, s in enumerate(sp)]
    else:
        sampling = [parse_sampling(sp)] * len(prompts)
    flags = []
    for k in ("return_logprob", "return_routed_experts"):
        if not isinstance(body.get(k, False), bool):
            raise BadRequest(k, "must be a boolean")
        flags.append(body.get(k, False))
    return prompts, sampling, batched, *flags


def to_response(prompt, res: GenerateResult, logprob: bool, routes: bool) -> dict:
    """One request's SGLang response dict."""
    finish = ({"type": "stop", "matched": res.output_ids[-1]} if res.finish_reason == FINISH_STOP
              else {"type": "length", "length": len(res.output_ids)})
    meta = {"id": uuid.uuid4().hex, "prompt_tokens": len(prompt),
            "completion_tokens": len(res.output_ids), "finish_reason": finish,
            "weight_version": res.weight_version}
    if logprob:
        meta["output_token_logprobs"] = [[float(lp), int(t), None]
                                         for lp, t in zip(res.output_logprobs, res.output_ids)]
    if routes:
        raw = np.ascontiguousarray(res.routed_experts, dtype="<i4").tobytes()
        meta["routed_experts"] = base64.b64encode(raw).decode("ascii")
    return {"text": "", "output_ids": list(res.output_ids), "meta_info": meta}


class _Job:
    def __init__(self, prompts, sampling):
        self.prompts, self.sampling = prompts, sampling
        self.done = threading.Event()
        self.results, self.error = None, None


class EngineService:
    """The engine behind one lock, fed by a batching worker thread."""

    def __init__(self, model_path: str, max_batch: int, max_len: int, weight_version: str = "0"):
        self.cfg = ModelConfig.from_pretrained(model_path)
        model = load_hf(nnx.eval_shape(lambda: CausalLM(self.cfg, nnx.Rngs(0))), model_path)
        buckets = tuple(sorted({min(32 << i, max_len) for i in range(24)}))  # 32 .. max_len
        self.engine = JaxEngine(model, max_batch=max_batch, max_len=max_len,
                                prefill_buckets=buckets, weight_version=weight_version)
        self.model_path = str(model_path)
        self.lock = threading.Lock()
        self.jobs: queue.Queue[_Job] = queue.Queue()
        threading.Thread(target=self._worker, daemon=True).start()

    def generate(self, prompts, sampling) -> list[GenerateResult]:
        job = _Job(prompts, sampling)
        self.jobs.put(job)
        job.done.wait()
        if job.error is not None:
            raise job.error
        return job.results

    def _worker(self):
        while True:
            jobs = [self.jobs.get()]
            while True:  # everything queued now joins this batch
                try:
                    jobs.append(self.jobs.get_nowait())
                except queue.Empty:
                    break
            prompts = [p for j in jobs for p in j.prompts]
            sampling = [s for j in jobs for s in j.sampling]
            try:
                with self.lock:
                    results = self.engine.generate(prompts, sampling)
            except Exception as err:  # noqa: BLE001 (a failing batch: retry its jobs alone)
                if len(jobs) > 1:
                    for j in jobs:
                        self._run_alone(j)
                    continue
                jobs[0].error = err
                jobs[0].done.set()
                continue
            for j in jobs:
                j.results, results = results[:len(j.prompts)], results[len(j.prompts):]
                j.done.set()

    def _run_alone(self, job: _Job):
        try:
            with self.lock:
                job.results = self.engine.generate(job.prompts, job.sampling)
        except Exception as err:  # noqa: BLE001 (reported to that request's client)
            job.error = err
        job.done.set()

    def update_weights(self, model_path: str, version: str | None) -> tuple[bool, str]:
        try:
            cfg = ModelConfig.from_pretrained(model_path)
        except (OSError, ValueError) as err:
            return False, f"cannot read config: {err}"
        if cfg.replace(param_dtype=self.cfg.param_dtype) != self.cfg:
            return False, f"{model_path}: config differs from the served model's"
        try:
            fresh = load_hf(nnx.eval_shape(lambda: CausalLM(cfg, nnx.Rngs(0))), model_path)
        except (OSError, KeyError, ValueError) as err:
            return False, f"cannot load weights: {err}"
        with self.lock:
            version = version if version is not None else self.engine.weight_version
            self.engine.load_weights(nnx.state(fresh, nnx.Param), version)
            self.model_path = str(model_path)
        return True, f"loaded {model_path} as weight_version {version}"

    def model_info(self) -> dict:
        return {"model_path": self.model_path, "tokenizer_path": None, "is_generation": True,
                "weight_version": self.engine.weight_version,
                "num_hidden_layers": self.cfg.num_hidden_layers,
                "num_experts_per_tok": self.cfg.num_experts_per_tok}


def make_handler(service: EngineService):
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args):  # quiet: one line per request would swamp logs
            pass

        def _send(self, code: int, obj) -> None:
            data = json.dumps(obj).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _body(self):
            n = int(self.headers.get("Content-Length") or 0)
            try:
                return json.loads(self.rfile.read(n) or b"null")
            except json.JSONDecodeError as err:
                raise BadRequest("body", f"invalid JSON: {err}") from None

        def do_GET(self):
            if self.path == "/health":
                self._send(200, {})
            elif self.path in ("/get_model_info", "/model_info"):  # SGLang has both
                self._send(200, service.model_info())
            else:
                self._send(404, {"error": f"no route {self.path}"})

        def do_POST(self):
            try:
                if self.path == "/generate":
                    self._generate()
                elif self.path == "/update_weights_from_disk":
                    self._update()
                else:
                    self._send(404, {"error": f"no route {self.path}"})
            except BadRequest as err:
                self._send(400, {"error": str(err), "field": err.field})

        def _generate(self):
            prompts, sampling, batched, logprob, routes = parse_generate(
                self._body(), service.cfg.vocab_size)
            try:
                results = service.generate(prompts, sampling)
            except ValueError as err:  # the engine's checks: prompt length / bucket
                raise BadRequest("input_ids", str(err)) from None
            out = [to_response(p, r, logprob, routes) for p, r in zip(prompts, results)]
            self._send(200, out if batched else out[0])

        def _update(self):
            body = self._body()
            if not isinstance(body, dict) or not isinstance(body.get("model_path"), str):
                raise BadRequest("model_path", "is required (a string)")
            version = body.get("weight_version")
            if version is not None and not isinstance(version, str):
                raise BadRequest("weight_version", "must be a string")
            ok, message = service.update_weights(body["model_path"], version)
            self._send(200 if ok else 400, {"success": ok, "message": message,
                                            "num_paused_requests": 0})

    return Handler


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model_path", required=True)
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--max_batch", type=int, default=8)
    ap.add_argument("--max_len", type=int, default=1024)
    ap.add_argument("--weight_version", default="0")
    args = ap.parse_args(argv)
    service = EngineService(args.model_path, args.max_batch, args.max_len, args.weight_version)
    server = ThreadingHTTPServer((args.host, args.port), make_handler(service))
    server.daemon_threads = True
    print(f"serving {args.model_path} on http://{args.host}:{args.port}", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
