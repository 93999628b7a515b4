"""A batched, KV-cached generator for `CausalLM` on JAX, implementing the `Engine` contract.

Why: RL rollouts need log-probs and expert routes from the exact model being trained, with no
separate inference server (CPU tests, TPU runs without SGLang).

How: `max_batch` cache rows ("slots"). Waiting prompts are admitted into free slots by a prefill
of shape [max_batch, bucket] (right padding and the rows not admitted are segment 0, so they are
not written and keep their cache); then every busy slot decodes one token per step (idle slots
are segment 0). A slot whose request finishes is freed and refilled by the next prefill:
continuous batching. Shapes are fixed per bucket, so the prefill compiles once per bucket used
and the decode step once (per model structure and engine size: engines share the compiles).
Sampling (float32, per-row temperature / top-k / top-p / seed) runs inside the same jitted
calls; the host sees only the sampled ids, their log-probs and routes, once per step.

Sessions (prefix reuse across the turns of one episode): the cache persists across `generate`
calls. A request given a session id leaves its row behind when it finishes, with the tokens whose
keys it holds and their routes. A later request of that session, if the row is still resident,
keeps the longest common prefix of its prompt and those tokens and prefills only the rest, at
positions continuing from there; the kept routes are prepended, so results are the same as with
a full prefill. Rows are evicted least recently used when a slot is needed (unretained slots
go first), and all at `load_weights` (their keys came from the old weights). With linear-
attention layers (Qwen3.5) a row's recurrent state covers all of its tokens and cannot be cut
back, so a row is reused only when the prompt extends every token it holds (the multi-turn
case: previous prompt + output + the new observation); otherwise the prompt is prefilled whole.

Not done: admitting a prompt pauses the decoding rows for one [max_batch, bucket] prefill (no
chunked prefill, no mixing of prefill and decode in one call); stop ids are checked on the host
after every step; prefixes are reused only within a session's own row (no sharing between rows,
no radix tree); no sharding of the cache or batch over a mesh.
"""

from __future__ import annotations

import collections
import functools
import threading

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from t1jax.model.cache import KVCache
from t1jax.model.transformer import CausalLM
from t1jax.rollout.engine import FINISH_LENGTH, FINISH_STOP, GenerateResult, SamplingParams


def sample(logits, temperature, top_k, top_p, seeds, steps, full=None):
    """Sample one id per row from float32 logits [B, V]; returns ids and their log-probs.

    Per row: temperature 0 is greedy (log-prob: log_softmax(logits) at T=1). Otherwise logits/T,
    keep the top_k (<= 0: all), then the smallest prefix of the sorted distribution whose mass
    reaches top_p (>= 1: all), renormalise, and draw with fold_in(PRNGKey(seed), step).
    The log-prob is that of the renormalised distribution drawn from, or where `full` (a bool
    per row) log_softmax(logits / T) over the whole vocabulary: SGLang's and the trainer's.
    """
    logits = logits.astype(jnp.float32)
    greedy = temperature <= 0
    scaled = logits / jnp.where(greedy, 1.0, temperature)[:, None]
    order = jnp.argsort(-scaled, axis=-1)
    sorted_logits = jnp.take_along_axis(scaled, order, axis=-1)
    rank = jnp.arange(logits.shape[-1])[None, :]
    keep = (top_k[:, None] <= 0) | (rank < top_k[:, None])
    sorted_logits = jnp.where(keep, sorted_logits, -jnp.inf)
    probs = jax.nn.softmax(sorted_logits, axis=-1)
    mass_before = jnp.cumsum(probs, axis=-1) - probs
    keep &= (top_p[:, None] >= 1.0) | (mass_before < top_p[:, None])
    sorted_logp = jax.nn.log_softmax(jnp.where(keep, sorted_logits, -jnp.inf), axis=-1)
    keys = jax.vmap(lambda s, t: jax.random.fold_in(jax.random.PRNGKey(s), t))(seeds, steps)
    pick = jax.vmap(jax.random.categorical)(keys, sorted_logp)
    sampled_ids = jnp.take_along_axis(order, pick[:, None], axis=-1)[:, 0]
    sampled_logp = jnp.take_along_axis(sorted_logp, pick[:, None], axis=-1)[:, 0]
    greedy_ids = jnp.argmax(logits, axis=-1)
    greedy_logp = jnp.take_along_axis(jax.nn.log_softmax(logits, axis=-1),
                                      greedy_ids[:, None], axis=-1)[:, 0]
    ids = jnp.where(greedy, greedy_ids, sampled_ids).astype(jnp.int32)
    logp = jnp.where(greedy, greedy_logp, sampled_logp)
    if full is not None:
        whole = jnp.take_along_axis(jax.nn.log_softmax(scaled, axis=-1), ids[:, None],
                                    axis=-1)[:, 0]
        logp = jnp.where(full, whole, logp)
    return ids, logp


