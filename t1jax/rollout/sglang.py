"""A client for a fleet of SGLang-API generation servers (SGLang itself, or our
`t1jax.rollout.server`), returning the `Engine` contract's `GenerateResult`.

Why: RL rollouts run for hours against several servers; one dying must cost a retry, not a
corrupted batch. So a request is only ever accepted whole (a complete, validated response) and a
failed one is re-issued whole to another server: a sample is never partial or duplicated.

Routing: rendezvous hashing of the routing key (e.g. an episode id) over the live servers, so a
multi-turn episode keeps hitting one server (its prefix cache) and only the keys of a dead server
move. The key is also sent as SGLang's `routing_key` field and the `X-SMG-Routing-Key` header for
an SGLang model gateway in front.

Routes: their shape and which layers are dense come from the model's own config (the HF
config.json the trainer loads), never from the server: real SGLang's /model_info reports
neither, and it reports dense layers' routes as expert 0. Every route is checked (range, k
distinct experts per token) before it can be replayed: an all-zero capture from a server started
without --enable-return-routed-experts, or one overwritten by a draft model, is an error naming
the server and the request, not a silent replay.

Log-probs: SGLang returns log_softmax(logits / T) over the whole vocabulary (greedy: T = 1),
without top-k/top-p renormalisation (sglang/srt/layers/sampler.py, Sampler.forward, the
"Standard path": `logprobs = torch.log(probs)` of softmax(logits / T), before truncation). That
is what the trainer recomputes; the JaxEngine matches it with logprobs="full".
"""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import http.client
import json
import logging
import socket
import threading
import urllib.parse
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

from t1jax.rollout.engine import GenerateResult, SamplingParams

_FAILOVER = (ConnectionError, socket.timeout, TimeoutError, http.client.HTTPException, OSError,
             json.JSONDecodeError)


class RolloutError(RuntimeError):
    """A generation or weight publish that cannot succeed (bad request, bad response, no
    server left)."""


class _ServerError(Exception):
    """A 5xx or unreadable response: the server, not the request, is at fault (fail over)."""


def _sampling_dict(p: SamplingParams) -> dict:
    """SGLang's sampling_params. Never ignore_eos: in SGLang it also disables stop_token_ids
    (schedule_batch.py, Req._check_token_based_finish returns at once). top_k <= 0 (no
    truncation, ours) is sent as -1: SGLang's sampling_params.verify refuses 0 with a 400."""
    d = {"temperature": p.temperature, "top_p": p.top_p, "top_k": p.top_k if p.top_k > 0 else -1,
         "max_new_tokens": p.max_new_tokens, "stop_token_ids": list(p.stop_token_ids)}
    if p.seed is not None:
        d["sampling_seed"] = p.seed
    return d


def generate_body(prompt_ids, sampling: SamplingParams, routing_key: str | None = None,
                  rid: str | None = None) -> dict:
    """The /generate body FleetClient sends (SGLang's GenerateReqInput fields). Routes only
    from sampling.routes_from on (routed_experts_start_len): the positions a trial does not
    hold yet. SGLang aborts a request whose start is past the prompt, so that is refused
    here, by name."""
    if sampling.routes_from > len(prompt_ids):
        raise RolloutError(f"routes_from={sampling.routes_from} is past the prompt's "
                           f"{len(prompt_ids)} tokens (SGLang's routed_experts_start_len must "
                           "be at most the prompt's length)")
    body = {"input_ids": [int(t) for t in prompt_ids], "sampling_params": _sampling_dict(sampling),
            "return_logprob": True, "return_routed_experts": True,
            "rid": rid or uuid.uuid4().hex}
    if sampling.routes_from:
        body["routed_experts_start_len"] = int(sampling.routes_from)
    if routing_key is not None:
        body["routing_key"] = str(routing_key)
    return body


def launch_command(model_path, *, port: int = 30000, host: str = "0.0.0.0", tp: int = 1,
                   routed_flag: str = "--enable-return-routed-experts") -> list[str]:
    """The SGLang server launch line BUILD.md documents, as argv after `python`: routes captured
    for R3 and seeds honoured (--enable-deterministic-inference: without it SGLang ignores
    sampling_seed), on a model folder as publish_weights writes it (weights, config.json and the
    model's tokenizer files: SGLang loads the tokenizer from it). experiments/gpu_checks runs
    exactly this, so a GPU day checks what users are told to run."""
    return ["-m", "sglang.launch_server", "--model-path", str(model_path), routed_flag,
            "--enable-deterministic-inference", "--host", host, "--port", str(port),
            "--tp", str(tp)]


