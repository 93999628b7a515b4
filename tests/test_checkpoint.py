"""t1jax.checkpoint on 8 host CPU devices: bit-exact round trips of model parameters, optax
states and meta; arrays restored onto the requested (and a different) mesh; keep-N; partial
restore of one item; a save killed mid-write never becomes the checkpoint restored; clear errors."""

import importlib.util
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec as P

from t1jax import sharding
from t1jax.checkpoint import Checkpointer, abstract_like, finalized_steps, has_checkpoint
from t1jax.model.config import model_config_from
from t1jax.model.transformer import CausalLM

ROOT = Path(__file__).resolve().parents[1]
# Test-only, as in test_sharding.py: the values checked here do not depend on LLVM's passes.
FAST_COMPILE = {"xla_backend_optimization_level": 0, "xla_llvm_disable_expensive_passes": True}

pytestmark = pytest.mark.skipif(jax.device_count() < 8,
                                reason="needs 8 devices (tests/conftest.py sets XLA_FLAGS)")


def tiny_config():
    spec = importlib.util.spec_from_file_location("tiny", ROOT / "configs" / "model" / "tiny.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    small = dict(vocab_size=256, hidden_size=64, intermediate_size=128, moe_intermediate_size=32,
                 num_hidden_layers=2, mlp_only_layers=(0,), num_attention_heads=4,
                 num_key_value_heads=2, head_dim=16, num_experts=8, num_experts_per_tok=2)
    return model_config_from(module.get_config().model).replace(**small)


_MODEL, _STATE = {}, {}


def sharded_params():
    """(mesh, nnx.State of Params) of the tiny CausalLM, built sharded on an fsdp=8 mesh."""
    if not _MODEL:  # initialised on one device, then placed: ~3x faster here than create_sharded
        mesh = sharding.make_mesh(fsdp=8)
        cfg = tiny_config()
        init = jax.jit(lambda: nnx.split(CausalLM(cfg, nnx.Rngs(0)), nnx.Param, ...)[1],
                       compiler_options=FAST_COMPILE)
        params = init()
        placed = jax.device_put(params, sharding.shardings(sharding.param_specs(params, mesh),
                                                           mesh))
        _MODEL["v"] = (mesh, placed)
    return _MODEL["v"]


def trainer_state():
    """What the trainer saves: pure dicts of params, an adam state with non-zero moments, a
    step counter and an int array."""
    if not _STATE:
        _STATE["v"] = _trainer_state()
    return _STATE["v"]


def _trainer_state():
    mesh, params = sharded_params()
    actor = nnx.to_pure_dict(params)
    tx = optax.adam(1e-3)

    def critic_and_opt(actor):  # one compiled program, not dozens of eager ops
        opt = tx.init(actor)
        grads = jax.tree.map(lambda x: x + 0.1, actor)
        return jax.tree.map(lambda x: x * 2.0, actor), tx.update(grads, opt, actor)[1]

    critic, opt = jax.jit(critic_and_opt, compiler_options=FAST_COMPILE)(actor)
    tokens = jax.device_put(jnp.arange(64, dtype=jnp.int32).reshape(8, 8),
                            NamedSharding(mesh, P("fsdp")))
    return {"actor": actor, "critic": critic, "actor_opt": opt,
            "step": jnp.asarray(7, jnp.int32), "misc": {"tokens": tokens}}


META = {"sampler": {"epoch": 2, "position": 5, "seed": 0, "num_items": 40},
        "config": {"lr": 1e-3, "name": "ppo"}, "rng_seed": 17, "metrics": {"reward": 0.25}}


def assert_trees_equal(got, want):
    assert jax.tree.structure(got) == jax.tree.structure(want)
    for (path, a), b in zip(jax.tree_util.tree_flatten_with_path(got)[0], jax.tree.leaves(want),
                            strict=True):
        assert a.dtype == b.dtype, path
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b), err_msg=str(path))


def saved(directory, state=None, steps=(1,), **kw):
    state = trainer_state() if state is None else state
    with Checkpointer(directory, **kw) as ckpt:
        for step in steps:
            assert ckpt.save(step, state, dict(META, step=step))
    return state


# -- round trip ------------------------------------------------------------------------------------