def _snapshot(model: nnx.Module):
    """The model's state in fresh Variables sharing its (immutable) arrays: nnx.state/split
    return live Variables, so without this an in-place update of the model (a train step)
    would silently change what the engine generates with while weight_version stayed put."""
    return jax.tree.map(lambda x: x, nnx.state(model))


@functools.partial(jax.jit, static_argnums=0, donate_argnums=2)
def _prefill(graphdef, state, cache, tokens, segment_ids, admit, starts, last, sampling):
    """Cut the admitted rows' caches to `starts` (the reused prefix; 0 for a full prefill),
    prefill their tokens at positions starts.., sample at their last token."""
    cache = KVCache(cache.layers, jnp.where(admit, starts, cache.lengths))
    positions = starts[:, None] + jnp.arange(tokens.shape[1], dtype=jnp.int32)[None, :]
    out = nnx.merge(graphdef, state)(tokens, positions, segment_ids, cache=cache)
    logits = jnp.take_along_axis(out.logits, last[:, None, None], axis=1)[:, 0]
    ids, logp = sample(logits, *sampling)
    return ids, logp, out.routes, out.cache


@functools.partial(jax.jit, static_argnums=0, donate_argnums=2)
def _decode(graphdef, state, cache, tokens, positions, active, sampling):
    """One token for every active row at its own position; idle rows are padding."""
    out = nnx.merge(graphdef, state)(tokens[:, None], positions[:, None],
                                     active[:, None].astype(jnp.int32), cache=cache)
    ids, logp = sample(out.logits[:, 0], *sampling)
    return ids, logp, out.routes[:, 0], out.cache


class _Request:
    """Host-side state of one request while it occupies a slot."""

    def __init__(self, index: int, prompt: list[int], params: SamplingParams, seed: int,
                 session: str | None = None):
        self.index, self.prompt, self.params, self.seed = index, prompt, params, seed
        self.session = session
        self.start = 0  # prompt tokens whose keys a retained row already holds
        self.ids: list[int] = []
        self.logprobs: list[float] = []
        self.routes: list[np.ndarray] = []  # [n, layers, k] chunks, one per model call
        self.finish: str | None = None

    @property
    def length(self) -> int:
        """Tokens in the context: the prompt and every sampled id (the last one not yet fed)."""
        return len(self.prompt) + len(self.ids)


class _Retained:
    """What a finished session left in its row: the tokens whose keys the row holds (prompt and
    output but the last output id, never fed) and their routes [len(tokens), layers, k]."""

    def __init__(self, session: str, tokens: np.ndarray, routes: np.ndarray, used: int):
        self.session, self.tokens, self.routes, self.used = session, tokens, routes, used


