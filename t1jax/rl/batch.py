"""Samples → padded, packed arrays of a few fixed shapes, so compiled steps are reused.

Layout (all [rows, length], token-indexed): `loss_mask[t]` is 1 where token t was sampled, and
its log-probability comes from the logits at t-1; `rewards[t]` holds a trial's reward on its last
sampled token; `routes[t]` is the expert set the rollout used when token t was the model's
input. Several samples share a row (first-fit decreasing); `segment_ids` keeps attention inside
one chunk (a trial split by context compaction is several chunks, positions restarting in each),
`trial_ids` tells GAE where one trial ends, so credit flows across a trial's chunks but never
between trials.

A trial longer than a row is split at chunk boundaries into pieces, each in a row of its own
(whole chunks only: a chunk never straddles rows). `continues_at` links every token of a piece
to the flat index (row * length + column) of the next piece's first sampled token, where GAE
picks up the bootstrap value and the next piece's advantage (ppo.gae): the advantages are
exactly those of the trial in one row, however it was split.

Nothing that trains is truncated: a sample longer than the largest bucket is an error naming
its task (or, with overlong="drop", left out and counted in `Packed.dropped`). Only the tail
after a sample's last sampled token (observation glue no loss ever reads) is left out.
"""

from __future__ import annotations

import dataclasses
import zlib

import jax
import numpy as np


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Batch:
    tokens: np.ndarray  # int32 [B, L]
    positions: np.ndarray  # int32 [B, L], restart at 0 in every chunk
    segment_ids: np.ndarray  # int32 [B, L], 0 = padding, one id per chunk in a row
    trial_ids: np.ndarray  # int32 [B, L], 0 = padding, one id per trial in a row
    loss_mask: np.ndarray  # float32 [B, L], 1 on sampled ids
    rollout_logprobs: np.ndarray  # float32 [B, L]
    routes: np.ndarray  # int32 [B, L, layers, k], -1 = not recorded
    rewards: np.ndarray  # float32 [B, L], the trial's reward on its last sampled id
    continues_at: np.ndarray  # int32 [B, L], -1, or where the trial's next piece starts
    stale: np.ndarray  # float32 [B, L], 1 on trials a policy older than the trained one sampled

    @property
    def shape(self) -> tuple[int, int]:
        return tuple(self.tokens.shape)


@dataclasses.dataclass
class Packed:
    batch: Batch
    placements: list[tuple[int, int, int, int]]  # (sample index, row, start, end) per piece
    dropped: list[tuple[int, str]]  # (sample index, why) for overlong="drop"
    fixed_chunk_starts: int  # chunk-first tokens whose mask was 1 (cannot be predicted): zeroed
    piece_starts: list[int] = dataclasses.field(default_factory=list)  # per placement: where
    #                                         its piece starts in the sample (0 unless split)
    # with pack(routes_rows=...): the rows batch.routes holds, in order (this process's own)
    routes_rows: list[int] | None = None


class OverlongSample(ValueError):
    pass


def pick_bucket(n: int, buckets) -> int:
    for b in sorted(buckets):
        if n <= b:
            return b
    raise OverlongSample(f"{n} tokens exceed the largest bucket {max(buckets)}")


