"""Multi-controller JAX: one process per host (or per group of devices), every process running
the same program over one global mesh, as JAX runs on TPU pods and GPU nodes.

Why a module of its own: JAX reads no environment variable by itself; a process that never
calls `jax.distributed.initialize` sees only its own devices and builds a wrong, smaller mesh
without an error. `experiments/run.py` joins the job here before anything touches a device,
and the rest of the code asks `is_main()` before writing what exactly one process must write
(metrics, reports, config files, progress lines).

The environment names the job (set by `experiments/launch_local.py`, by hand, or by a cluster
script; BUILD.md "Multi-process"):
  JAX_COORDINATOR_ADDRESS  host:port of process 0's coordinator (127.0.0.1:port on one machine)
  JAX_NUM_PROCESSES        processes in the job
  JAX_PROCESS_ID           this process's index, 0 .. JAX_NUM_PROCESSES - 1
or T1JAX_DISTRIBUTED=auto: JAX's own cluster detection (a Cloud TPU pod slice, SLURM, ...).
None of them set: a single process, unchanged.
"""

from __future__ import annotations

import itertools
import os
import pickle

import numpy as np

COORDINATOR, NUM_PROCESSES, PROCESS_ID = ("JAX_COORDINATOR_ADDRESS", "JAX_NUM_PROCESSES",
                                          "JAX_PROCESS_ID")
AUTO = "T1JAX_DISTRIBUTED"


def requested(environ=None) -> dict | None:
    """The job the environment describes: None (single process), {} (JAX's cluster
    detection), or the explicit coordinator arguments. Partial settings are an error."""
    environ = os.environ if environ is None else environ
    names = (COORDINATOR, NUM_PROCESSES, PROCESS_ID)
    given = [n for n in names if environ.get(n)]
    if not given:
        if environ.get(AUTO, "") in ("", "0"):
            return None
        if environ[AUTO] != "auto":
            raise ValueError(f"{AUTO}={environ[AUTO]!r}: use 'auto' (JAX's cluster detection) "
                             f"or set {', '.join(names)}")
        return {}
    missing = [n for n in names if n not in given]
    if missing:
        raise ValueError(f"a multi-process job needs {', '.join(names)}; {', '.join(given)} "
                         f"set but {', '.join(missing)} missing")
    try:
        num, pid = int(environ[NUM_PROCESSES]), int(environ[PROCESS_ID])
    except ValueError as err:
        raise ValueError(f"{NUM_PROCESSES} and {PROCESS_ID} must be integers: {err}") from err
    if num < 1 or not 0 <= pid < num:
        raise ValueError(f"{PROCESS_ID}={pid} is not in 0..{NUM_PROCESSES}-1={num - 1}")
    return {"coordinator_address": environ[COORDINATOR], "num_processes": num,
            "process_id": pid}


def initialize(environ=None) -> bool:
    """Joins the job the environment describes (before any device is touched); False, doing
    nothing, when it describes none."""
    args = requested(environ)
    if args is None:
        return False
    import jax
    jax.distributed.initialize(**args)
    _orbax_barriers_through_the_coordinator()
    return True


def _orbax_barriers_through_the_coordinator() -> None:
    """Orbax's barriers through the coordination service, not XLA collectives
    (`sync_global_devices`): an async save runs them on its own thread while the trainer's
    step runs its collectives on the main one, and processes that meet two collectives in
    different orders hang (once seen on CI: a 2-process main job stopped between two
    evaluations). Its flag is read at each barrier; unparsed (a script outside absl.app),
    Orbax keeps its default."""
    from absl import flags

    import orbax.checkpoint  # noqa: F401 - defines the flag
    if flags.FLAGS.is_parsed():
        flags.FLAGS.experimental_orbax_use_distributed_barrier = True


def process_index() -> int:
    import jax
    return jax.process_index()


def process_count() -> int:
    import jax
    return jax.process_count()