@pytest.mark.slow
def test_round_trip_is_bit_exact_and_sharded(tmp_path):
    state = saved(tmp_path)
    fsdp_leaves = [x for x in jax.tree.leaves(state) if "fsdp" in jax.tree.leaves(
        tuple(x.sharding.spec) if isinstance(x.sharding, NamedSharding) else ())]
    assert len(fsdp_leaves) > 5  # the test really saves arrays split over 8 devices

    with Checkpointer(tmp_path) as ckpt:
        assert ckpt.latest_step() == 1
        restored, meta = ckpt.restore(abstract_like(state))
    assert meta == dict(META, step=1)
    assert_trees_equal(restored, state)
    assert type(restored["actor_opt"][0]) is optax.ScaleByAdamState  # namedtuple, not a list
    assert all(float(jnp.abs(nu).sum()) > 0 for nu in jax.tree.leaves(restored["actor_opt"][0].nu))
    for got, want in zip(jax.tree.leaves(restored), jax.tree.leaves(state), strict=True):
        assert got.sharding == want.sharding, (got.sharding, want.sharding)


@pytest.mark.slow
def test_restore_onto_a_different_mesh(tmp_path):
    state = saved(tmp_path)
    mesh = sharding.make_mesh(data=2, fsdp=2, expert=2)
    split = NamedSharding(mesh, P(("data", "fsdp", "expert")))  # first dim over all 8 devices
    replicated = NamedSharding(mesh, P())
    targets = jax.tree.map(lambda x: split if x.ndim and x.shape[0] % 8 == 0 else replicated,
                           state)
    with Checkpointer(tmp_path) as ckpt:
        restored, _ = ckpt.restore(abstract_like(state, targets))
    assert_trees_equal(restored, state)
    for got, want in zip(jax.tree.leaves(restored), jax.tree.leaves(targets), strict=True):
        assert got.sharding == want
    assert any(t == split for t in jax.tree.leaves(targets))


def test_nnx_state_round_trip_with_variable_wrappers(tmp_path):
    """nnx.State from nnx.split keeps its Variables; shardings given per Variable (the tree
    t1jax.sharding.param_specs builds) land the arrays on another mesh."""
    _, params = sharded_params()
    saved(tmp_path, state={"actor": params})
    mesh = sharding.make_mesh(data=2, expert=4)
    targets = sharding.shardings(sharding.param_specs(params, mesh), mesh)
    with Checkpointer(tmp_path) as ckpt:
        restored, _ = ckpt.restore({"actor": abstract_like(params, targets)})
    actor = restored["actor"]
    assert isinstance(actor, nnx.State)
    for (path, got), (_, want) in zip(nnx.to_flat_state(actor), nnx.to_flat_state(params),
                                      strict=True):
        assert type(got) is type(want), path
        np.testing.assert_array_equal(np.asarray(got.get_value()), np.asarray(want.get_value()))
        assert got.get_value().sharding.mesh.shape == mesh.shape, path


# -- keep-N and the save interval --------------------------------------------------------------

def test_keeps_only_the_newest_n(tmp_path):
    state = {"actor": {"w": jnp.arange(4.0)}}
    for step in range(1, 6):
        with Checkpointer(tmp_path, keep=2) as ckpt:
            ckpt.save(step, jax.tree.map(lambda x: x + step, state), {"step": step})
    step_dirs = sorted(p.name for p in tmp_path.iterdir() if p.is_dir())
    assert step_dirs == ["4", "5"]
    with Checkpointer(tmp_path, keep=2) as ckpt:
        assert ckpt.latest_step() == 5 and ckpt.all_steps() == [4, 5]
        restored, meta = ckpt.restore(abstract_like(state))
        np.testing.assert_array_equal(restored["actor"]["w"], np.arange(4.0) + 5)
        assert meta == {"step": 5}
        _, old_meta = ckpt.restore(abstract_like(state), step=4)
        assert old_meta == {"step": 4}


def test_keep_n_within_one_async_manager_and_save_interval(tmp_path):
    state = {"actor": {"w": jnp.arange(4.0)}}
    with Checkpointer(tmp_path, keep=2, save_every=2) as ckpt:
        decisions = [ckpt.save(step, state, {}) for step in range(0, 9)]
        assert ckpt.save(9, state, {}, force=True)
        ckpt.wait()
        assert decisions == [step % 2 == 0 for step in range(0, 9)]
        assert ckpt.all_steps() == [8, 9]


# -- partial restore -------------------------------------------------------------------------------

