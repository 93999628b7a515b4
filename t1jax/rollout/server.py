"""A JaxEngine behind SGLang's native HTTP API (/generate, /update_weights_from_disk, /health,
/model_info, /server_info (and their deprecated /get_ paths), /flush_cache, /pause_generation,
/continue_generation), so the fleet client and the trainer treat our engine and SGLang alike.

SGLang's semantics, emulated (SGLang 0.5.23; paths under sglang/srt/): the model's
eos_token_id (config.json) ends a sample as stop_token_ids do, and `ignore_eos` disables both
(managers/schedule_batch.py:1856-1858, Req._check_token_based_finish); log-probs are
log_softmax(logits / T) over the whole vocabulary, before top-k / top-p (layers/sampler.py:275,
293-316; an all-greedy batch: log_softmax(logits), 208-223); `rid` is echoed as meta_info.id;
routed_experts is base64 int32 over positions [routed_experts_start_len, prompt + output - 1)
(state_capturer/base.py:173-188); an aborted request answers FINISH_ABORT.to_json()
(schedule_batch.py:332-345); /flush_cache answers plain text (entrypoints/http_server.py:
1025-1040), /pause_generation and /continue_generation {"message", "status": "ok"}
(1831-1854). The reply's shape is checked against SGLang's own GenerateResponse contract
(tests/rollout/test_sglang_contract.py). What we cannot honour (stop strings: no tokenizer in the
server; n > 1; input log-probs; streaming; penalties, grammars) is refused with a 400 naming
the field, never ignored.

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
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from flax import nnx

from t1jax.model.config import ModelConfig
from t1jax.model.hf_io import load_hf
from t1jax.model.transformer import CausalLM
from t1jax.rollout.engine import GenerateResult
from t1jax.rollout.jax_engine import JaxEngine
from t1jax.rollout.sglang_protocol import (BadRequest, aborted_response, parse_generate,
                                           to_response)


class _Job:
    def __init__(self, prompts, sampling, session_ids=None):
        self.prompts, self.sampling = prompts, sampling
        self.session_ids = session_ids or [None] * len(prompts)
        self.done = threading.Event()
        self.results, self.error = None, None


class EngineService:
    """The engine behind one lock, fed by a batching worker thread."""

    def __init__(self, model_path: str, max_batch: int, max_len: int, weight_version: str = "0"):
        self.cfg = ModelConfig.from_pretrained(model_path)
        model = load_hf(nnx.eval_shape(lambda: CausalLM(self.cfg, nnx.Rngs(0))), model_path)
        buckets = tuple(sorted({min(32 << i, max_len) for i in range(24)}))  # 32 .. max_len
        self.engine = JaxEngine(model, max_batch=max_batch, max_len=max_len,
                                prefill_buckets=buckets, weight_version=weight_version,
                                logprobs="full")  # SGLang's semantics
        eos = self.cfg.eos_token_id
        self.eos_ids = () if eos is None else (eos,) if isinstance(eos, int) else tuple(eos)
        self.model_path = str(model_path)
        self.lock = threading.Lock()  # the engine: one batch or one weight load at a time
        self._cv = threading.Condition()  # guards the queue and the paused flag
        self._queue: list[_Job] = []
        self.paused = False  # set by /pause_generation, cleared by /continue_generation
        self.route_rows = {"route_rows_sent": 0, "route_rows_whole": 0}
        threading.Thread(target=self._worker, daemon=True).start()

    def generate(self, prompts, sampling, session_ids=None) -> list[GenerateResult | None]:
        """Results in order; None for a request aborted by /pause_generation(mode=abort)."""
        job = _Job(prompts, sampling, session_ids)
        with self._cv:
            self._queue.append(job)
            self._cv.notify_all()
        job.done.wait()
        if job.error is not None:
            raise job.error
        return job.results

    def pause(self, mode: str) -> None:
        """Start no new batch until `resume`; the running batch finishes (our engine cannot stop
        one mid-way, so in_place and retract behave alike). abort: every queued request is
        answered with finish_reason abort at once (the client retries it elsewhere)."""
        with self._cv:
            self.paused = True
            if mode == "abort":
                for job in self._queue:
                    job.results = [None] * len(job.prompts)
                    job.done.set()
                self._queue = []

    def resume(self) -> None:
        with self._cv:
            self.paused = False
            self._cv.notify_all()

    def flush_cache(self) -> None:
        with self.lock:
            self.engine.drop_sessions()

    def _worker(self):
        while True:
            with self._cv:  # everything queued when not paused joins one batch
                while self.paused or not self._queue:
                    self._cv.wait()
                jobs, self._queue = self._queue, []
            prompts = [p for j in jobs for p in j.prompts]
            sampling = [s for j in jobs for s in j.sampling]
            sessions = [s for j in jobs for s in j.session_ids]
            try:
                with self.lock:
                    results = self.engine.generate(prompts, sampling, session_ids=sessions)
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
                job.results = self.engine.generate(job.prompts, job.sampling,
                                                   session_ids=job.session_ids)
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
                "weight_version": self.engine.weight_version}

    def server_info(self) -> dict:
        """SGLang's /server_info carries server args and internal states; ours, the engine's
        counters (requests run, session prefix hits, route rows sent) that tests and operators
        read, and that seeds are honoured (SGLang's enable_deterministic_inference)."""
        return {"model_path": self.model_path, "weight_version": self.engine.weight_version,
                # a seed gives the same sample whatever else shares the batch (JaxEngine)
                "enable_deterministic_inference": True,
                "internal_states": [{**self.engine.stats, **self.route_rows}]}

    def count_routes(self, prompt_len: int, result: GenerateResult, start: int) -> None:
        """Route rows sent, and what whole-sequence routes would have sent (the wire cost a
        multi-turn trial saves by asking only for new positions: routed_experts_start_len)."""
        whole = prompt_len + len(result.output_ids) - 1
        with self._cv:
            self.route_rows["route_rows_sent"] += whole - start
            self.route_rows["route_rows_whole"] += whole


def make_handler(service: EngineService):
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args):  # quiet: one line per request would swamp logs
            pass

        def _reply(self, code: int, data: bytes, content_type: str) -> None:
            self.send_response(code)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _send(self, code: int, obj) -> None:
            self._reply(code, json.dumps(obj).encode(), "application/json")

        def _body(self):
            if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
                raw = self._read_chunked()  # what smg forwards past its buffer limit
            else:
                raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            try:
                return json.loads(raw or b"null")
            except json.JSONDecodeError as err:
                raise BadRequest("body", f"invalid JSON: {err}") from None

        def _read_chunked(self) -> bytes:
            parts = []
            while True:
                line = self.rfile.readline(1 << 16).split(b";")[0].strip()
                try:
                    size = int(line, 16)
                except ValueError:
                    raise BadRequest("body", f"bad chunk size {line[:20]!r}") from None
                if size == 0:
                    while self.rfile.readline(1 << 16).strip():  # trailers, then the blank line
                        pass
                    return b"".join(parts)
                parts.append(self.rfile.read(size))
                self.rfile.readline(8)  # the CRLF after each chunk

        def _send_text(self, code: int, text: str) -> None:
            self._reply(code, text.encode(), "text/plain")

        def do_GET(self):
            if self.path.split("?")[0] == "/flush_cache":
                self._flush()
            elif self.path == "/health":
                self._send(200, {})
            elif self.path in ("/get_model_info", "/model_info"):  # SGLang has both
                self._send(200, service.model_info())
            elif self.path in ("/get_server_info", "/server_info"):
                self._send(200, service.server_info())
            else:
                self._send(404, {"error": f"no route {self.path}"})

        def do_POST(self):
            try:
                if self.path == "/generate":
                    self._generate()
                elif self.path == "/update_weights_from_disk":
                    self._update()
                elif self.path.split("?")[0] == "/flush_cache":
                    self._flush()
                elif self.path == "/pause_generation":
                    body = self._body() or {}
                    mode = body.get("mode", "abort") if isinstance(body, dict) else None
                    if mode not in ("abort", "retract", "in_place"):
                        raise BadRequest("mode", "must be abort, retract or in_place")
                    service.pause(mode)
                    self._send(200, {"message": "Generation paused successfully.",
                                     "status": "ok"})
                elif self.path == "/continue_generation":
                    self._body()
                    service.resume()
                    self._send(200, {"message": "Generation continued successfully.",
                                     "status": "ok"})
                else:
                    self._send(404, {"error": f"no route {self.path}"})
            except BadRequest as err:
                self._send(400, {"error": str(err), "field": err.field})

        def _flush(self):
            service.flush_cache()
            self._send_text(200, "Cache flushed.\n")

        def _generate(self):
            body = self._body()
            prompts, sampling, batched, logprob, routes, opts = parse_generate(
                body, service.cfg.vocab_size, service.eos_ids)
            rids = opts["rids"] or [None] * len(prompts)
            key = body.get("routing_key") or self.headers.get("X-SMG-Routing-Key")
            try:  # a routing key is an episode: its turns reuse one cache row (prefix reuse)
                results = service.generate(prompts, sampling, [key] * len(prompts))
            except ValueError as err:  # the engine's checks: prompt length / bucket
                raise BadRequest("input_ids", str(err)) from None
            start = opts["routed_experts_start_len"]
            out = [to_response(p, r, logprob, routes, rid, start)
                   if r is not None else aborted_response(p, rid)
                   for p, r, rid in zip(prompts, results, rids)]
            for p, r in zip(prompts, results):
                if routes and r is not None:
                    service.count_routes(len(p), r, start)
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
