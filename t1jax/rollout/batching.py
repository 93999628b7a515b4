"""Coalesce concurrent generate calls into batched ones.

Why: an embedded JaxEngine serves one generate call at a time (it owns one KV cache), so trials
on a thread pool that each call it with one prompt would decode one after another; merged, they
decode together in one continuous batch.
"""

from __future__ import annotations

import threading
import time


class BatchingEngine:
    """Coalesces concurrent single-prompt `generate` calls into one batched call of the wrapped
    engine (an embedded JaxEngine decodes them together instead of one after another)."""

    def __init__(self, engine, window_s: float = 0.005):
        self.engine, self.window_s = engine, window_s
        self.max_len = getattr(engine, "max_len", 32768)
        self.weight_version = getattr(engine, "weight_version", "")
        self._cv = threading.Condition()
        self._queue: list[dict] = []
        self._busy = False
        self.calls = 0  # batched calls made (for tests / stats)

    @property
    def takes_sessions(self) -> bool:
        return getattr(self.engine, "takes_sessions", False)

    @property
    def logprobs(self) -> str:
        return getattr(self.engine, "logprobs", "full")

    def generate(self, prompts, sampling, *, session_ids=None):
        params = sampling if isinstance(sampling, (list, tuple)) else [sampling] * len(prompts)
        sessions = session_ids or [None] * len(prompts)
        items = [{"prompt": list(p), "params": s, "session": sid, "done": False}
                 for p, s, sid in zip(prompts, params, sessions)]
        with self._cv:
            self._queue += items  # atomically: one batch takes all of a call's items or none
            while True:
                if all(it["done"] for it in items):
                    return self._collect(items)
                if not self._busy:  # become the leader; our items are still queued
                    self._busy = True
                    break
                self._cv.wait()
        batch = []
        try:
            time.sleep(self.window_s)  # let the other trials' calls of this moment join
            with self._cv:
                batch, self._queue = self._queue, []
            try:
                kw = ({"session_ids": [b["session"] for b in batch]} if self.takes_sessions
                      else {})
                results = self.engine.generate([b["prompt"] for b in batch],
                                               [b["params"] for b in batch], **kw)
                self.calls += 1
                for b, r in zip(batch, results):
                    b["result"] = r
            except BaseException as err:  # noqa: BLE001 - every caller in the batch sees it
                for b in batch:
                    b["error"] = err
        finally:
            with self._cv:
                for b in batch:
                    b["done"] = True
                self._busy = False
                self._cv.notify_all()
        return self._collect(items)

    @staticmethod
    def _collect(items):
        for it in items:
            if "error" in it:
                raise it["error"]
        return [it["result"] for it in items]

    def load_weights(self, params_state, version: str) -> None:
        self.engine.load_weights(params_state, version)
        self.weight_version = getattr(self.engine, "weight_version", version)


def embedded_engine(model, *, max_batch: int, max_len: int, weight_version: str = "0"):
    """The in-process JaxEngine as concurrent trials share it: prefill buckets in powers of two
    up to max_len (any prompt that fits the context has a bucket), calls merged into batches."""
    from t1jax.rollout.sample import bucket_lengths
    from t1jax.rollout.jax_engine import JaxEngine
    return BatchingEngine(JaxEngine(model, max_batch=max_batch, max_len=max_len,
                                    prefill_buckets=tuple(bucket_lengths(64, max_len)),
                                    weight_version=weight_version))