class JaxEngine:
    """Generates with a `CausalLM` on a KV cache of `max_batch` rows of `max_len` positions.

    It uses a snapshot of the model's weights taken at construction and at each
    `load_weights`; in-place updates to `model` are not seen until then.

    logprobs: "full" (default; SGLang's and the trainer's semantics, see GenerateResult) or
    "truncated" (the renormalised top-k / top-p distribution drawn from).

    A request ends with "stop" when it samples one of its stop ids (included in output_ids),
    else with "length" after max_new_tokens or when prompt + output reaches max_len. A prompt
    must be shorter than max_len and fit the largest prefill bucket (buckets over max_len are
    clamped to it).

    `stats` counts session_hits / session_misses (requests with a session id that did / did not
    reuse a retained row), reused_tokens (prompt tokens not prefilled thanks to one) and
    prefilled_tokens (prompt tokens run through a prefill, all requests).
    """

    takes_sessions = True

    def __init__(self, model: CausalLM, *, max_batch: int = 8, max_len: int = 1024,
                 prefill_buckets: tuple[int, ...] = (32, 64, 128, 256, 512, 1024),
                 weight_version: str = "0", logprobs: str = "full"):
        if logprobs not in ("full", "truncated"):
            raise ValueError(f"logprobs={logprobs!r}; choose full or truncated")
        self.logprobs = logprobs
        self.model, self.cfg = model, model.model.cfg
        self.max_batch, self.max_len = max_batch, max_len
        self.buckets = tuple(sorted({min(int(b), max_len) for b in prefill_buckets}))
        self.weight_version = weight_version
        self._graphdef = nnx.graphdef(model)
        self._state = _snapshot(model)
        self._seed_rng = np.random.default_rng()
        self._prefill, self._decode = _prefill, _decode  # shared: same structure, same compiles
        self._lock = threading.Lock()  # the cache and retained rows are shared by calls
        self._cache: KVCache | None = None  # persists across calls (retained rows)
        self._clear_sessions()
        self.stats = {"session_hits": 0, "session_misses": 0, "reused_tokens": 0,
                      "prefilled_tokens": 0}

    def drop_sessions(self) -> None:
        """Forget every retained row and free the cache (e.g. before a train step needs the
        memory); later requests of those sessions prefill in full."""
        with self._lock:
            self._cache = None
            self._clear_sessions()

    def _clear_sessions(self) -> None:
        self._retained: list[_Retained | None] = [None] * self.max_batch
        self._session_slot: dict[str, int] = {}
        self._clock = 0

    # -- host loop -------------------------------------------------------------------------------

    def _sampling_arrays(self, slots: list[_Request | None]):
        b = self.max_batch
        temp, top_p = np.zeros(b, np.float32), np.ones(b, np.float32)
        top_k, seeds, steps = np.zeros(b, np.int32), np.zeros(b, np.uint32), np.zeros(b, np.int32)
        for i, r in enumerate(slots):
            if r is not None:
                p = r.params
                temp[i], top_p[i], top_k[i] = p.temperature, p.top_p, p.top_k
                seeds[i], steps[i] = r.seed, len(r.ids)
        full = np.full(b, self.logprobs == "full")
        return tuple(jnp.asarray(a) for a in (temp, top_k, top_p, seeds, steps, full))

    def _bucket(self, n: int) -> int:
        for b in self.buckets:
            if b >= n:
                return b
        raise ValueError(f"prompt of {n} tokens exceeds the largest prefill bucket "
                         f"{self.buckets[-1]}")

    def _accept(self, r: _Request, token: int, logp: float, routes: np.ndarray) -> None:
        """Record one sampled token (and the routes of the positions that produced it)."""
        r.routes.append(routes)
        r.ids.append(token)
        r.logprobs.append(logp)
        if token in r.params.stop_token_ids:
            r.finish = FINISH_STOP
        elif len(r.ids) >= r.params.max_new_tokens or r.length >= self.max_len:
            r.finish = FINISH_LENGTH

    def _result(self, r: _Request) -> GenerateResult:
        routes = np.concatenate(r.routes, axis=0).astype(np.int32)
        assert routes.shape[0] == r.length - 1, (routes.shape, r.length)
        return GenerateResult(r.ids, r.logprobs, routes, r.finish, self.weight_version)

    def generate(self, prompts: list[list[int]],
                 sampling: SamplingParams | list[SamplingParams], *,
                 session_ids: list[str | None] | None = None) -> list[GenerateResult]:
        """Generate for every prompt (any number: they queue for slots); results in order.

        session_ids (optional, one per prompt, None for none): reuse and leave behind the
        session's cache row, see the module docstring. Results do not depend on it."""
        if isinstance(sampling, SamplingParams):
            sampling = [sampling] * len(prompts)
        if len(sampling) != len(prompts):
            raise ValueError(f"{len(prompts)} prompts but {len(sampling)} SamplingParams")
        if session_ids is None:
            session_ids = [None] * len(prompts)
        if len(session_ids) != len(prompts):
            raise ValueError(f"{len(prompts)} prompts but {len(session_ids)} session_ids")
        waiting = collections.deque()
        for i, (prompt, params, session) in enumerate(zip(prompts, sampling, session_ids)):
            prompt = [int(t) for t in prompt]
            if not 0 < len(prompt) < self.max_len:
                raise ValueError(f"prompt {i} has {len(prompt)} tokens; need 1..{self.max_len - 1}")
            self._bucket(len(prompt))
            seed = (self._seed_rng.integers(2**32) if params.seed is None
                    else params.seed % 2**32)
            waiting.append(_Request(i, prompt, params, int(seed),
                                    None if session is None else str(session)))
        with self._lock:
            try:
                return self._run(waiting, len(prompts))
            except BaseException:
                self._cache = None  # may have been donated mid-step: start clean next time
                self._clear_sessions()
                raise

    def _run(self, waiting: collections.deque, n: int) -> list[GenerateResult]:
        results: list[GenerateResult | None] = [None] * n
        slots: list[_Request | None] = [None] * self.max_batch
        if self._cache is None:
            self._cache = KVCache.create(self.cfg, self.max_batch, self.max_len)
        pending = collections.Counter(r.session for r in waiting if r.session is not None)
        while waiting or any(slots):
            free = [i for i, r in enumerate(slots) if r is None]
            if waiting and free:
                admitted = []
                for _ in range(min(len(free), len(waiting))):
                    r = waiting.popleft()
                    if r.session is not None:
                        pending[r.session] -= 1
                    i = self._take_slot(r, free, pending)
                    free.remove(i)
                    slots[i] = r
                    admitted.append(i)
                self._cache = self._prefill_step(self._cache, slots, admitted)
            else:
                self._cache = self._decode_step(self._cache, slots)
            for i, r in enumerate(slots):
                if r is not None and r.finish is not None:
                    results[r.index] = self._result(r)
                    if r.session is not None:
                        self._retain(i, r, results[r.index].routed_experts.copy())
                    slots[i] = None
        if not self._session_slot:
            self._cache = None  # nothing retained: free the cache between calls, as before
        return results

    def _take_slot(self, r: _Request, free: list[int], pending: collections.Counter) -> int:
        """The slot for `r`: its session's retained row if resident (setting r.start to the
        reusable prefix), else a free slot: unretained first, then rows no waiting request's
        session wants, least recently used first. The slot's retained row is dropped."""
        slot = self._session_slot.get(r.session) if r.session is not None else None
        if slot is not None and slot in free:
            kept = self._retained[slot]
            m = min(len(kept.tokens), len(r.prompt) - 1)  # >= 1 token left to prefill
            same = kept.tokens[:m] == np.asarray(r.prompt[:m], np.int32)
            r.start = int(m if same.all() else np.argmin(same))
            if self.cfg.linear_layers and r.start != len(kept.tokens):
                r.start = 0  # a recurrent state cannot be cut back to a shorter prefix
        if r.session is not None:
            hit = r.start > 0
            self.stats["session_hits" if hit else "session_misses"] += 1
            self.stats["reused_tokens"] += r.start
        if r.start == 0:
            def rank(i):
                kept = self._retained[i]
                if kept is None:
                    return (0, 0)
                return (1 + (pending[kept.session] > 0), kept.used)
            slot = min(free, key=rank)
        kept = self._retained[slot]
        if kept is not None:
            if r.start > 0:
                r.routes.append(kept.routes[:r.start])
            self._retained[slot] = None
            del self._session_slot[kept.session]
        return slot

    def _retain(self, slot: int, r: _Request, routes: np.ndarray) -> None:
        """Leave r's row behind for its session (replacing what the session kept elsewhere)."""
        old = self._session_slot.pop(r.session, None)
        if old is not None:
            self._retained[old] = None
        tokens = np.asarray((r.prompt + r.ids)[:r.length - 1], np.int32)
        self._clock += 1
        self._retained[slot] = _Retained(r.session, tokens, routes, self._clock)
        self._session_slot[r.session] = slot

    def _prefill_step(self, cache, slots, admitted):
        """Prefill each admitted row's prompt from its start (0, or the reused prefix)."""
        width = self._bucket(max(len(slots[i].prompt) - slots[i].start for i in admitted))
        b = self.max_batch
        tokens, seg = np.zeros((b, width), np.int32), np.zeros((b, width), np.int32)
        admit, starts, last = np.zeros(b, bool), np.zeros(b, np.int32), np.zeros(b, np.int32)
        for i in admitted:
            r = slots[i]
            n = len(r.prompt) - r.start
            tokens[i, :n], seg[i, :n], admit[i] = r.prompt[r.start:], 1, True
            starts[i], last[i] = r.start, n - 1
            self.stats["prefilled_tokens"] += n
        sampling = self._sampling_arrays(slots)
        ids, logp, routes, cache = self._prefill(
            self._graphdef, self._state, cache, jnp.asarray(tokens), jnp.asarray(seg),
            jnp.asarray(admit), jnp.asarray(starts), jnp.asarray(last), sampling)
        ids, logp, routes = np.asarray(ids), np.asarray(logp), np.asarray(routes)
        for i in admitted:
            n = len(slots[i].prompt) - slots[i].start
            self._accept(slots[i], int(ids[i]), float(logp[i]), routes[i, :n])
        return cache

    def _decode_step(self, cache, slots):
        b = self.max_batch
        tokens, positions, active = np.zeros(b, np.int32), np.zeros(b, np.int32), np.zeros(b, bool)
        for i, r in enumerate(slots):
            if r is not None:
                tokens[i], positions[i], active[i] = r.ids[-1], r.length - 1, True
        sampling = self._sampling_arrays(slots)
        ids, logp, routes, cache = self._decode(
            self._graphdef, self._state, cache, jnp.asarray(tokens), jnp.asarray(positions),
            jnp.asarray(active), sampling)
        ids, logp, routes = np.asarray(ids), np.asarray(logp), np.asarray(routes)
        for i, r in enumerate(slots):
            if r is not None:
                self._accept(r, int(ids[i]), float(logp[i]), routes[i][None])
        return cache

    # -- weights ---------------------------------------------------------------------------------

    def load_weights(self, params_state, version: str) -> None:
        """Write `params_state` (an nnx.State such as nnx.state(policy, nnx.Param)) into the
        engine's model and generate with it from now on, tagged `version`."""
        with self._lock:
            nnx.update(self.model, params_state)
            self._state = _snapshot(self.model)  # same graphdef and shapes: nothing recompiles
            self.weight_version = str(version)
            self._cache = None
            self._clear_sessions()  # retained keys came from the old weights