@dataclasses.dataclass(frozen=True)
class RouteLayout:
    """What a routed_experts capture must look like for one model: [*, layers, k] with experts
    in [0, num_experts) and k distinct per token on MoE layers; dense layers are masked to -1."""
    layers: int
    k: int
    num_experts: int
    dense_layers: tuple[int, ...] = ()

    @classmethod
    def of(cls, cfg) -> "RouteLayout":
        """From a t1jax ModelConfig (the HF config.json the trainer loads)."""
        return cls(cfg.num_hidden_layers, cfg.num_experts_per_tok, cfg.num_experts,
                   tuple(i for i in range(cfg.num_hidden_layers) if not cfg.is_moe_layer(i)))

    def check(self, routes: np.ndarray, where: str) -> np.ndarray:
        """routes [rows, layers, k] with dense layers set to -1; RolloutError if a MoE layer's
        route is out of range or repeats an expert within a token."""
        routes = routes.astype(np.int32, copy=True)
        routes[:, list(self.dense_layers), :] = -1
        moe = [i for i in range(self.layers) if i not in self.dense_layers]
        if not moe or not len(routes):
            return routes
        r = routes[:, moe, :]
        bad = (r < 0) | (r >= self.num_experts)
        if bad.any():
            p, layer, j = np.argwhere(bad)[0]
            raise RolloutError(f"{where}: routed_experts has expert {int(r[p, layer, j])} "
                               f"at position {int(p)}, layer {moe[layer]} (the model has "
                               f"{self.num_experts} experts)")
        ordered = np.sort(r, axis=-1)
        dup = (ordered[..., 1:] == ordered[..., :-1]).any(-1)
        if dup.any():
            n = int(dup.any(-1).sum())
            p, layer = np.argwhere(dup)[0]
            raise RolloutError(
                f"{where}: routed_experts repeats an expert within a token at {n} of {len(r)} "
                f"positions (first: position {int(p)}, layer {moe[layer]}: "
                f"{r[p, layer].tolist()}); k={self.k} distinct experts are routed per token. "
                "Is the server started with --enable-return-routed-experts, and without a draft "
                "model writing the same capture?")
        return routes


