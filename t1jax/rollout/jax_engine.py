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

Not done: admitting a prompt pauses the decoding rows for one [max_batch, bucket] prefill (no
chunked prefill, no mixing of prefill and decode in one call); stop ids are checked on the host
after every step; no prefix caching; no sharding of the cache or batch over a mesh.
"""

from __future__ import annotations

import collections
import functools

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from t1jax.model.cache import KVCache
from t1jax.model.transformer import CausalLM
from t1jax.rollout.engine import FINISH_LENGTH, FINISH_STOP, GenerateResult, SamplingParams


def sample(logits, temperature, top_k, top_p, seeds, steps):
    """Sample one id per row from float32 logits [B, V]; returns ids and their log-probs.

    Per row: temperature 0 is greedy (log-prob: log_softmax(logits) at T=1). Otherwise logits/T,
    keep the top_k (<= 0: all), then the smallest prefix of the sorted distribution whose mass
    reaches top_p (>= 1: all), renormalise, and draw with fold_in(PRNGKey(seed), step).
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
    return ids, jnp.where(greedy, greedy_logp, sampled_logp)


def _snapshot(model: nnx.Module):
    """The model's state in fresh Variables sharing its (immutable) arrays: nnx.state/split
    return live Variables, so without this an in-place update of the model (a train step)
    would silently change what the engine generates with while weight_version stayed put."""
    return jax.tree.map(lambda x: x, nnx.state(model))


@functools.partial(jax.jit, static_argnums=0, donate_argnums=2)
def _prefill(graphdef, state, cache, tokens, segment_ids, admit, last, sampling):
    """Reset the admitted rows' cache lengths, prefill them, sample at their last token."""
    cache = KVCache(cache.layers, jnp.where(admit, 0, cache.lengths))
    positions = jnp.broadcast_to(jnp.arange(tokens.shape[1], dtype=jnp.int32), tokens.shape)
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

    def __init__(self, index: int, prompt: list[int], params: SamplingParams, seed: int):
        self.index, self.prompt, self.params, self.seed = index, prompt, params, seed
        self.ids: list[int] = []
        self.logprobs: list[float] = []
        self.routes: list[np.ndarray] = []  # [n, layers, k] chunks, one per model call
        self.finish: str | None = None

    @property
    def length(self) -> int:
        """Tokens in the context: the prompt and every sampled id (the last one not yet fed)."""
        return len(self.prompt) + len(self.ids)


class JaxEngine:
    """Generates with a `CausalLM` on a KV cache of `max_batch` rows of `max_len` positions.

    It uses a snapshot of the model's weights taken at construction and at each
    `load_weights`; in-place updates to `model` are not seen until then.

    A request ends with "stop" when it samples one of its stop ids (included in output_ids),
    else with "length" after max_new_tokens or when prompt + output reaches max_len. A prompt
    must be shorter than max_len and fit the largest prefill bucket (buckets over max_len are
    clamped to it).
    """

    def __init__(self, model: CausalLM, *, max_batch: int = 8, max_len: int = 1024,
                 prefill_buckets: tuple[int, ...] = (32, 64, 128, 256, 512, 1024),
                 weight_version: str = "0"):
        self.model, self.cfg = model, model.model.cfg
        self.max_batch, self.max_len = max_batch, max_len
        self.buckets = tuple(sorted({min(int(b), max_len) for b in prefill_buckets}))
        self.weight_version = weight_version
        self._graphdef = nnx.graphdef(model)
        self._state = _snapshot(model)
        self._seed_rng = np.random.default_rng()
        self._prefill, self._decode = _prefill, _decode  # shared: same structure, same compiles

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
        return tuple(jnp.asarray(a) for a in (temp, top_k, top_p, seeds, steps))

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
                 sampling: SamplingParams | list[SamplingParams]) -> list[GenerateResult]:
        """Generate for every prompt (any number: they queue for slots); results in order."""
        if isinstance(sampling, SamplingParams):
            sampling = [sampling] * len(prompts)
        if len(sampling) != len(prompts):
            raise ValueError(f"{len(prompts)} prompts but {len(sampling)} SamplingParams")
        waiting = collections.deque()
        for i, (prompt, params) in enumerate(zip(prompts, sampling)):
            prompt = [int(t) for t in prompt]
            if not 0 < len(prompt) < self.max_len:
                raise ValueError(f"prompt {i} has {len(prompt)} tokens; need 1..{self.max_len - 1}")
            self._bucket(len(prompt))
            seed = (self._seed_rng.integers(2**32) if params.seed is None
                    else params.seed % 2**32)
            waiting.append(_Request(i, prompt, params, int(seed)))
        results: list[GenerateResult | None] = [None] * len(prompts)
        slots: list[_Request | None] = [None] * self.max_batch
        cache = KVCache.create(self.cfg, self.max_batch, self.max_len)
        while waiting or any(slots):
            free = [i for i, r in enumerate(slots) if r is None]
            if waiting and free:
                admitted = []
                for i in free[:len(waiting)]:
                    slots[i] = waiting.popleft()
                    admitted.append(i)
                cache = self._prefill_step(cache, slots, admitted)
            else:
                cache = self._decode_step(cache, slots)
            for i, r in enumerate(slots):
                if r is not None and r.finish is not None:
                    results[r.index] = self._result(r)
                    slots[i] = None
        return results

    def _prefill_step(self, cache, slots, admitted):
        width = self._bucket(max(len(slots[i].prompt) for i in admitted))
        b = self.max_batch
        tokens, seg = np.zeros((b, width), np.int32), np.zeros((b, width), np.int32)
        admit, last = np.zeros(b, bool), np.zeros(b, np.int32)
        for i in admitted:
            n = len(slots[i].prompt)
            tokens[i, :n], seg[i, :n], admit[i], last[i] = slots[i].prompt, 1, True, n - 1
        sampling = self._sampling_arrays(slots)
        ids, logp, routes, cache = self._prefill(
            self._graphdef, self._state, cache, jnp.asarray(tokens), jnp.asarray(seg),
            jnp.asarray(admit), jnp.asarray(last), sampling)
        ids, logp, routes = np.asarray(ids), np.asarray(logp), np.asarray(routes)
        for i in admitted:
            n = len(slots[i].prompt)
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
        nnx.update(self.model, params_state)
        self._state = _snapshot(self.model)  # same graphdef and shapes: nothing recompiles
        self.weight_version = str(version)
