"""Orbax checkpoints for the PPO trainer: keep-N, async, crash-safe, sharded, partial restore.

Why one Orbax item per top-level state key: a Critic Warm-Up run saves actor, critic and both
optimizer states, and the PPO run that follows wants only the critic parameters. With each key
('actor', 'critic', 'actor_opt', 'critic_opt', ...) stored as its own Composite item, a partial
restore reads just the items it names and never touches the optimizer moments on disk.

Crash safety comes from Orbax itself: a step is written into ``<step>.orbax-checkpoint-tmp``
and renamed to ``<step>`` only once every item is on disk, so a process killed mid-save leaves
a temporary directory that ``latest_step`` ignores (and the next manager deletes).

What ``state`` may hold: a mapping from item name to any pytree of jax arrays (dicts, lists,
optax states - namedtuples round-trip as namedtuples when restored into an abstract target of
the same type - and scalars). The trainer passes pure pytrees (``nnx.to_pure_dict`` dicts,
optax states); ``nnx.State`` (with its ``nnx.Variable`` wrappers) round-trips too, as long as
the abstract target is an ``nnx.State`` of the same structure. ``meta`` is one JSON document
(sampler position, config, seeds, metrics).
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Mapping
from pathlib import Path

import jax
import orbax.checkpoint as ocp
from jax.sharding import Sharding



class _QuietOrbax(logging.Filter):
    """Orbax narrates every save at INFO (a dozen lines per step); keep its warnings only."""

    def filter(self, record: logging.LogRecord) -> bool:
        return record.levelno >= logging.WARNING or "/orbax/" not in record.pathname


logging.getLogger("absl").addFilter(_QuietOrbax())

META_ITEM = "meta"
# StandardSave refuses a bare array; an item that is a single leaf is stored as {LEAF_KEY: leaf}.
_LEAF_KEY = "value"
_ITEM_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")


def abstract_like(tree, shardings=None):
    """The restore target for ``tree``: every array leaf becomes a ``jax.ShapeDtypeStruct``.

    ``shardings`` is None (take each live array's own ``.sharding``), a single ``Sharding``
    (for every array leaf), or a tree of shardings that is a prefix of ``tree`` - e.g. the
    output of ``t1jax.sharding.shardings(param_specs(...), mesh)``, one sharding per
    ``nnx.Variable``. Non-array leaves (Python scalars) are kept as they are.
    """
    def leaf(x, sharding):
        if not (hasattr(x, "shape") and hasattr(x, "dtype")):
            return x
        if sharding is None:
            sharding = getattr(x, "sharding", None)
        return jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sharding)

    if shardings is None or isinstance(shardings, Sharding):
        return jax.tree.map(lambda x: leaf(x, shardings), tree)
    return jax.tree.map(lambda s, sub: jax.tree.map(lambda x: leaf(x, s), sub), shardings, tree,
                        is_leaf=lambda s: s is None or isinstance(s, Sharding))


def finalized_steps(directory) -> list[int]:
    """Steps under ``directory`` whose checkpoint is completely written, ascending. A save
    still in flight, or one cut short by a crash, is a temporary directory and not listed."""
    directory = Path(directory)
    if not directory.exists():
        return []
    return sorted(ocp.path.step.checkpoint_steps(directory))


def has_checkpoint(directory) -> bool:
    """Whether ``directory`` holds a finished step: the test a phase uses to decide between
    resuming and starting from its predecessor (a folder, or a save cut short, is not one)."""
    return bool(finalized_steps(directory))


def _wrap(tree):
    return {_LEAF_KEY: tree} if jax.tree_util.treedef_is_leaf(jax.tree.structure(tree)) else tree


def _unwrap(restored, target):
    return restored[_LEAF_KEY] if jax.tree_util.treedef_is_leaf(jax.tree.structure(target)) \
        else restored


class Checkpointer:
    """Saves ``(state, meta)`` every ``save_every`` steps, keeping the newest ``keep``.

    ``read_only=True`` (see ``Checkpointer.reader``) opens another run's checkpoints to read
    them: it creates nothing (a mistyped path is an error, not a new empty folder) and deletes
    nothing (a writer's save in flight is a temporary folder that only the writer may remove).
    """

    def __init__(self, directory, *, keep: int = 3, save_every: int = 1,
                 async_save: bool = True, read_only: bool = False):
        if keep < 1:
            raise ValueError(f"keep must be >= 1, got {keep}")
        if save_every < 1:
            raise ValueError(f"save_every must be >= 1, got {save_every}")
        self.directory = Path(directory).absolute()
        self.read_only = read_only
        if read_only and not self.directory.is_dir():
            raise FileNotFoundError(f"no checkpoint folder {self.directory}")
        options = ocp.CheckpointManagerOptions(
            max_to_keep=keep, save_interval_steps=save_every,
            enable_async_checkpointing=async_save and not read_only,
            # a writer removes leftovers of its own killed save, never restorable; a reader
            # must not: in a shared folder they may be another process's save in flight
            cleanup_tmp_directories=not read_only,
            create=not read_only, read_only=read_only)
        self._manager = ocp.CheckpointManager(self.directory, options=options)
        # Orbax deletes the leftovers in a background thread that only a save waits for. One
        # outliving this constructor races whatever comes next in the folder: a second
        # manager's cleanup of the same leftovers (FileNotFoundError mid-rmtree), or, listing
        # late, a newer manager's save in flight. Wait here: the folder is clean on return.
        cleanup = getattr(self._manager, "_cleanup_tmp_directory_future", None)
        if cleanup is not None:
            cleanup.result()

    @classmethod
    def reader(cls, directory) -> "Checkpointer":
        """Opens ``directory`` to read another run's checkpoints (an evaluation, the
        next phase's starting weights): read-only, see the class docstring."""
        return cls(directory, async_save=False, read_only=True)

    # -- save ----------------------------------------------------------------------------------

    def save(self, step: int, state: Mapping, meta: dict, force: bool = False) -> bool:
        """Starts saving ``state`` and ``meta`` as ``step``; False where the save interval
        skips this step (``force`` overrides the interval). With async saving this returns
        once the arrays are copied off the devices; the write finishes in the background."""
        if self.read_only:
            raise PermissionError(f"checkpoint folder {self.directory} was opened read-only "
                                  f"(Checkpointer.reader); it cannot save step {step}")
        if not isinstance(state, Mapping):
            raise TypeError(f"checkpoint state must be a mapping of item name -> pytree "
                            f"(e.g. {{'actor': ..., 'critic': ...}}), got {type(state).__name__}")
        for name in state:
            self._check_item_name(name)
        try:
            json.dumps(meta)
        except (TypeError, ValueError) as err:
            raise TypeError(f"checkpoint meta for step {step} is not JSON-serialisable: "
                            f"{err}") from err
        items = {name: ocp.args.StandardSave(_wrap(tree)) for name, tree in state.items()}
        items[META_ITEM] = ocp.args.JsonSave(meta)
        return self._manager.save(int(step), args=ocp.args.Composite(**items), force=force)

    def wait(self):
        """Blocks until every started save is on disk and finalized."""
        self._manager.wait_until_finished()

    def close(self):
        self._manager.wait_until_finished()
        self._manager.close()

    def __enter__(self) -> "Checkpointer":
        return self

    def __exit__(self, *exc):
        self.close()

    # -- read ----------------------------------------------------------------------------------

    def all_steps(self) -> list[int]:
        """Finalized steps, ascending (see ``finalized_steps``)."""
        return finalized_steps(self.directory)

    def latest_step(self) -> int | None:
        steps = self.all_steps()
        return steps[-1] if steps else None

    def saved_items(self, step: int | None = None) -> list[str]:
        """Names of the state items stored at ``step`` (default: the latest)."""
        step = self._resolve_step(step)
        step_dir = self.directory / str(step)
        return sorted(p.name for p in step_dir.iterdir() if p.is_dir() and p.name != META_ITEM)

    def restore(self, abstract_state: Mapping, step: int | None = None) -> tuple[dict, dict]:
        """``(state, meta)`` of ``step`` (default: the latest finalized one). ``abstract_state``
        must name exactly the items that were saved; its leaves' shardings (see
        ``abstract_like``) decide where the restored arrays land - any mesh, not just the
        one that saved them. Shapes must match what was saved; a differing dtype is cast."""
        step = self._resolve_step(step)
        self._check_abstract(abstract_state, step, exact=True)
        state = self._restore(abstract_state, step)
        return state, self.restore_meta(step)

    def restore_items(self, abstract_subtree_by_name: Mapping, step: int | None = None) -> dict:
        """Only the named items of ``step``, e.g. ``{'critic': abstract_critic}`` from a
        Critic Warm-Up checkpoint; nothing else is read from disk."""
        step = self._resolve_step(step)
        self._check_abstract(abstract_subtree_by_name, step, exact=False)
        return self._restore(abstract_subtree_by_name, step)

    def restore_meta(self, step: int | None = None) -> dict:
        step = self._resolve_step(step)
        out = self._manager.restore(step, args=ocp.args.Composite(
            **{META_ITEM: ocp.args.JsonRestore()}))
        return out[META_ITEM]

    # -- helpers -------------------------------------------------------------------------------

    def _check_shapes(self, name: str, target, step: int):
        """Shapes of ``target`` against the item's stored metadata, before Orbax reads any
        array (its own shape error comes mid-read and names neither item nor path)."""
        item_dir = self.directory / str(step) / name
        stored = ocp.StandardCheckpointHandler().metadata(item_dir).tree
        stored_shapes = {jax.tree_util.keystr(path, simple=True, separator="/"): leaf.shape
                         for path, leaf in jax.tree_util.tree_flatten_with_path(stored)[0]
                         if getattr(leaf, "shape", None) is not None}
        for path, leaf in jax.tree_util.tree_flatten_with_path(_wrap(target))[0]:
            key = jax.tree_util.keystr(path, simple=True, separator="/")
            want = stored_shapes.get(key)
            if want is not None and hasattr(leaf, "shape") and tuple(leaf.shape) != tuple(want):
                raise ValueError(f"checkpoint {self.directory / str(step)}: item '{name}' "
                                 f"key '{key}' has shape {tuple(want)} on disk, the abstract "
                                 f"state asks for {tuple(leaf.shape)}")

    def _restore(self, abstract_by_name: Mapping, step: int) -> dict:
        state = {}
        for name, target in abstract_by_name.items():  # one at a time: errors name the item
            self._check_shapes(name, target, step)
            try:
                out = self._manager.restore(step, args=ocp.args.Composite(
                    **{name: ocp.args.StandardRestore(_wrap(target))}))
            except ValueError as err:
                raise ValueError(f"checkpoint {self.directory / str(step)}: item '{name}' does "
                                 f"not match the abstract state: {err}") from err
            state[name] = _unwrap(out[name], target)
        return state

    def _resolve_step(self, step: int | None) -> int:
        steps = self.all_steps()
        if not steps:
            raise FileNotFoundError(f"no finalized checkpoint in {self.directory}")
        if step is None:
            return steps[-1]
        if int(step) not in steps:
            raise FileNotFoundError(f"no finalized checkpoint for step {step} in "
                                    f"{self.directory} (have steps {steps})")
        return int(step)

    def _check_abstract(self, abstract: Mapping, step: int, *, exact: bool):
        if not isinstance(abstract, Mapping):
            raise TypeError(f"abstract state must be a mapping of item name -> abstract pytree, "
                            f"got {type(abstract).__name__}")
        saved = set(self.saved_items(step))
        missing = sorted(set(abstract) - saved)
        if missing:
            raise ValueError(f"checkpoint {self.directory / str(step)} has no item(s) "
                             f"{missing}; it holds {sorted(saved)}")
        unrequested = sorted(saved - set(abstract))
        if exact and unrequested:
            raise ValueError(f"abstract state lacks item(s) {unrequested} stored in checkpoint "
                             f"{self.directory / str(step)}; use restore_items for a partial "
                             f"restore")

    @staticmethod
    def _check_item_name(name):
        if not isinstance(name, str) or not _ITEM_NAME.fullmatch(name) or name == META_ITEM:
            raise ValueError(f"checkpoint state key {name!r} cannot name an item: use a "
                             f"non-empty [A-Za-z0-9_.-] string other than '{META_ITEM}'")
