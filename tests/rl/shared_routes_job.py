"""One process of tests/rl/test_multiprocess.py's shared-routes check (run by
experiments/launch_local.py: 2 processes x 2 CPU devices, a data=2 x fsdp=2 mesh).

Every process makes the same 10 samples, keeps the routes of its own half (every other one, as
a split step's trials are dealt) and shares them as SharedArrays, exchanges the samples, then
packs, places and releases them as Trainer.make_batch does. It checks: the global batch equals
one process packing every sample itself (every field, routes included); this process fetched
exactly the routes of the other process's samples that sit in its own rows, nothing more; and
once both have released, the coordinator holds none of them. Prints one line of counts.
"""

import dataclasses
import sys

import numpy as np

LAYERS, K = 3, 2


def make_samples():
    from t1jax.rollout.sample import Sample
    out = []
    for seed, n in enumerate([30, 12, 9, 25, 14, 7, 40, 18, 5, 22]):
        rng = np.random.RandomState(seed)
        mask = np.zeros(n, np.int8)
        mask[n // 2:] = 1
        out.append(Sample(tokens=rng.randint(1, 100, n), loss_mask=mask,
                          rollout_logprobs=np.where(mask, -rng.rand(n), 0.0),
                          routes=rng.randint(0, 8, (n, LAYERS, K)),
                          reward=float(rng.rand()), metadata={"task_id": f"t{seed}",
                                                              "attempt": seed}))
    return out


def main() -> None:
    from t1jax import distributed
    assert distributed.initialize()
    import jax

    from t1jax import sharding
    from t1jax.rl import batch as batch_lib
    me, n = distributed.process_index(), distributed.process_count()
    mesh = sharding.make_mesh(2, 2, 1, 1, devices=jax.devices())
    everything = make_samples()
    own = [dataclasses.replace(s, routes=distributed.SharedArray.put(f"test/{me}/{j}", s.routes))
           for j, s in enumerate(everything[me::n])]
    shares = distributed.exchange_objects("test/samples", own)
    samples = [shares[i % n][i // n] for i in range(len(everything))]  # dealt order, undone
    kw = dict(buckets=[32, 64], num_layers=LAYERS, top_k=K, row_multiple=4)
    packed = batch_lib.pack(samples, routes_rows=lambda rows, length: batch_lib.local_rows(
        rows, length, LAYERS, K, mesh), **kw)
    placed = batch_lib.shard_packed(packed, mesh)
    fetched = {i for i, s in enumerate(samples) if s.routes.owner != me and s.routes.fetched}
    batch_lib.release_shared_routes(samples, packed, mesh)
    reference = batch_lib.pack(everything, **kw)
    assert packed.placements == reference.placements
    whole = distributed.host_copy(placed)
    for field in dataclasses.fields(reference.batch):
        np.testing.assert_array_equal(getattr(whole, field.name),
                                      getattr(reference.batch, field.name), err_msg=field.name)
    rows = packed.batch.tokens.shape[0]
    assert packed.routes_rows == batch_lib.local_rows(rows, packed.batch.tokens.shape[1],
                                                      LAYERS, K, mesh) and len(packed.routes_rows) < rows
    wanted = {i for i, row, _, _ in packed.placements
              if row in packed.routes_rows and i % n != me}
    assert fetched == wanted, (fetched, wanted)
    assert all(not s.routes.fetched for s in samples)  # nobody keeps a copy
    distributed.rendezvous("released")
    client = distributed._client()

    def held(key: str) -> bool:
        try:
            client.key_value_try_get_bytes(key)
            return True
        except Exception:  # noqa: BLE001 - NOT_FOUND
            return False
    left = [f"test/{p}/{j}" for p in range(n) for j in range(len(everything[p::n]))
            if held(f"t1jax/shared/test/{p}/{j}")]
    assert not left, left
    print(f"process {me}: rows {packed.routes_rows} of {rows}, fetched {sorted(fetched)} of "
          f"{len(samples) - len(own)} remote samples, left in the coordinator {left}",
          flush=True)


if __name__ == "__main__":
    try:
        main()
    except Exception:
        import traceback
        traceback.print_exc()
        sys.exit(1)