class FleetClient:
    """Sticky, failing-over generation over `urls` (e.g. ["http://127.0.0.1:30000", ...]).

    router: an SGLang model gateway in front of `urls` (smg >= 1.13 with --policy
    consistent_hashing: it forwards return_routed_experts and routes by X-SMG-Routing-Key).
    Generation then goes through it, which picks the worker and fails over; weights are still
    published to, and confirmed by, every worker in `urls` directly.

    timeout_s: per HTTP call; retries: extra attempts (on other live servers, then on any) after
    a connection error, timeout, 5xx, incomplete response or an aborted request (finish_reason
    "abort": the server was paused, restarted or out of memory). A 4xx is the request's fault
    and raises `RolloutError` at once. layout: the served model's RouteLayout (from its
    config: `RouteLayout.of(ModelConfig.from_pretrained(path))`).
    """

    def __init__(self, urls: list[str], layout: RouteLayout, *, timeout_s: float = 300.0,
                 retries: int = 2, router: str | None = None):
        if not urls:
            raise ValueError("FleetClient needs at least one server url")
        if not isinstance(layout, RouteLayout):
            raise TypeError("FleetClient needs the model's RouteLayout (RouteLayout.of(cfg))")
        self.router = router.rstrip("/") if router else None
        self.urls = [u.rstrip("/") for u in urls]
        self.timeout_s, self.retries = timeout_s, retries
        self.layout = layout
        self.live = set(self.urls)
        self.served = {u: 0 for u in self.urls}  # completed generate calls per server
        self.published: tuple[Path, str] | None = None  # (checkpoint, version) last published
        self.failures: list[tuple[str, str]] = []  # (server, error type) of failed attempts
        self._lock = threading.Lock()
        self._seed_checked: set[str] = set()  # servers asked whether they honour seeds
        self._seed_lock = threading.Lock()
        # a publish in progress aborts in-flight requests: they wait for it, then go again
        self._publishing, self._published = threading.Event(), threading.Event()
        self._published.set()
        self.reissued = 0  # requests a publish aborted, sent again once it was over

    # -- HTTP --------------------------------------------------------------------------------

    def _call(self, url: str, method: str, path: str, body=None, headers=None,
              timeout: float | None = None):
        """(status, parsed JSON); raises a _FAILOVER error or _ServerError on server faults."""
        u = urllib.parse.urlsplit(url)
        conn = http.client.HTTPConnection(u.hostname, u.port or 80,
                                          timeout=timeout or self.timeout_s)
        try:
            data = None if body is None else json.dumps(body).encode()
            conn.request(method, path, body=data, headers={
                "Content-Type": "application/json", **(headers or {})})
            resp = conn.getresponse()
            raw = resp.read()  # raises IncompleteRead on a cut-off body
            if resp.status >= 500:
                raise _ServerError(f"{url}{path}: HTTP {resp.status}: {raw[:200]!r}")
            return resp.status, json.loads(raw) if raw else None
        finally:
            conn.close()

    def _mark_dead(self, url: str, err: BaseException | None = None) -> None:
        with self._lock:
            if err is not None:
                self.failures.append((url, type(err).__name__))
            self.live.discard(url)

    def health_check(self) -> list[str]:
        """Probe every server's /health; returns (and remembers) the live ones. A server coming
        back (restarted) is first brought to the last published weights, else left out."""
        def probe(url):
            try:
                ok = self._call(url, "GET", "/health", timeout=min(self.timeout_s, 5.0))[0] == 200
            except (_ServerError, *_FAILOVER):
                return False
            if ok and url not in self.live and self.published is not None:
                return self._push(url, *self.published) is None
            return ok
        with ThreadPoolExecutor(len(self.urls)) as ex:
            ok = list(ex.map(probe, self.urls))
        with self._lock:
            self.live = {u for u, good in zip(self.urls, ok) if good}
        return [u for u in self.urls if u in self.live]

    # -- routing -----------------------------------------------------------------------------

    def ranking(self, routing_key: str | None) -> list[str]:
        """Servers in preference order for a key: rendezvous hashing (a dead server's keys move,
        the others' stay). No key: a random order."""
        if routing_key is None:
            return list(np.random.default_rng().permutation(self.urls))
        score = lambda u: hashlib.sha256(f"{routing_key}|{u}".encode()).digest()  # noqa: E731
        return sorted(self.urls, key=score)

    def server_for(self, routing_key: str | None) -> str:
        """The live server a request with this key goes to first."""
        live = [u for u in self.ranking(routing_key) if u in self.live]
        return live[0] if live else self.ranking(routing_key)[0]

    # -- generate ----------------------------------------------------------------------------

    def generate(self, prompt_ids: list[int], sampling: SamplingParams,
                 routing_key: str | None = None) -> GenerateResult:
        """One complete sample, from the key's server or (after a failure) another one."""
        if sampling.seed is not None and len(self._seed_checked) < len(self.urls):
            with self._seed_lock:
                self.check_seeds_honoured()
        errors = []
        while len(errors) <= self.retries:  # a request our own publish aborted is no failure
            attempt = len(errors)
            rid = f"{uuid.uuid4().hex}-{attempt}"  # a retry is a new request
            key = routing_key
            if self.router and errors and key is not None:
                # the router would send the retry to the same sticky worker (a frozen one holds
                # it until the router's own timeout): this one request goes elsewhere
                key = f"{routing_key}#retry{attempt}"
            headers = {} if key is None else {"X-SMG-Routing-Key": str(key)}
            body = generate_body(prompt_ids, sampling, key, rid)
            if self.router:  # it picks the worker by the key header and fails over itself
                url = self.router
            else:
                ranked = self.ranking(routing_key)
                live = [u for u in ranked if u in self.live]
                if not live:  # everything looked dead: look again before giving up
                    live = [u for u in ranked if u in self.health_check()] or ranked
                url = live[0]  # a failed server was marked dead: the next one in rank
            try:
                status, resp = self._call(url, "POST", "/generate", body, headers)
            except (_ServerError, *_FAILOVER) as err:
                errors.append((url, err))
                if url != self.router:
                    self._mark_dead(url, err)
                continue
            if status != 200:
                raise RolloutError(f"{url}/generate rejected the request {rid}: HTTP {status}: "
                                   f"{resp}")
            finish = ((resp or {}).get("meta_info") or {}).get("finish_reason") or {}
            if isinstance(finish, dict) and finish.get("type") == "abort":
                if self._publishing.is_set():  # our publish aborted it: again on the new weights
                    with self._lock:
                        self.reissued += 1
                    self._published.wait()
                    continue
                err = _ServerError(f"{url}/generate aborted request {rid}: "
                                   f"{finish.get('message', '')}")
                errors.append((url, err))
                if url != self.router:  # health_check brings it back when it serves again
                    self._mark_dead(url, err)
                continue
            result = self._parse(f"{url} (request {rid})", prompt_ids, sampling, resp)
            with self._lock:
                self.served[url] = self.served.get(url, 0) + 1
            return result
        raise RolloutError(f"generate failed after {len(errors)} attempts: "
                           + "; ".join(f"{u}: {type(e).__name__}: {e}" for u, e in errors))

    def generate_many(self, prompts: list[list[int]],
                      sampling: SamplingParams | list[SamplingParams],
                      routing_keys: list[str | None] | None = None,
                      max_workers: int = 16) -> list[GenerateResult]:
        """`generate` for every prompt on concurrent threads (the servers batch them)."""
        sampling = [sampling] * len(prompts) if isinstance(sampling, SamplingParams) else sampling
        keys = routing_keys or [None] * len(prompts)
        with ThreadPoolExecutor(max(1, min(max_workers, len(prompts)))) as ex:
            return list(ex.map(self.generate, prompts, sampling, keys))

    def _parse(self, url, prompt_ids, sampling, resp) -> GenerateResult:
        """A validated GenerateResult; anything inconsistent raises RolloutError."""
        try:
            ids, meta = [int(t) for t in resp["output_ids"]], resp["meta_info"]
            logprobs = [float(x[0]) for x in meta["output_token_logprobs"]]
            lp_ids = [int(x[1]) for x in meta["output_token_logprobs"]]
            finish = meta["finish_reason"]["type"]
            raw = base64.b64decode(meta["routed_experts"])
        except KeyError as err:
            if err.args and err.args[0] == "routed_experts":
                raise RolloutError(
                    f"{url}: the /generate response has no meta_info.routed_experts although "
                    "the request set return_routed_experts: a router in front that drops the "
                    "field (sglang-router <= 0.3.2 does; smg 1.13 forwards it), or a server "
                    "started without --enable-return-routed-experts. Upgrade the router, or "
                    "point the fleet at the workers themselves (FleetClient routes sticky by "
                    "itself)") from None
            raise RolloutError(f"{url}: malformed /generate response ({err!r})") from None
        except (TypeError, ValueError, IndexError) as err:
            raise RolloutError(f"{url}: malformed /generate response ({err!r})") from None
        if lp_ids != ids or meta.get("completion_tokens", len(ids)) != len(ids) or not ids:
            raise RolloutError(f"{url}: output_ids, logprobs and completion_tokens disagree")
        if len(ids) > sampling.max_new_tokens:
            raise RolloutError(f"{url}: {len(ids)} tokens > max_new_tokens")
        layers, k = self.layout.layers, self.layout.k
        start = sampling.routes_from  # SGLang's reply does not echo it: what was asked for
        rows = len(prompt_ids) + len(ids) - 1 - start
        routes = np.frombuffer(raw, dtype="<i4")
        if routes.size != rows * layers * k:
            raise RolloutError(f"{url}: routed_experts has {routes.size} entries, expected "
                               f"[{rows}, {layers}, {k}] = {rows * layers * k} (positions "
                               f"{start} .. {len(prompt_ids) + len(ids) - 1}; layers and k "
                               "from the model's config)")
        routes = self.layout.check(routes.reshape(rows, layers, k), url)
        return GenerateResult(ids, logprobs, routes, finish, str(meta.get("weight_version", "")),
                              routes_start=start)

    # -- weights -----------------------------------------------------------------------------

    def _info(self, url: str, name: str) -> dict:
        """GET /<name> (SGLang >= 0.5.23; its /get_<name> warns on every call that it is
        deprecated), or /get_<name> from a server that lacks the new path."""
        for path in (f"/{name}", f"/get_{name}"):
            status, info = self._call(url, "GET", path, timeout=min(self.timeout_s, 30.0))
            if status != 404:
                break
        if status != 200:
            raise RolloutError(f"{url}{path}: HTTP {status}: {info}")
        return info

    def model_info(self, url: str) -> dict:
        return self._info(url, "model_info")

    def server_info(self, url: str) -> dict:
        return self._info(url, "server_info")

    def check_seeds_honoured(self) -> list[str]:
        """The servers that would ignore sampling_seed, each warned about once: SGLang honours
        it only when started with --enable-deterministic-inference, and a seeded run that is
        not seeded repeats nothing. Unreachable servers are skipped (asked again next time)."""
        ignoring = []
        for url in self.urls:
            if url in self._seed_checked:
                continue
            try:
                info = self.server_info(url)
            except (RolloutError, _ServerError, *_FAILOVER):
                continue
            self._seed_checked.add(url)
            if not info.get("enable_deterministic_inference", False):
                ignoring.append(url)
                logging.warning(
                    "%s does not report enable_deterministic_inference: it ignores "
                    "sampling_seed, so seeded trials are not seeded and a rerun will not "
                    "repeat. Start SGLang with --enable-deterministic-inference", url)
        return ignoring

    def publish_weights(self, model, shared_dir, version: str) -> Path:
        """export_hf(model) to <shared_dir>/weights_<version>, then load_weights. Returns the
        checkpoint dir."""
        from t1jax.model.hf_io import export_hf
        version = str(version)
        return self.load_weights(export_hf(model, Path(shared_dir) / f"weights_{version}"),
                                 version)

    def load_weights(self, path, version: str) -> Path:
        """Load the HF checkpoint `path` (on a disk the servers share) on every live server and
        confirm each reports `version`; raises RolloutError naming the servers that did not
        (dead ones are skipped: `health_check` first; those that failed are marked dead)."""
        path, version = Path(path).resolve(), str(version)
        live = self.health_check()
        if not live:
            raise RolloutError("publish_weights: no live server")
        self._published.clear()
        self._publishing.set()
        try:
            with ThreadPoolExecutor(len(live)) as ex:
                failed = [e for e in ex.map(lambda u: self._push(u, path, version, pause=True),
                                            live) if e]
            self.published = (path, version)  # also what a server coming back is given
        finally:
            self._publishing.clear()
            self._published.set()
        if failed:
            raise RolloutError(f"publish_weights({version}) not confirmed by: " + "; ".join(failed))
        return path

    def confirmed(self, path, version: str, urls) -> None:
        """What a load_weights elsewhere (another process's client) did: `urls` serve `path` as
        `version`; the other servers are out until a health_check brings them to it."""
        with self._lock:
            self.published = (Path(path).resolve(), str(version))
            self.live = set(urls) & set(self.urls)

    def _push(self, url: str, path: Path, version: str, pause: bool = False) -> str | None:
        """Load the checkpoint on one server and confirm its version; None, or what failed.
        pause: first /pause_generation with mode abort, so the reload waits for no generation
        in flight (SGLang's otherwise waits for all of them: a long one holds the publish up to
        the timeout); the requests it aborts are re-issued by their clients once the publish
        is over (this client's wait for it: `generate`), whole, on the new weights, never
        resumed across versions; /continue_generation afterwards, whatever happened."""
        error = None
        paused = False
        try:
            if pause:
                paused = self._call(url, "POST", "/pause_generation", {"mode": "abort"})[0] == 200
            status, resp = self._call(url, "POST", "/update_weights_from_disk",
                                      {"model_path": str(path), "weight_version": version})
            if status != 200 or not (resp or {}).get("success"):
                error = f"{url}: update failed: {resp}"
            elif (got := self.model_info(url).get("weight_version")) != version:
                error = f"{url}: reports weight_version {got!r}"
        except (_ServerError, RolloutError, *_FAILOVER) as err:
            error = f"{url}: {type(err).__name__}: {err}"
        finally:
            if paused:
                try:
                    self._call(url, "POST", "/continue_generation", {})
                except (_ServerError, *_FAILOVER) as err:
                    error = error or f"{url}: continue_generation: {type(err).__name__}: {err}"
        if error:  # stale weights must not serve samples: out until a health_check syncs it
            self._mark_dead(url)
        return error


class FleetEngine:
    """A FleetClient (SGLang or t1jax servers) behind the Engine protocol the agent uses; a
    trial's session id is its routing key (one server, whose prefix cache holds its turns)."""

    takes_sessions = True
    logprobs = "full"  # SGLang's: log_softmax(logits / T) over the vocabulary (BUILD.md)

    def __init__(self, client, max_len: int):
        self.client, self.max_len = client, max_len

    def generate(self, prompts, sampling, *, session_ids=None):
        return self.client.generate_many(prompts, sampling, routing_keys=session_ids)