def is_main() -> bool:
    """The process that writes what exactly one must (metrics, reports, progress). Outside a
    multi-process job it is this process, without touching JAX's backend."""
    return requested() is None or process_index() == 0


_RENDEZVOUS = itertools.count()
RENDEZVOUS_TIMEOUT_S = 3600


def rendezvous(name: str) -> None:
    """Every process waits here for all the others, through the coordination service (a no-op
    in a single process). Why: XLA's CPU collectives (gloo) give a collective's first use 30 s
    for every process to arrive, and processes that compile or play trials at different
    speeds can be further apart than that; this wait has no such limit."""
    if process_count() == 1:
        return
    from jax._src import distributed as jax_distributed
    jax_distributed.global_state.client.wait_at_barrier(
        f"t1jax/{name}/{next(_RENDEZVOUS)}", RENDEZVOUS_TIMEOUT_S * 1000)


def _client():
    from jax._src import distributed as jax_distributed
    return jax_distributed.global_state.client


def increment(key: str) -> int:
    """Add one to a counter every process shares (the coordination service's, created at 0)
    and return the new value: each caller, on any process, gets a different one. Why: a
    decision that depends on timing (which trials finish first) must be taken once for the
    whole job, not once per process."""
    return int(_client().key_value_increment(f"t1jax/{key}", 1))


def raise_flag(key: str) -> None:
    """Set a flag every process can see (see flag_raised)."""
    _client().key_value_set(f"t1jax/{key}", "1", allow_overwrite=True)


def flag_raised(key: str) -> bool:
    """Whether any process has raised the flag; never waits."""
    try:
        return _client().key_value_try_get(f"t1jax/{key}") == "1"
    except Exception:  # noqa: BLE001 - NOT_FOUND: not raised yet
        return False


def exchange_objects(key: str, obj) -> list:
    """[process 0's obj, process 1's, ...] on every process, through the coordination
    service's key-value store rather than XLA collectives: safe from a thread while the
    trainer's step runs its collectives (one step off-policy), with no 30 s arrival limit.
    `key` must name this exchange the same way on every process and never be reused (e.g.
    the rollout source and step). The last process to read removes every share, so the
    coordinator does not keep a step's samples. Measured here: ~70 MB/s through the
    coordinator, fine for trials of thousands of tokens (every process receives all of it)."""
    if process_count() == 1:
        return [obj]
    client, me, n = _client(), process_index(), process_count()
    client.key_value_set_bytes(f"t1jax/exchange/{key}/{me}", pickle.dumps(obj))
    out = [obj if p == me else pickle.loads(client.blocking_key_value_get_bytes(
        f"t1jax/exchange/{key}/{p}", RENDEZVOUS_TIMEOUT_S * 1000)) for p in range(n)]
    if increment(f"exchange/{key}/read") == n:  # everyone holds every share
        for p in range(n):
            client.key_value_delete(f"t1jax/exchange/{key}/{p}")
    return out


def host_copy(tree):
    """Every array of `tree` whole, as numpy, on every process: a global array spans other
    hosts' devices, which jax.device_get cannot read (an allgather; every process calls it).
    Arrays this process holds whole (on its own devices, or numpy) are copied as they are:
    gathering them would concatenate every process's copy."""
    import jax
    if process_count() == 1:
        return jax.device_get(tree)
    from jax.experimental import multihost_utils
    leaves, treedef = jax.tree.flatten(tree)
    spanning = [i for i, x in enumerate(leaves)
                if isinstance(x, jax.Array) and not x.is_fully_addressable]
    out = [None if i in spanning else np.asarray(jax.device_get(x))
           if isinstance(x, jax.Array) else x for i, x in enumerate(leaves)]
    if spanning:
        rendezvous("host_copy")
        gathered = multihost_utils.process_allgather([leaves[i] for i in spanning], tiled=True)
        for i, value in zip(spanning, gathered):
            out[i] = np.asarray(value)
    return jax.tree.unflatten(treedef, out)


