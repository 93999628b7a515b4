"""A resumable, seeded epoch sampler over a task pool.

Why: the pool is materialised in quality-rank order (index i is rank i), so reading it in
order would feed the best tasks first every epoch and make the reward curve an artefact of
the ranking. Each epoch is instead a fresh permutation drawn from ``default_rng([seed,
epoch])``: reproducible from (seed, epoch) alone, so a checkpointed run resumes on exactly
the index it would have drawn next, and the saved state is four JSON integers.
"""

from __future__ import annotations

import numpy as np

_STATE_KEYS = ("epoch", "position", "seed", "num_items")


def _is_int(v) -> bool:  # bool is an int subclass; never accept it as a count
    return isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_))


class EpochSampler:
    """Yields pool indices forever, epoch by epoch, each epoch a permutation of range(num_items).

    ``position`` counts the indices already drawn in ``epoch``; it rolls over to the next
    epoch as soon as one is complete, so it is always in [0, num_items).
    """

    def __init__(self, num_items: int, seed: int):
        if not _is_int(num_items) or num_items < 1:
            raise ValueError(f"num_items must be an integer >= 1, got {num_items!r}")
        if not _is_int(seed) or seed < 0:
            raise ValueError(f"seed must be an integer >= 0, got {seed!r}")
        self.num_items, self.seed = int(num_items), int(seed)
        self.epoch, self.position = 0, 0
        self._order: np.ndarray | None = None
        self._order_epoch = -1

    def epoch_order(self, epoch: int) -> np.ndarray:
        """The permutation used for ``epoch``; a pure function of (seed, epoch, num_items)."""
        return np.random.default_rng([self.seed, int(epoch)]).permutation(self.num_items)

    def __iter__(self) -> "EpochSampler":
        return self

    def __next__(self) -> int:
        if self._order_epoch != self.epoch:
            self._order, self._order_epoch = self.epoch_order(self.epoch), self.epoch
        index = int(self._order[self.position])
        self.position += 1
        if self.position == self.num_items:
            self.epoch, self.position = self.epoch + 1, 0
        return index

    def take(self, n: int) -> list[int]:
        """The next ``n`` indices (may span epochs)."""
        return [next(self) for _ in range(n)]

    def state_dict(self) -> dict:
        """JSON-serialisable state: save it with the trainer's checkpoint."""
        return {"epoch": self.epoch, "position": self.position,
                "seed": self.seed, "num_items": self.num_items}

    def load_state_dict(self, state: dict) -> None:
        """Resume from ``state_dict()``; refuses a state saved for another pool size or seed,
        since resuming it would silently draw a different sequence."""
        if not isinstance(state, dict):
            raise ValueError(f"sampler state must be a dict, got {type(state).__name__}")
        missing = [k for k in _STATE_KEYS if k not in state]
        if missing:
            raise ValueError(f"sampler state is missing {missing}; expected keys {_STATE_KEYS}")
        bad = [k for k in _STATE_KEYS if not _is_int(state[k])]
        if bad:
            raise ValueError(f"sampler state fields {bad} must be integers, got "
                             + ", ".join(f"{k}={state[k]!r}" for k in bad))
        if state["num_items"] != self.num_items:
            raise ValueError(f"sampler state is for a pool of {state['num_items']} items, but this "
                             f"sampler has {self.num_items}; the pool changed since the checkpoint")
        if state["seed"] != self.seed:
            raise ValueError(f"sampler state was saved with seed {state['seed']}, but this sampler "
                             f"has seed {self.seed}; resuming would draw a different sequence")
        epoch, position = int(state["epoch"]), int(state["position"])
        if epoch < 0 or not 0 <= position <= self.num_items:
            raise ValueError(f"sampler state out of range: epoch={epoch} (want >= 0), "
                             f"position={position} (want 0..{self.num_items})")
        if position == self.num_items:  # a completed epoch: same as the start of the next
            epoch, position = epoch + 1, 0
        self.epoch, self.position = epoch, position