def test_restore_only_the_critic(tmp_path):
    state = saved(tmp_path)
    with Checkpointer(tmp_path) as ckpt:
        assert ckpt.saved_items() == sorted(state)
        only = ckpt.restore_items({"critic": abstract_like(state["critic"])})
    assert set(only) == {"critic"}
    assert_trees_equal(only["critic"], state["critic"])
    for got, want in zip(jax.tree.leaves(only["critic"]), jax.tree.leaves(state["critic"])):
        assert got.sharding == want.sharding


def test_partial_restore_reads_only_the_named_items(tmp_path, monkeypatch):
    """The optimizer moments on disk are never opened: corrupt them and the critic still loads."""
    state = saved(tmp_path)
    for f in (tmp_path / "1" / "actor_opt").rglob("*"):
        if f.is_file():
            f.write_bytes(b"garbage")
    with Checkpointer(tmp_path) as ckpt:
        only = ckpt.restore_items({"critic": abstract_like(state["critic"])})
        assert_trees_equal(only["critic"], state["critic"])
        with pytest.raises(Exception):
            ckpt.restore_items({"actor_opt": abstract_like(state["actor_opt"])})


# -- crash safety ----------------------------------------------------------------------------------

TMP_SUFFIX = ".orbax-checkpoint-tmp"  # orbax's atomicity_types.TMP_DIR_SUFFIX

CHILD = textwrap.dedent("""
    import sys, time
    import jax.numpy as jnp
    from t1jax.checkpoint import Checkpointer
    directory, marker = sys.argv[1], sys.argv[2]
    ckpt = Checkpointer(directory, keep=5)

    def state(step):  # ~200 MB over 8 arrays, every element equal to the step
        return {"actor": {"w": jnp.full((4,), step, jnp.float32)},
                "big": {f"x{i}": jnp.full((6_250_000,), step, jnp.float32) for i in range(8)}}

    ckpt.save(1, state(1), {"step": 1})
    ckpt.wait()
    ckpt.save(2, state(2), {"step": 2})
    open(marker, "w").close()  # the parent SIGKILLs us now, mid-write of step 2
    time.sleep(60)
""")