def _round_rows(n: int, multiple: int) -> int:
    """Rows rounded up to multiple * a power of two, so few distinct shapes ever compile."""
    groups = max(1, -(-n // multiple))
    return multiple * (1 << (groups - 1).bit_length())


def _end_after_sampled(mask) -> int:
    """Length up to and including the last sampled id (all of it when none is sampled)."""
    sampled = np.flatnonzero(mask)
    return int(sampled[-1]) + 1 if len(sampled) else len(mask)


def _used_length(sample) -> int:
    """Tokens up to the last sampled one: a tail of observation glue after it carries no loss,
    no reward and no value target, so it is not packed (and never makes a sample overlong)."""
    return _end_after_sampled(sample.loss_mask)


def _pieces(sample, limit: int) -> list[tuple[int, int]] | str:
    """[(start, end)] of a sample in consecutive runs of whole chunks, each at most `limit`
    tokens (one piece if the sample fits), each cut after its last sampled id; or why not."""
    n = _used_length(sample)
    if n <= limit:
        return [(0, n)]
    bounds = [int(c) for c in sample.chunk_starts if c < n] + [n]
    if len(bounds) == 2:
        return f"has {n} tokens in one chunk"
    pieces, start = [], 0
    for c0, c1 in zip(bounds[:-1], bounds[1:]):
        if c1 - c0 > limit:
            return f"has a chunk of {c1 - c0} tokens (tokens {c0}:{c1})"
        if c1 - start > limit:
            pieces.append((start, c0))
            start = c0
    pieces.append((start, n))
    return [(a, a + _end_after_sampled(sample.loss_mask[a:b])) for a, b in pieces]


REWARDS = ("dense", "binary", "shuffled", "zero")


def trained_reward(sample, reward: str = "dense") -> float:
    """The scalar the trainer optimises: T1's dense reward (passed assertions on the pool's fixed
    scale), or the binary outcome (1 if the verifier says solved) for the single-axis ablation,
    or 0 for every trial (the zero-reward control: whatever PPO then does to the held-out rate
    is drift from the critic's baseline and the optimizer, not a signal). ("shuffled" is a
    property of a batch: see shuffled_rewards.)"""
    if reward in ("dense", "shuffled"):
        return sample.reward
    if reward == "zero":
        return 0.0
    if reward == "binary":
        return float(bool((sample.metadata.get("verifier") or {}).get("solved", False)))
    raise ValueError(f"reward must be one of {REWARDS}, got {reward!r}")


def is_stale(sample, version: int | None) -> bool:
    """Whether weights older than `version` (the policy being trained) sampled any turn of
    the trial: one-step-off's trials, and carried-over ones. Versions that are not step numbers
    (a recording made elsewhere, an oracle) count as current."""
    if version is None:
        return False
    return any(int(v) < version for v in sample.metadata.get("weight_versions") or []
               if str(v).lstrip("-").isdigit())


def shuffled_rewards(samples) -> list[float]:
    """The control of a reward ablation: the batch's dense rewards permuted over its trials,
    so a step is as large as with real rewards but says nothing about what was done. A policy
    that falls as much under it as under the real reward falls from optimizer drift, not from
    what the reward teaches. Seeded by the trials' ids: a rerun permutes alike."""
    key = "/".join(f"{s.metadata.get('task_id')}:{s.metadata.get('attempt')}" for s in samples)
    order = np.random.default_rng(zlib.crc32(key.encode())).permutation(len(samples))
    return [float(samples[k].reward) for k in order]


BASELINES = ("none", "task")


def task_baseline(samples, rewards: list[float]) -> list[float]:
    """Rewards minus a per-task baseline: the mean reward of the batch's other trials of the
    same task (leave-one-out, so it does not depend on the trial's own actions and the policy
    gradient stays unbiased; RLOO, Ahmadian et al. 2024). A task tried once in the batch is
    measured against the mean of all other trials. Why: at small scale the critic cannot learn
    what each task is worth, so without this the advantage mostly says which task a trial
    was, not how well it was done (docs/probes.md)."""
    rewards = np.asarray(rewards, np.float64)
    tasks = [s.metadata.get("task_id") for s in samples]
    out = []
    for i, task in enumerate(tasks):
        others = [j for j, t in enumerate(tasks) if t == task and j != i]
        if not others:
            others = [j for j in range(len(tasks)) if j != i]
        out.append(float(rewards[i] - rewards[others].mean()) if others else float(rewards[i]))
    return out


def pack(samples, *, buckets, num_layers: int, top_k: int, row_multiple: int = 1,
         packing: bool = True, overlong: str = "error", reward: str = "dense",
         version: int | None = None, baseline: str = "none", routes_rows=None) -> Packed:
    """Pack samples into rows of one bucket length (the smallest that fits the longest).

    Why 11 parameters: the layout (buckets, row_multiple, packing, overlong) and the reward
    transform (reward, baseline) are rl.Settings fields the Trainer passes through; the rest
    say what the rows hold (routes' shape, version, a process's own rows).

    row_multiple: rows are a multiple of this (the data-parallel degree times minibatches).
    packing=False puts one sample per row. overlong: "error" | "drop". reward: "dense" |
    "binary" | "zero" (trained_reward) | "shuffled" (shuffled_rewards). version: the weight
    version being trained; the trials older weights sampled (is_stale) are marked in
    Batch.stale. baseline:
    "none" | "task" (task_baseline, on the kept samples' trained rewards). routes_rows:
    (rows, length) -> the rows whose routes to fill (a process's own in a multi-process step);
    batch.routes then holds those rows only, in that order (Packed.routes_rows), and only the
    samples placed in them have their routes read.
    """
    if reward not in REWARDS:
        raise ValueError(f"reward must be one of {REWARDS}, got {reward!r}")
    if baseline not in BASELINES:
        raise ValueError(f"baseline must be one of {BASELINES}, got {baseline!r}")
    if overlong not in ("error", "drop"):
        raise ValueError(f"overlong must be 'error' or 'drop', got {overlong!r}")
    limit = max(buckets)
    kept, dropped, pieces_of = [], [], {}
    for i, s in enumerate(samples):
        pieces = _pieces(s, limit)
        if isinstance(pieces, str):
            why = (f"sample {i} (task {s.metadata.get('task_id', '?')}, attempt "
                   f"{s.metadata.get('attempt', '?')}) {pieces}, more than the largest "
                   f"bucket {limit}; raise rl.max_length or compact the context (never truncated)")
            if overlong == "error":
                raise OverlongSample(why)
            dropped.append((i, why))
        elif _used_length(s):
            kept.append(i)
            pieces_of[i] = pieces
        if i in pieces_of and s.routes.shape[1:] != (num_layers, top_k):
            raise ValueError(f"sample {i} (task {s.metadata.get('task_id', '?')}) has routes of "
                             f"shape {s.routes.shape[1:]}, the model has ({num_layers}, {top_k})")
    if not kept:
        raise ValueError("no sample to train on" + (f": all {len(dropped)} were overlong"
                                                    if dropped else ""))
    given = {i: trained_reward(samples[i], reward) for i in kept}
    if reward == "shuffled":
        given = dict(zip(kept, shuffled_rewards([samples[i] for i in kept])))
    if baseline == "task":
        given = dict(zip(kept, task_baseline([samples[i] for i in kept],
                                             [given[i] for i in kept])))
    items = [(i, j, a, b) for i in kept for j, (a, b) in enumerate(pieces_of[i])]
    length = pick_bucket(max(b - a for _, _, a, b in items), buckets)
    rows_fill: list[int] = []
    where: dict[tuple[int, int], tuple[int, int]] = {}  # (sample, piece) -> (row, start)
    for i, j, a, b in sorted(items, key=lambda item: item[2] - item[3]):
        row = next((r for r, used in enumerate(rows_fill) if used + b - a <= length), None) \
            if packing else None
        if row is None:
            rows_fill.append(0)
            row = len(rows_fill) - 1
        where[i, j] = (row, rows_fill[row])
        rows_fill[row] += b - a
    rows = _round_rows(len(rows_fill), row_multiple)
    local = (list(range(rows)) if routes_rows is None
             else [int(r) for r in routes_rows(rows, length)])
    local_index = {r: k for k, r in enumerate(local)}
    arrays = dict(
        tokens=np.zeros((rows, length), np.int32), positions=np.zeros((rows, length), np.int32),
        segment_ids=np.zeros((rows, length), np.int32),
        trial_ids=np.zeros((rows, length), np.int32),
        loss_mask=np.zeros((rows, length), np.float32),
        rollout_logprobs=np.zeros((rows, length), np.float32),
        routes=np.full((len(local), length, num_layers, top_k), -1, np.int32),
        rewards=np.zeros((rows, length), np.float32),
        continues_at=np.full((rows, length), -1, np.int32),
        stale=np.zeros((rows, length), np.float32))
    next_segment, next_trial = [1] * rows, [1] * rows
    placements, piece_starts, fixed, first_sampled = [], [], 0, {}
    a = arrays
    for i, j, c_start, c_end in items:
        s, (row, start) = samples[i], where[i, j]
        end = start + c_end - c_start
        a["tokens"][row, start:end] = s.tokens[c_start:c_end]
        if row in local_index:
            a["routes"][local_index[row], start:end] = s.routes[c_start:c_end]
        a["rollout_logprobs"][row, start:end] = s.rollout_logprobs[c_start:c_end]
        mask = s.loss_mask[c_start:c_end].astype(np.float32)
        bounds = [c - c_start for c in s.chunk_starts if c_start <= c < c_end] \
            + [c_end - c_start]
        for c0, c1 in zip(bounds[:-1], bounds[1:]):
            a["positions"][row, start + c0:start + c1] = np.arange(c1 - c0)
            a["segment_ids"][row, start + c0:start + c1] = next_segment[row]
            next_segment[row] += 1
            if mask[c0]:  # nothing inside the chunk predicts its first token
                mask[c0], fixed = 0.0, fixed + 1
        a["loss_mask"][row, start:end] = mask
        a["trial_ids"][row, start:end] = next_trial[row]
        a["stale"][row, start:end] = float(is_stale(s, version))
        next_trial[row] += 1
        sampled = np.flatnonzero(mask)
        first_sampled[i, j] = row * length + start + (int(sampled[0]) if len(sampled) else 0)
        if len(sampled) and j == len(pieces_of[i]) - 1:
            a["rewards"][row, start + sampled[-1]] = given[i]
        placements.append((i, row, start, end))
        piece_starts.append(c_start)
    for i, j, c_start, c_end in items:
        if j + 1 < len(pieces_of[i]):
            row, start = where[i, j]
            a["continues_at"][row, start:start + c_end - c_start] = first_sampled[i, j + 1]
    return Packed(Batch(**arrays), placements, dropped, fixed, piece_starts,
                  None if routes_rows is None else local)


def batch_specs(batch: Batch | None):
    """Logical axis names per field, for t1jax.sharding (rows shard over the batch axes)."""
    two = ("batch", "length")
    return Batch(tokens=two, positions=two, segment_ids=two, trial_ids=two, loss_mask=two,
                 rollout_logprobs=two, routes=("batch", "length", None, None), rewards=two,
                 continues_at=two, stale=two)


def batch_shardings(batch: Batch, mesh, rules=None) -> Batch:
    """NamedShardings per field: rows split over the batch axes (data, fsdp, expert)."""
    from jax.sharding import NamedSharding

    from t1jax.sharding import spec_for
    shape = dict(mesh.shape)
    return jax.tree.map(lambda x, n: NamedSharding(mesh, spec_for(n, x.shape, shape, rules)),
                        batch, batch_specs(batch))


def shard_batch(batch: Batch, mesh, rules=None) -> Batch:
    return jax.device_put(batch, batch_shardings(batch, mesh, rules))


def routes_sharding(rows: int, length: int, num_layers: int, top_k: int, mesh, rules=None):
    """The NamedSharding of a batch's routes (rows over the batch axes), as batch_shardings."""
    from jax.sharding import NamedSharding

    from t1jax.sharding import spec_for
    return NamedSharding(mesh, spec_for(batch_specs(None).routes, (rows, length, num_layers,
                                                                   top_k), dict(mesh.shape),
                                        rules))


def shard_packed(packed: Packed, mesh, rules=None) -> Batch:
    """The packed batch on the mesh. With pack(routes_rows=...) its routes hold only this
    process's rows and are placed with make_array_from_callback, which asks each process
    only for its own devices' rows: no host ever holds the global batch's routes."""
    batch = packed.batch
    if packed.routes_rows is None:
        return shard_batch(batch, mesh, rules)
    rows, length = batch.tokens.shape
    shape = (rows, length) + batch.routes.shape[2:]
    where = {r: k for k, r in enumerate(packed.routes_rows)}

    def rows_of(index):
        try:
            picked = batch.routes[[where[r] for r in range(*index[0].indices(rows))]]
        except KeyError as err:
            raise ValueError(f"row {err} of the routes was asked for but not packed here "
                             f"(routes_rows {packed.routes_rows})") from None
        return picked[(slice(None),) + tuple(index[1:])]
    routes = jax.make_array_from_callback(
        shape, routes_sharding(*shape, mesh, rules), rows_of)
    shardings = batch_shardings(batch, mesh, rules)
    placed = {f.name: jax.device_put(getattr(batch, f.name), getattr(shardings, f.name))
              for f in dataclasses.fields(batch) if f.name != "routes"}
    return Batch(**placed, routes=routes)


def local_rows(rows: int, length: int, num_layers: int, top_k: int, mesh, rules=None) -> list:
    """The rows of a (rows, length) batch whose routes this process's devices hold."""
    me = jax.process_index()
    return [r for r, readers in enumerate(row_readers(rows, length, num_layers, top_k, mesh,
                                                      rules)) if me in readers]


def row_readers(rows: int, length: int, num_layers: int, top_k: int, mesh,
                rules=None) -> list[set]:
    """Per row, the processes whose devices hold its routes (every process computes it)."""
    shape = (rows, length, num_layers, top_k)
    out: list[set] = [set() for _ in range(rows)]
    for device, i in routes_sharding(*shape, mesh, rules).devices_indices_map(shape).items():
        for r in range(*i[0].indices(rows)):
            out[r].add(device.process_index)
    return out


def release_shared_routes(samples, packed: Packed, mesh, rules=None) -> None:
    """After shard_packed: every sample's shared routes (distributed.SharedArray) read by the
    processes whose rows hold it, then removed from the coordinator by the last of them (by
    its writer when no other process reads it), and no process keeps a copy. Every process
    calls it with the same samples and layout, so all count the same readers."""
    from t1jax import distributed
    rows, length = packed.batch.tokens.shape
    readers_of_row = row_readers(rows, length, *packed.batch.routes.shape[2:], mesh, rules)
    readers: dict[int, set] = {}
    for i, row, _, _ in packed.placements:
        readers.setdefault(i, set()).update(readers_of_row[row])
    me = distributed.process_index()
    for i, sample in enumerate(samples):
        routes = sample.routes
        if isinstance(routes, distributed.SharedArray):
            remote = readers.get(i, set()) - {routes.owner}
            if me in remote or (not remote and me == routes.owner):
                routes.release(len(remote))
            routes.forget()