def allgather_objects(obj) -> list:
    """[process 0's obj, process 1's, ...] on every process (every process calls it): the
    host-side results of work split across processes, e.g. each one's share of the trials."""
    if process_count() == 1:
        return [obj]
    from jax.experimental import multihost_utils
    rendezvous("allgather_objects")  # trials end at different times on each process
    data = np.frombuffer(pickle.dumps(obj), np.uint8)
    sizes = np.asarray(multihost_utils.process_allgather(np.array([data.size], np.int64)))
    sizes = sizes.reshape(-1)
    padded = np.zeros(int(sizes.max()), np.uint8)
    padded[:data.size] = data
    gathered = np.asarray(multihost_utils.process_allgather(padded)).reshape(len(sizes), -1)
    return [pickle.loads(gathered[i, :sizes[i]].tobytes()) for i in range(len(sizes))]


class SharedArray:
    """A numpy array one process put in the coordination service's key-value store, read only
    by the processes that need it (on first use, then cached). Why: expert routes are 99% of
    a step's sample bytes at T1's size (48 layers x 8 experts x 4 bytes = 1536 bytes a token,
    against 9 for the id, mask and log-prob), and each process needs only those of the samples
    packed into its own rows; sending every sample's routes to every host would copy the
    global batch to each. The writer keeps its own copy cached; a pickled copy (what another
    process receives) carries only the key, shape and dtype."""

    def __init__(self, key: str, shape, dtype, owner: int, cache=None):
        self.key, self.shape, self.dtype, self.owner = key, tuple(shape), np.dtype(dtype), owner
        self._cache = cache

    @classmethod
    def put(cls, key: str, array) -> "SharedArray":
        array = np.ascontiguousarray(array)
        _client().key_value_set_bytes(f"t1jax/shared/{key}", array.tobytes())
        return cls(key, array.shape, array.dtype, process_index(), array)

    @property
    def ndim(self) -> int:
        return len(self.shape)

    def __len__(self) -> int:
        return self.shape[0]

    FETCH_TIMEOUT_S = 300  # the writer put it before anyone could hold this handle

    def value(self) -> np.ndarray:
        if self._cache is None:
            if self.__dict__.get("_released"):
                raise RuntimeError(f"{self!r} was read after its release (a step's batch is "
                                   "packed once; the coordinator no longer holds it)")
            try:
                data = _client().blocking_key_value_get_bytes(f"t1jax/shared/{self.key}",
                                                              self.FETCH_TIMEOUT_S * 1000)
            except Exception as err:  # noqa: BLE001 - name what was missing, and where from
                raise RuntimeError(f"{self!r}: not in the coordination service ({err}); it is "
                                   "removed once every process that packs it has read it") \
                    from err
            self._cache = np.frombuffer(data, self.dtype).reshape(self.shape)
        return self._cache

    @property
    def fetched(self) -> bool:
        return self._cache is not None

    def __getitem__(self, index):
        return self.value()[index]

    def __array__(self, dtype=None, copy=None):
        value = self.value()
        return value if dtype is None else value.astype(dtype)

    def release(self, remote_readers: int) -> None:
        """Called once by each process that fetched it (of `remote_readers`, which every
        process computes alike), or by the writer when no other process reads it: the last
        one removes it from the coordinator. Every caller drops its cached copy."""
        if remote_readers == 0 or increment(f"shared-reads/{self.key}") == remote_readers:
            _client().key_value_delete(f"t1jax/shared/{self.key}")
            _client().key_value_delete(f"t1jax/shared-reads/{self.key}")
        self.forget()

    def forget(self) -> None:
        """Drop this process's copy; reading it again is an error (it may be gone)."""
        self._cache, self._released = None, True

    def __getstate__(self):
        return {**self.__dict__, "_cache": None, "_released": False}

    def __repr__(self) -> str:
        return f"SharedArray({self.key!r}, {self.shape}, {self.dtype}, owner={self.owner})"