def test_a_save_killed_mid_write_is_never_restored(tmp_path):
    directory, marker = tmp_path / "ckpt", tmp_path / "marker"
    env = dict(os.environ, XLA_FLAGS="", JAX_PLATFORMS="cpu")
    child = subprocess.Popen([sys.executable, "-c", CHILD, str(directory), str(marker)],
                             env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 45
        while not marker.exists():
            if child.poll() is not None:
                pytest.fail(f"child exited early: {child.stderr.read().decode()[-2000:]}")
            assert time.monotonic() < deadline, "child never reached the second save"
            time.sleep(0.002)
        os.kill(child.pid, signal.SIGKILL)
    finally:
        if child.poll() is None:
            child.kill()
        child.wait()
        child.stderr.close()

    names = sorted(p.name for p in directory.iterdir())
    killed_mid_write = "2" not in names
    print(f"killed mid-write: {killed_mid_write}; left behind: {names}")
    if killed_mid_write:  # the usual case: step 2 left behind as a temporary directory
        assert any(n.startswith("2" + TMP_SUFFIX) for n in names), names
    abstract = {"actor": {"w": jax.ShapeDtypeStruct((4,), jnp.float32)},
                "big": {f"x{i}": jax.ShapeDtypeStruct((6_250_000,), jnp.float32)
                        for i in range(8)}}
    abstract = abstract_like(abstract, jax.sharding.SingleDeviceSharding(jax.devices()[0]))
    with Checkpointer(directory, keep=5) as ckpt:
        latest = ckpt.latest_step()
        assert latest == (1 if killed_mid_write else 2)
        restored, meta = ckpt.restore(abstract)
        assert meta == {"step": latest}
        for leaf in jax.tree.leaves(restored):
            assert bool(jnp.all(leaf == latest))
        # the reopened manager cleared the leftover and saves over it
        assert not any(TMP_SUFFIX in p.name for p in directory.iterdir())
        ckpt.save(2, restored, {"step": 2}, force=True)
    with Checkpointer(directory, keep=5) as ckpt:
        assert ckpt.latest_step() == 2


def test_an_unfinalized_newer_step_is_ignored(tmp_path):
    state = {"actor": {"w": jnp.arange(4.0)}}
    saved(tmp_path, state=state, steps=(1,))
    tmp = tmp_path / ("2" + TMP_SUFFIX)  # what AtomicRenameTemporaryPath writes before renaming
    (tmp / "actor").mkdir(parents=True)
    (tmp / "actor" / "junk").write_bytes(b"half-written")
    (tmp_path / "3.orbax-checkpoint-tmp-1767225600").mkdir()  # the older, timestamped naming
    assert finalized_steps(tmp_path) == [1]  # read before a manager cleans the leftovers up
    with Checkpointer(tmp_path) as ckpt:
        assert ckpt.latest_step() == 1
        restored, meta = ckpt.restore(abstract_like(state))
        np.testing.assert_array_equal(restored["actor"]["w"], np.arange(4.0))
        with pytest.raises(FileNotFoundError, match="step 2"):
            ckpt.restore(abstract_like(state), step=2)


def test_has_checkpoint_means_a_finished_step_not_a_folder(tmp_path):
    """What a phase asks before choosing between resuming and starting from its predecessor:
    a manager creates the folder before any step is saved, and a kill leaves a temporary one."""
    directory = tmp_path / "checkpoints"
    assert not has_checkpoint(directory)
    Checkpointer(directory).close()
    assert directory.is_dir() and not has_checkpoint(directory)
    (directory / ("1" + TMP_SUFFIX) / "actor").mkdir(parents=True)
    assert not has_checkpoint(directory)
    saved(directory, state={"actor": {"w": jnp.arange(4.0)}}, steps=(2,))
    assert has_checkpoint(directory)


def test_a_killed_saves_leftovers_are_gone_when_the_checkpointer_is_made(tmp_path):
    """Orbax removes a killed save's temporary step in a background thread; one outliving the
    constructor raced the next manager's cleanup of the same folder (CI: FileNotFoundError
    mid-rmtree) and, listing late, could delete a newer save in flight. Made and closed
    without a save (a restore-only use), the folder is clean already."""
    for attempt in range(5):
        leftover = tmp_path / str(attempt) / ("1" + TMP_SUFFIX)
        (leftover / "actor" / "deep").mkdir(parents=True)
        (leftover / "actor" / "deep" / "blob").write_bytes(b"0" * 1024)
        with Checkpointer(leftover.parent):
            assert not leftover.exists()


def test_a_reader_deletes_nothing_and_creates_nothing(tmp_path):
    """An evaluation and the next phase's start open another run's folder. A writer's constructor
    removes temporary steps (its own killed saves), and deleted a live writer's save in flight
    when readers were writers too; and a mistyped path came back as a new empty folder."""
    directory = tmp_path / "checkpoints"
    state = saved(directory, state={"actor": {"w": jnp.arange(4.0)}}, steps=(1,))
    in_flight = directory / ("2" + TMP_SUFFIX) / "actor"
    in_flight.mkdir(parents=True)
    (in_flight / "blob").write_bytes(b"0" * 64)
    with Checkpointer.reader(directory) as reader:
        assert reader.latest_step() == 1
        got = reader.restore_items({"actor": abstract_like(state["actor"])})
        np.testing.assert_array_equal(got["actor"]["w"], state["actor"]["w"])
        with pytest.raises(PermissionError, match="read-only"):
            reader.save(3, state, {})
    assert (in_flight / "blob").is_file(), "a reader removed another process's save in flight"
    assert sorted(p.name for p in directory.iterdir()) == ["1", "2" + TMP_SUFFIX]

    missing = tmp_path / "chekpoints"  # mistyped
    with pytest.raises(FileNotFoundError, match="chekpoints"):
        Checkpointer.reader(missing)
    assert not missing.exists()


def test_the_loaders_of_other_runs_open_them_read_only():
    """Every reader of another run's checkpoints goes through Checkpointer.reader: a writer
    opened on them (the default constructor) is the hazard above."""
    # build.py: a restored actor, and the reward scale a critic's run recorded
    readers = {"t1jax/rl/loop.py": 2, "t1jax/jobs/build.py": 2,
               "experiments/probes/mismatch_study.py": 1}
    for path, count in readers.items():
        text = (ROOT / path).read_text()
        assert text.count("Checkpointer.reader(") == count, path
        assert text.count("Checkpointer(") == (1 if path == "t1jax/rl/loop.py" else 0), path


def test_a_save_in_flight_is_not_the_latest_step(tmp_path):
    state = {"big": {"x": jnp.zeros((8_000_000,), jnp.float32)}}
    with Checkpointer(tmp_path) as ckpt:
        ckpt.save(1, state, {})
        in_flight = ckpt.latest_step()
        ckpt.wait()
        assert ckpt.latest_step() == 1
    assert in_flight in (None, 1)  # 1 only where the write already finished
    # and whatever it reported then was restorable: the finalized steps are all on disk
    assert (tmp_path / "1").is_dir()


# -- errors ----------------------------------------------------------------------------------------

def test_restore_from_an_empty_directory_names_it(tmp_path):
    empty = tmp_path / "nothing_here"
    with Checkpointer(empty) as ckpt:
        assert ckpt.latest_step() is None
        with pytest.raises(FileNotFoundError, match="nothing_here"):
            ckpt.restore({"actor": {"w": jax.ShapeDtypeStruct((4,), jnp.float32)}})


def test_mismatched_abstract_tree_names_the_key(tmp_path):
    state = {"actor": {"w": jnp.arange(4.0), "b": jnp.zeros(2)}, "critic": {"v": jnp.ones(3)}}
    saved(tmp_path, state=state)
    with Checkpointer(tmp_path) as ckpt:
        wrong_leaf = abstract_like(state)
        wrong_leaf["critic"] = {"v": wrong_leaf["critic"]["v"],
                                "surprise_key": jax.ShapeDtypeStruct((3,), jnp.float32)}
        with pytest.raises(ValueError, match="surprise_key") as err:
            ckpt.restore(wrong_leaf)
        assert "critic" in str(err.value)
        wrong_shape = abstract_like(state)
        wrong_shape["actor"]["w"] = jax.ShapeDtypeStruct((5,), jnp.float32)
        with pytest.raises(ValueError, match=r"'actor' key 'w' has shape \(4,\) on disk"):
            ckpt.restore(wrong_shape)
        with pytest.raises(ValueError, match="value_head"):
            ckpt.restore_items({"value_head": abstract_like(state["critic"])})
        with pytest.raises(ValueError, match="critic"):
            ckpt.restore({"actor": abstract_like(state["actor"])})  # full restore lacks one


def test_bad_inputs_fail_before_writing(tmp_path):
    with Checkpointer(tmp_path) as ckpt:
        with pytest.raises(ValueError, match="'meta'"):
            ckpt.save(1, {"meta": {"w": jnp.zeros(2)}}, {})
        with pytest.raises(TypeError, match="JSON"):
            ckpt.save(1, {"actor": {"w": jnp.zeros(2)}}, {"bad": object()})
        with pytest.raises(TypeError, match="mapping"):
            ckpt.save(1, [jnp.zeros(2)], {})
    assert list(tmp_path.iterdir()) == []


def test_a_critic_scored_on_another_reward_scale_is_refused(tmp_path):
    """The dense reward's scale is kept in every live-rollout checkpoint (the source's state):
    a run that takes a critic learned on another scale is refused naming both values before
    anything is loaded, as is a resume on another scale; the same scale, or a checkpoint from
    before the scale was recorded, passes."""
    from t1jax.jobs import UsageError
    from t1jax.jobs.build import start_weights
    from t1jax.rollout.source import LiveRollouts
    ckpt = tmp_path / "warmup" / "checkpoints"
    with Checkpointer(ckpt) as c:
        c.save(1, {"critic": {"w": jnp.ones(2)}}, {"step": 1, "source": {"reward_scale": 4.0}})
        c.wait()
    with pytest.raises(UsageError, match=r"critic to start from .*scale is 9 here but 4 in the critic"):
        start_weights(None, tmp_path / "ppo" / "checkpoints", critic=ckpt, reward_scale=9.0)
    from t1jax.tasks.sampler import EpochSampler
    live = LiveRollouts(None, [], EpochSampler(1, 0), None, batch_size=1, reward_scale=9.0)
    assert live.state_dict()["reward_scale"] == 9.0  # what every checkpoint of the run holds
    with pytest.raises(ValueError, match="scale is 9 here but 4 in this run's checkpoint"):
        live.load_state_dict({"reward_scale": 4.0})
    live.load_state_dict({"reward_scale": 9.0})
    live.load_state_dict({})  # recorded before the scale was
