"""The whole T1 recipe in one job, at every scale: a task pool, tokenizer, oracle validation,
SFT warm start, Critic Warm-Up, PPO with periodic evaluation, final evaluation of base / SFT /
PPO on held-out tasks, and the report.

The laptop (configs/tiny_cpu.py) and the pod (configs/qwen3_30b_a3b.py, t1_qwen35_122b.py)
run these same phases and differ only in numbers and in where things come from: the pool is
generated task families or an outside folder (config.pool.dir: train/, heldout/, optional
validation/), the tokenizer trained on the train split or the model's own
(config.rollouts.tokenizer), the base policy a random init or a Hugging Face checkpoint
(config.init.hf_path), and generation the embedded engine or an SGLang fleet
(config.rollouts.engine): with a fleet, every evaluation plays on it too, each policy
published to it first.

Every phase writes into its own folder of the workdir and is skipped when its output is there,
and the training stages resume from their checkpoints, so re-running the same command after
an interruption continues where it stopped.

As several processes (experiments/launch_local.py, or one per host of a pod; the workdir on a
disk they all see): process 0 writes the pool and the oracle's verdicts, builds the SFT data
and writes every record; all of them train SFT, Warm-Up and PPO over one global mesh and each
plays its share of the live rollouts (t1jax/rollout/source.py) and of every evaluation's
trials. They meet at a rendezvous (t1jax/distributed.py) after each phase.
"""

from __future__ import annotations

import json
import math
import shutil
import time
import uuid
from pathlib import Path

from absl import logging

from t1jax import distributed
from t1jax.faults import kill_point, killing_progress
from t1jax.jobs import UsageError, build
from t1jax.jobs.progress import count_bar, metric_bar

PHASES = ("pool", "oracle", "sft", "warmup", "ppo", "eval", "report")
# run only when config.phases names them, before the others: the TPU fit check (needs libtpu,
# .venv-tpu; t1jax/jobs/aot.py) compiles this config's steps, trains nothing
OPT_IN = ("aot",)
# phases that only write files the others read: process 0 alone plays them
MAIN_ONLY = ("pool", "oracle", "report")


def _done(path: Path) -> bool:
    return (path / "DONE").is_file()


REUSABLE = ("pool", "tokenizer.json", "oracle", "sft", "warmup", "eval/base", "eval/sft",
            "eval/validation/sft")
# What each reusable output is made from: the phase it builds on (linked only if that one is)
# and the config entries it depends on (linked only if the source run's equal this run's: a
# 16-step warm-up never stands in for a 4-step one, a pool of another seed or split never
# stands in for this run's, an SFT evaluation with other sampling never pairs with this one's).
_EVAL_KEYS = ("eval.attempts", "eval.temperature", "eval.top_p", "eval.timeout_s",
              "eval.sampling_seed", "rollouts.system_prompt", "rollouts.max_turns", "rollouts.max_new_tokens", "rollouts.tool_format",
              "rl.max_length", "verifier")
# Config entries added after runs were made: a source's config.json without one holds what
# it then did, the default, so it still compares equal to a run that keeps the default.
# (verifier.where: runs before it verified in a snapshot's fresh sandbox)
_ADDED_LATER = {"eval.sampling_seed": -1, "sft.data_seed": -1, "sft.data_dir": "",
                "rollouts.recorded_dir": "", "pool.dir": "",
                "verifier.where": "snapshot",
                "pool.decontaminate": True,
                "rollouts.tokenizer": "", "rollouts.tool_format": "", "init.hf_path": "",
                "eval.top_p": 1.0, "eval.timeout_s": 0.0}
# Config entries renamed since runs were made: a source's config.json read under the new name
_RENAMED = {"agent.system_prompt": "rollouts.system_prompt"}
REUSE_RULES = {
    "pool": (None, ("seed", "pool")),
    "tokenizer.json": ("pool", ("model.vocab_size", "rollouts.system_prompt",
                                "rollouts.tokenizer")),
    "oracle": ("pool", ("oracle", "verifier")),
    "sft": ("tokenizer.json", ("sft", "model", "init.hf_path", "rollouts.tool_format")),
    "warmup": ("sft", ("warmup", "rl.gamma", "rl.lam", "rl.value_clip", "rl.critic_lr",
                       "rl.value_head_init", "rollouts.max_turns", "rollouts.recorded_dir",
                       "rollouts.max_new_tokens", "rl.max_length", "verifier")),
    "eval/base": ("tokenizer.json", ("model", "init.hf_path") + _EVAL_KEYS),
    "eval/sft": ("sft", _EVAL_KEYS),
    "eval/validation/sft": ("sft", _EVAL_KEYS),
}


def _entry(config: dict | None, dotted: str):
    for part in dotted.split("."):
        if not isinstance(config, dict):
            return None
        config = config.get(part)
    return config


def _with_added_defaults(config: dict) -> dict:
    """A copy of a config dict with every _RENAMED entry under its new name and every
    _ADDED_LATER entry its blocks lack set to the default."""
    config = json.loads(json.dumps(config))
    for old, new in _RENAMED.items():
        (*old_parents, old_leaf), (*parents, leaf) = old.split("."), new.split(".")
        block = _entry(config, ".".join(old_parents))
        target = _entry(config, ".".join(parents))
        if isinstance(block, dict) and old_leaf in block and isinstance(target, dict):
            target.setdefault(leaf, block.pop(old_leaf))
    for dotted, default in _ADDED_LATER.items():
        *parents, leaf = dotted.split(".")
        block = config
        for part in parents:  # a block added later (init) is added with its default
            block = block.setdefault(part, {}) if isinstance(block, dict) else None
        if isinstance(block, dict):
            block.setdefault(leaf, default)
    return config


def link_reused(source: Path, workdir: Path, *, warmup: bool = True,
                config: dict | None = None) -> list[str]:
    """Symlink the phases an ablation does not change from a finished run's workdir (absent
    ones are left to run). Only finished phases are linked, only on top of what they were made
    from (REUSE_RULES), and with `config` (this run's, as a dict) only those whose config
    entries equal the source's config.json; a phase that is not linked runs here. Returns
    what was linked."""
    source = source.resolve()
    if not (source / "pool" / "DONE").is_file():
        raise UsageError(f"config.reuse={source}: not a recipe workdir with a finished pool phase")
    if config is not None:
        config = _with_added_defaults(config)
    linked, have = [], set()
    for name in REUSABLE:
        src, dst = source / name, workdir / name
        if dst.is_symlink() and dst.resolve() == src.resolve():
            have.add(name)  # linked by an earlier call
            continue
        if name == "warmup" and not warmup:
            continue
        after, keys = REUSE_RULES[name]
        if after is not None and after not in have:
            logging.info("not reusing %s: %s is not reused from %s", name, after, source)
            continue
        theirs = made_with(source, name) if config is not None else None
        theirs = None if theirs is None else _with_added_defaults(theirs)
        differs = [k for k in keys if config is not None and
                   (theirs is None or _entry(theirs, k) != _entry(config, k))]
        if differs:
            logging.info("not reusing %s: config %s differs from %s's", name,
                         ", ".join(differs), source)
            continue
        finished = src.is_file() or _done(src) or (src / "summary.json").is_file()
        if not finished or dst.exists() or dst.is_symlink():
            continue
        dst.parent.mkdir(parents=True, exist_ok=True)
        dst.symlink_to(src, target_is_directory=src.is_dir())
        linked.append(name)
        have.add(name)
    return linked


def _log_time(workdir: Path, phase: str, seconds: float) -> None:
    """Append the phase's wall time to timings.jsonl (a resumed phase logs its remainder);
    process 0 writes it."""
    if not distributed.is_main():
        return
    with open(workdir / "timings.jsonl", "a") as f:
        f.write(json.dumps({"phase": phase, "seconds": round(seconds, 1),
                            "time": time.strftime("%Y-%m-%dT%H:%M:%S")}) + "\n")


def _mark(path: Path, info: dict | None = None, made_from: dict | None = None,
          config: dict | None = None) -> None:
    """DONE, with a fresh id for what the phase made, the ids of what it was made from, and
    the config it was made with (config.json is rewritten by every later start of the
    workdir, and a finished phase is not made again: only DONE still says what made it).
    Process 0 writes it."""
    if not distributed.is_main():
        return
    path.mkdir(parents=True, exist_ok=True)
    lineage = {} if made_from is None else {"id": uuid.uuid4().hex, "from": made_from}
    made_with = {} if config is None else {"config": config}
    (path / "DONE").write_text(json.dumps({**(info or {}), **lineage, **made_with}) + "\n")


def made_with(source: Path, phase: str) -> dict | None:
    """The config `phase` of the run in `source` was made with: its DONE's record (the
    tokenizer is the pool phase's; an evaluation's is in its folder's FROM), else the run's
    config.json (runs made before phases recorded it)."""
    record = {"tokenizer.json": source / "pool" / "DONE"}.get(phase, source / phase / "DONE")
    if phase.startswith("eval/"):
        record = source / phase / "FROM"
    if record.is_file():
        config = json.loads(record.read_text() or "{}").get("config")
        if config is not None:
            return config
    path = source / "config.json"
    return json.loads(path.read_text()) if path.is_file() else None


# The training phases each finished phase was made from. Checked on every start: a workdir whose
# upstream changed under it (a --config.reuse source run again, a phase deleted and redone)
# would otherwise pair the results of two different runs without a word.
UPSTREAM = {"sft": (), "warmup": ("sft",), "ppo": ("sft", "warmup")}


def done_id(path: Path) -> str | None:
    """The id a finished phase's DONE records (None: unfinished, or made before ids were)."""
    marker = path / "DONE"
    return json.loads(marker.read_text() or "{}").get("id") if marker.is_file() else None


def _per_category(tasks, n: int):
    """The first `n` tasks of each category (n < 0: all). The oracle phase checks a sample of
    the train split: its instances come from the same templates, and the SFT-data phase plays
    and verifies every train solution anyway (an unsolved one is dropped and logged)."""
    if n < 0:
        return list(tasks)
    seen: dict = {}
    out = []
    for task in tasks:
        key = task.category
        if seen.get(key, 0) < n:
            seen[key] = seen.get(key, 0) + 1
            out.append(task)
    return out


def _played(summary: dict, out: Path) -> dict:
    """The summary of an evaluation in which some trial was played; else a RuntimeError with
    the first trial's error. When every trial ends in an infrastructure error (the engine or
    the sandboxes broken, not the policy), the rates would read as a policy that scores its
    verifier's do-nothing share (and they are excluded from the rates: none would be left)."""
    infra = summary["failure_modes"].get("infra_error", 0)
    if summary["trials"] or not infra:
        return summary
    rows = [json.loads(line) for line in (out / "trials.jsonl").read_text().splitlines()]
    error = next((r.get("error") or "" for r in rows if r.get("error")), "")
    raise RuntimeError(f"evaluation {out}: every one of its {infra} trials ended in "
                       f"an infrastructure error, so it measures nothing (remove the folder to "
                       f"evaluate again). The first trial's error ends with: {error[-600:]}")


def outside_pool(config) -> Path | None:
    """config.pool.dir as a Path (None: the pool is generated task families)."""
    folder = config.pool.dir
    return Path(folder).resolve() if folder else None


def check_sources(config) -> None:
    """Where the pool, tokenizer, base policy and generation come from, checked before any
    phase runs: each mistake named by its config key, not found hours in."""
    from t1jax.model.config import ModelConfig, model_config_from
    pool, r = outside_pool(config), config.rollouts
    if pool is not None:
        missing = [name for name in ("train", "heldout") if not (pool / name).is_dir()]
        if missing:
            raise UsageError(f"config.pool.dir={pool} has no {' or '.join(missing)} folder (an "
                             "outside pool holds train/, heldout/ (the test split) and "
                             "optionally validation/, each a folder of task folders)")
        if not r.tokenizer:
            raise UsageError(f"config.pool.dir={pool} needs config.rollouts.tokenizer (the "
                             "model's tokenizer.json): a tokenizer is trained only for the "
                             "generated task families")
    if r.tokenizer and not Path(r.tokenizer).is_file():
        raise UsageError(f"config.rollouts.tokenizer={r.tokenizer} is not a file")
    data_dir, recorded = config.sft.data_dir, r.recorded_dir
    if data_dir and not (Path(data_dir).is_dir() and any(Path(data_dir).glob("*.npz"))):
        raise UsageError(f"config.sft.data_dir={data_dir} holds no .npz samples (what "
                         "t1jax.rollout.sample.save_samples writes)")
    if recorded and not (Path(recorded).is_dir() and any(Path(recorded).glob("step_*/"))):
        raise UsageError(f"config.rollouts.recorded_dir={recorded} holds no step_* folders "
                         "(what live rollouts record in <phase>/rollouts/)")
    if pool is not None and config.sft.teacher_slips and not data_dir:
        raise UsageError("config.sft.teacher_slips=True needs the generated task families "
                         "(a slip is a family's own wrong command); an outside pool "
                         f"(config.pool.dir={pool}) runs with --config.sft.teacher_slips=False")
    hf_path = config.init.hf_path
    if hf_path:
        if not Path(hf_path, "config.json").is_file():
            raise UsageError(f"config.init.hf_path={hf_path} has no config.json "
                             "(a Hugging Face model directory)")
        theirs, ours = ModelConfig.from_pretrained(hf_path), model_config_from(config.model)
        def shape(cfg) -> dict:  # what the weights' shapes depend on
            keys = ("model_type", "vocab_size", "hidden_size", "intermediate_size",
                    "moe_intermediate_size", "num_hidden_layers", "num_attention_heads",
                    "num_key_value_heads", "num_experts", "num_experts_per_tok")
            return {**{k: getattr(cfg, k) for k in keys},
                    "head_dim": cfg.head_dim or cfg.hidden_size // cfg.num_attention_heads}
        ours, theirs = shape(ours), shape(theirs)
        differs = [f"{k}: config.model {ours[k]} vs {theirs[k]}" for k in ours
                   if ours[k] != theirs[k]]
        if differs:
            raise UsageError(f"config.model does not describe config.init.hf_path={hf_path} ("
                             + "; ".join(differs) + ")")
    if r.engine not in ("embedded", "fleet"):
        raise UsageError(f"config.rollouts.engine={r.engine!r}; choose embedded or fleet")
    if r.engine == "fleet" and not r.fleet_urls:
        raise UsageError("config.rollouts.engine='fleet' needs config.rollouts.fleet_urls")


class Recipe:
    def __init__(self, config, workdir: Path):
        self.config, self.workdir = config, workdir
        self.pool_dir = workdir / "pool"
        self.images: dict = {}  # task id -> built image, for every phase of the run
        self._image_cache = None
        self.config_dict = json.loads(config.to_json_best_effort())  # recorded in each DONE
        self._stack: build.TaskStack | None = None
        self._splits: dict = {}
        self.bars = None  # job_progress() bars while run() is active
        self._live_engine = None  # the engine of the live rollouts being played

    # -- shared pieces -----------------------------------------------------------------------

    def stack(self) -> build.TaskStack:
        """The train split's task stack (its reward scale is the run's), built once."""
        if self._stack is None:
            from tokenizers import Tokenizer
            train = self.split("train")  # (a UsageError where the pool phase has not run)
            tok = Tokenizer.from_file(str(self.workdir / "tokenizer.json"))
            self._stack = build.task_stack(self.config, train, tok)
        return self._stack

    def site(self, run_id: str):
        """Where this run's trials of `run_id` run (TaskStack.site), every phase sharing one
        image cache (self.images): each task's image is built once per run."""
        from t1jax.rollout.fan_out import Images
        s = self.stack()
        if self._image_cache is None:
            self._image_cache = Images(s.backend, self.images)
        return s.site(self.config, run_id, self._image_cache)

    def config_json(self) -> str:
        """The run's config, kept in every checkpoint's meta (what made these weights)."""
        return json.dumps(self.config_dict)

    def hf_path(self) -> str:
        """config.init.hf_path: the base policy's Hugging Face checkpoint ("" = random init)."""
        return self.config.init.hf_path

    def oracle_episode(self):
        """What the teacher's SFT episodes take of the run's EpisodeSettings (its prompt, tool
        format, row budget and verifier; the teacher plays greedily, its own turns)."""
        from t1jax.model.config import model_config_from
        return self.episode(temperature=0.0, max_positions=model_config_from(
            self.config.model).max_position_embeddings)

    def episode(self, *, temperature: float, max_positions: int, top_p: float = 1.0,
                timeout_s: float = 0.0):
        """The run's EpisodeSettings (build.episode_settings) within one training row
        (rl.max_length): what its evaluations and oracle episodes play."""
        n = self.config.rl.max_length
        return build.episode_settings(self.config, temperature=temperature, max_tokens=n,
                                      max_positions=max_positions, engine_len=n, top_p=top_p,
                                      timeout_s=timeout_s)

    def model(self):
        """A CausalLM to evaluate, at config.seed's initialisation: whole on one device for
        the embedded engine, which generates from it; over the training mesh for a fleet,
        which is only sent its weights (export_hf gathers one tensor at a time)."""
        if self.config.rollouts.engine != "fleet":
            return build.policy(self.config)
        import jax
        return build.policy(self.config, build.mesh_from(self.config, jax.devices()))

    def base_policy(self):
        """The untrained policy: config.model at config.seed's initialisation, or the weights
        of config.init.hf_path."""
        policy = self.model()
        if self.hf_path():
            from t1jax.model.hf_io import load_hf
            policy = load_hf(policy, self.hf_path())
        return policy

    def trainer(self, stage: str):
        """On the default platform's first devices, whatever platform config.mesh names."""
        import jax
        c = self.config
        return build.trainer(c, build.mesh_from(c, jax.devices()),
                             sft_steps=c.sft.steps if stage == "sft" else None)

    # -- phases ------------------------------------------------------------------------------

    def need_pool(self) -> None:
        """A UsageError, not a missing-file trace, when a phase that plays tasks runs in a
        workdir whose pool phase has not finished."""
        if not _done(self.pool_dir):
            raise UsageError(f"{self.workdir} has no finished pool phase, which the phases "
                             "asked for play tasks from: add pool to --config.phases (SFT "
                             "on config.sft.data_dir and Warm-Up / PPO on "
                             "config.rollouts.recorded_dir need none)")

    def split(self, name: str) -> list:
        """The pool's tasks of split `name`: train, heldout (the test split, evaluated only by
        the final evaluations) or validation (settings are chosen on it; [] in a pool without
        one). Read once."""
        if name not in self._splits:
            from t1jax.tasks.pool import load_pool
            self.need_pool()
            folder = self.pool_dir / name
            self._splits[name] = ([] if name == "validation" and not folder.is_dir()
                                  else load_pool(folder).tasks)
        return self._splits[name]

    def eval_dir(self, label: str, split: str = "test") -> Path:
        root = self.workdir / "eval"
        return root / label if split == "test" else root / split / label

    def final_labels(self) -> list[tuple[str, str]]:
        """(label, split) of the final evaluations: base, SFT and PPO on the test split, SFT
        and PPO on the validation split (when the pool has one)."""
        labels = [("base", "test"), ("sft", "test"), ("ppo", "test")]
        return labels + ([("sft", "validation"), ("ppo", "validation")]
                         if self.split("validation") else [])

    def made_from(self, phase: str) -> dict:
        return {up: done_id(self.workdir / up) for up in UPSTREAM[phase]}

    def check_lineage(self, wanted) -> None:
        """The finished phases this job would skip or report (of `wanted`) were made from the
        phases the workdir holds now; else a UsageError naming what to remove."""
        stale, unknown = [], " (made by a t1jax that recorded no lineage: it cannot be checked)"
        for phase in [p for p in UPSTREAM if p in wanted]:
            marker = self.workdir / phase / "DONE"
            if not marker.is_file():
                continue
            made = json.loads(marker.read_text() or "{}").get("from")
            if made is None and UPSTREAM[phase]:
                stale.append(f"{self.workdir / phase}{unknown}")
            elif made is not None and made != self.made_from(phase):
                stale.append(f"{self.workdir / phase} (made from another "
                             f"{' / '.join(UPSTREAM[phase])})")
        reported = {"eval", "report"} & set(wanted)
        # every final evaluation that may exist (not final_labels: it reads the pool, which a
        # fresh workdir has not written yet); FROM is written before the first trial
        evaluated = [(label, split) for label in ("sft", "ppo") for split in ("test", "validation")]
        for label, split in evaluated if reported else []:
            folder = self.eval_dir(label, split)
            record = folder / "FROM"
            if record.is_file():
                if json.loads(record.read_text())["id"] != done_id(self.workdir / label):
                    stale.append(f"{folder} (an evaluation of another {label})")
            elif any((folder / name).is_file()
                     for name in ("summary.json", "trials.jsonl", "trials.jsonl.partial")) \
                    or any(folder.glob("trials.p*.jsonl.partial")):
                stale.append(f"{folder}{unknown}")
        if stale:
            raise UsageError(
                "this workdir's results were made from phases it no longer holds (a "
                "--config.reuse source made again, or a phase redone): " + "; ".join(stale)
                + ". They would be reported against results of another run: remove them "
                "(they are made again) or use a new --workdir")

    def finished(self, phase: str) -> bool:
        if phase == "eval":
            return all((self.eval_dir(label, split) / "summary.json").is_file()
                       for label, split in self.final_labels())
        return _done(self.workdir / phase)

    def pool(self) -> None:
        from t1jax.rollout.tokenizer import train_tokenizer
        from t1jax.curation import families
        c = self.config.pool
        if not _done(self.pool_dir) and outside_pool(self.config) is not None:
            self._outside_pool(outside_pool(self.config))
        elif not _done(self.pool_dir):
            plan = families.write_family_pool(
                self.pool_dir, seed=self.config.seed, train_per_family=c.train_per_family,
                heldout_per_family=c.heldout_per_family,
                heldout_keys_per_family=c.heldout_keys_per_family,
                validation_per_family=c.validation_per_family,
                validation_keys_per_family=c.validation_keys_per_family,
                families=[f for f in c.families.split(",") if f] or None)
            kill_point("pool", 1, "written")  # tasks written; no tokenizer, no DONE yet
            # from the train split's text only: validation and test never shape it
            if self.config.rollouts.tokenizer:  # the model's own
                shutil.copyfile(self.config.rollouts.tokenizer, self.workdir / "tokenizer.json")
            else:
                tok = train_tokenizer(self.config.model.vocab_size, families.family_corpus(
                    self.pool_dir, system_prompt=self.config.rollouts.system_prompt,
                    splits=("train",)))
                tok.save(str(self.workdir / "tokenizer.json"))
            _mark(self.pool_dir, {"train": len(plan["train"]), "heldout": len(plan["heldout"]),
                                  "validation": len(plan["validation"])},
                  config=self.config_dict)

    def _outside_pool(self, source: Path) -> None:
        """config.pool.dir as this run's pool: its splits linked into workdir/pool (the user's
        folder is never written), each loaded (a malformed task is an error naming it) and the
        train split refused if it overlaps the test or validation split; the model's
        tokenizer copied beside it."""
        from t1jax.tasks.decontam import ContaminationError, check_pool
        from t1jax.tasks.pool import load_pool
        splits = [n for n in ("train", "heldout", "validation") if (source / n).is_dir()]
        counts = {}
        for name in splits:
            loaded = load_pool(source / name)  # raises naming every malformed task
            if not loaded.tasks:
                raise UsageError(f"config.pool.dir: {source / name} holds no tasks")
            counts[name] = len(loaded.tasks)
        try:
            if self.config.pool.decontaminate:
                check_pool(load_pool(source / "train").tasks,
                           [source / n for n in splits if n != "train"])
        except ContaminationError as err:
            raise UsageError(f"config.pool.dir={source}: the train split overlaps a held-out "
                             f"one (--config.pool.decontaminate=False if that is the point: "
                             f"held-out entities of the same families): {err}") from err
        self.pool_dir.mkdir(parents=True, exist_ok=True)
        for name in splits:
            link = self.pool_dir / name
            if link.is_symlink() or link.exists():
                link.unlink()
            link.symlink_to(source / name, target_is_directory=True)
        shutil.copyfile(self.config.rollouts.tokenizer, self.workdir / "tokenizer.json")
        _mark(self.pool_dir, {**counts, "source": str(source)}, config=self.config_dict)

    def oracle(self) -> None:
        from t1jax.curation.validate import validate_pool
        out = self.workdir / "oracle"
        if _done(out):
            return
        stack = self.stack()
        checked = (self.split("heldout") + self.split("validation")
                   + _per_category(stack.tasks, self.config.oracle.train_per_family))
        bar = killing_progress(count_bar(self.bars, "oracle + do-nothing episodes",
                                         2 * len(checked), ("episode",)),
                               "oracle", "episode", kind="episode")
        summary = validate_pool(checked, self.site(f"recipe-oracle-{self.workdir.name}"),
                                out_dir=out, progress=bar,
                                verifier=build.verifier_settings(self.config))
        # our own generator names its invariants: a goal assertion doing nothing passes is a
        # generator bug here, though only a leak in an outside pool, whose broken tasks the
        # SFT data phase drops (unsolved) and whose leaks the user must see
        unhealthy = not summary["pool_healthy"] or summary["nothing_leaks"]
        if unhealthy and outside_pool(self.config) is None:
            raise RuntimeError(f"the generated pool is not healthy: see {out}/results.md")
        if unhealthy:
            logging.warning("the outside pool %s is not healthy (a reference solution fails "
                            "or doing nothing passes an assertion): see %s/results.md",
                            outside_pool(self.config), out)
        _mark(out, summary, config=self.config_dict)

    def sft(self) -> None:
        from t1jax.rl import loop
        from t1jax.rollout.oracle_data import Teacher, oracle_samples
        from t1jax.rollout.sample import dataset_complete, load_samples, save_dataset
        from t1jax.curation import families
        out = self.workdir / "sft"
        if _done(out):
            return
        # the user's own samples (config.sft.data_dir), or the oracle's episodes played here
        data = Path(self.config.sft.data_dir) if self.config.sft.data_dir else out / "sft_data"
        # never a partial set a killed run left; process 0 builds it, every process reads it
        if distributed.is_main() and not self.config.sft.data_dir and not dataset_complete(data):
            s = self.stack()
            trainer_cfg = self.config.model
            samples, skipped = oracle_samples(
                s.tasks, self.site(f"recipe-sft-oracle-{self.workdir.name}"), s.tokenizer,
                num_layers=trainer_cfg.num_hidden_layers,
                top_k=trainer_cfg.num_experts_per_tok, episode=self.oracle_episode(),
                teacher=Teacher() if outside_pool(self.config) else Teacher(
                    final_answer=families.FINAL_ANSWER),
                progress=killing_progress(count_bar(self.bars, "SFT data: oracle episodes",
                                                    len(s.tasks)), "sft_data", "episode"))
            if self.config.sft.teacher_slips:
                samples, skipped = self._add_slips(s, samples, skipped)
            for task_id, why in skipped:
                logging.warning("SFT data: skipped %s: %s", task_id, why)
            save_dataset(samples, data, skipped=len(skipped))
        distributed.rendezvous("recipe/sft_data")
        trainer = self.trainer("sft")
        build.start_weights(trainer, out / "checkpoints", hf_path=self.hf_path())
        order_seed = self.config.sft.data_seed
        loop.run(trainer, loop.DatasetBatches(load_samples(data), self.config.sft.batch_size,
                                              self.config.seed if order_seed < 0 else order_seed),
                 out,
                 loop.LoopOptions(steps=self.config.sft.steps, stage="sft",
                                  checkpoint_every=min(self.config.sft.checkpoint_every,
                                                       self.config.sft.steps),
                                  keep_checkpoints=self.config.checkpoint.keep),
                 progress=metric_bar(self.bars, "SFT", self.config.sft.steps, "sft/nll"),
                 config_json=self.config_json())
        _mark(out, made_from=self.made_from("sft"), config=self.config_dict)

    def _add_slips(self, s, samples: list, skipped: list) -> tuple[list, list]:
        """The teacher's slip on every train task whose reference was kept (attempt 1 beside
        the reference's 0), played and verified like the reference and kept only as a clean
        miss. A slip alone would teach a task nothing but the slip: its task is skipped."""
        from t1jax.rollout.oracle_data import Teacher, oracle_samples
        from t1jax.curation import families
        instances = json.loads((self.pool_dir / "split.json").read_text())["instances"]
        cfg = self.config.model
        with_reference = {sample.metadata["task_id"] for sample in samples}
        tasks = [t for t in s.tasks if t.task_id in with_reference]
        slips, missed = oracle_samples(
            tasks, self.site(f"recipe-sft-slips-{self.workdir.name}"), s.tokenizer,
            num_layers=cfg.num_hidden_layers, top_k=cfg.num_experts_per_tok,
            episode=self.oracle_episode(), teacher=Teacher(
                commands_of=lambda t: ([families.slip_command(*instances[t.task_id])], []),
                final_answer=families.FINAL_ANSWER, want_solved=False, source="slip",
                attempt=1),
            progress=killing_progress(count_bar(self.bars, "SFT data: teacher slips",
                                                len(tasks)), "sft_data", "episode"))
        return samples + slips, skipped + [(tid, f"slip: {why}") for tid, why in missed]

    def recorded(self) -> str:
        """config.rollouts.recorded_dir: step_*/ folders of samples (what live rollouts
        write) that Warm-Up and PPO replay instead of playing ("" = play live)."""
        return self.config.rollouts.recorded_dir

    def _rollouts(self, trainer, out: Path, stage: str):
        """Warm-Up's and PPO's rollouts: played live in sandboxes, or replayed from
        config.rollouts.recorded_dir (step t reads its t-th folder, cycling; no sandbox, no
        engine: the trainer alone, what its ablations and resume tests want)."""
        if self.recorded():
            from t1jax.rl.loop import RecordedRollouts
            return RecordedRollouts(self.recorded())
        return self._live(trainer, out, stage)

    def _live(self, trainer, out: Path, stage: str):
        live = build.live_rollouts(self.config, trainer, out, self.stack(), stage=stage)
        self._live_engine = live.engine  # PPO's periodic evaluations play on it (fleet)
        return live

    def _options(self, steps: int, stage: str, **kw):
        c = self.config.checkpoint
        from t1jax.rl.loop import LoopOptions
        return LoopOptions(steps=steps, stage=stage, checkpoint_every=c.every,
                           keep_checkpoints=c.keep, **kw)

    def warmup(self) -> None:
        """Critic Warm-Up until the critic is healthy: it stops once explained variance on
        fresh rollouts (rl.critic.warmup_health) stays above warmup.min_ev over
        warmup.ev_window steps, after at least warmup.min_steps; warmup.steps caps it, and a
        cap reached unhealthy is said loudly (PPO then starts from a critic that does not yet
        predict returns). warmup.ev_window=0: exactly warmup.steps steps."""
        from t1jax.checkpoint import finalized_steps
        from t1jax.metrics_log import read_metrics
        from t1jax.rl import loop
        from t1jax.rl.critic import warmup_health
        out, w = self.workdir / "warmup", self.config.warmup
        if _done(out) or w.steps <= 0:
            return
        trainer = self.trainer("critic_warmup")
        build.start_weights(trainer, out / "checkpoints",  # none after a killed first step
                            actor=self.workdir / "sft" / "checkpoints")
        gate = dict(min_steps=w.min_steps, window=w.ev_window, min_ev=w.min_ev)
        resumed = (finalized_steps(out / "checkpoints") or [0])[-1]

        def ev_of(row: dict) -> float:  # metrics.jsonl holds a NaN as null
            value = row.get("critic/explained_variance")
            return float("nan") if value is None else float(value)

        evs = [ev_of(row) for row in read_metrics(out) if row.get("step", 0) <= resumed]
        bar = metric_bar(self.bars, "Critic Warm-Up", w.steps, "critic/explained_variance")

        def healthy(step, metrics) -> bool:
            evs.append(ev_of(metrics))
            return warmup_health(evs, **gate)[0]

        steps = resumed if warmup_health(evs, **gate)[0] else w.steps  # healthy before a kill
        loop.run(trainer, self._rollouts(trainer, out, "critic_warmup"), out,
                 self._options(steps, "critic_warmup"), progress=bar,
                 stop=healthy, config_json=self.config_json())
        ok, window_ev = warmup_health(evs, **gate)
        if w.ev_window > 0 and not ok:
            logging.warning(
                "Critic Warm-Up reached its cap of %d steps unhealthy: explained variance %.3f "
                "over its last %d steps (wanted > %.3f). PPO starts from a critic that does not "
                "yet predict returns; raise config.warmup.steps or look at rl.critic_lr",
                w.steps, window_ev, w.ev_window, w.min_ev)
        finite = lambda v: None if math.isnan(v) else round(v, 6)  # noqa: E731
        _mark(out, {"steps": len(evs), "healthy": ok, "ev_window_mean": finite(window_ev),
                    "explained_variance": [finite(v) for v in evs]},
              made_from=self.made_from("warmup"), config=self.config_dict)

    def ppo(self) -> None:
        from t1jax.checkpoint import finalized_steps
        from t1jax.rl import loop
        out = self.workdir / "ppo"
        if _done(out):
            return
        trainer = self.trainer("ppo")
        build.start_weights(trainer, out / "checkpoints",  # none after a killed first step
                            actor=self.workdir / "sft" / "checkpoints",
                            critic=(self.workdir / "warmup" / "checkpoints"
                                    if self.config.warmup.steps > 0 else ""),
                            reward_scale=None if self.recorded() else self.stack().scale.value)
        bar = metric_bar(self.bars, "PPO", self.config.ppo.steps, "reward/mean")
        every = 0 if self.recorded() else self.config.eval.every  # no pool to evaluate on
        if every and not self.split("validation"):
            logging.warning("no validation split in %s: no periodic evaluation during PPO (the "
                            "test split is only for the final evaluations)", self.pool_dir)
            every = 0

        def due(step: int) -> bool:  # a periodic evaluation after this step
            return bool(every) and step % every == 0 and step < self.config.ppo.steps

        resumed = finalized_steps(out / "checkpoints")
        if resumed and due(resumed[-1]):
            # killed while evaluating its newest checkpoint: the resumed loop starts after that
            # step and would never evaluate it, so the report would silently lack the row
            self.evaluate(f"step_{resumed[-1]:04d}", build.restored_actor(
                self.model(), out / "checkpoints"), split="validation")

        def tick(step, metrics):
            bar(step, metrics)
            if due(step):  # with a fleet, on the servers that hold this step's weights
                self.evaluate(f"step_{step:04d}", trainer.actor_model(), split="validation",
                              served=self._live_engine)

        loop.run(trainer, self._rollouts(trainer, out, "ppo"), out,
                 self._options(self.config.ppo.steps, "ppo", schedule=self.config.schedule),
                 progress=tick, config_json=self.config_json())
        _mark(out, made_from=self.made_from("ppo"), config=self.config_dict)

    def eval_seed(self) -> int:
        """config.eval.sampling_seed, or with -1 (the default) one derived from config.seed:
        another evaluation draw of the same policies without another pool."""
        return build.eval_seed(self.config)

    def evaluate(self, label: str, policy, split: str = "test", served=None) -> dict:
        """Evaluation of `policy` (a CausalLM) on the test (held-out) or validation split, k
        attempts per task. Every label samples with one seed (eval_seed): a rerun repeats,
        and base / SFT / PPO meet the same random numbers per (task, attempt, turn), so their
        differences are paired. Every process calls it and plays every N-th (task, attempt),
        in its own sandboxes: from its own whole copy of the policy (embedded engine), or on
        the fleet through its own client, after every process has published its shards of the
        policy (`served`: a fleet engine already holding it, PPO's live one); process 0 writes
        the evaluation's files from everyone's rows (None on the others)."""
        out = self.eval_dir(label, split)
        if (out / "summary.json").is_file():
            return _played(json.loads((out / "summary.json").read_text()), out)
        published = None
        if self.config.rollouts.engine == "fleet":
            engine = served
            if engine is None:
                engine, published = self._fleet_holding(policy, f"eval-{split}-{label}")
        else:
            policy = build.local_model(policy)  # an allgather in a multi-process job
            engine = build.rollout_engine(self.config, self.config.rl.max_length, policy)
        try:
            summary = self._play_evaluation(label, split, engine, out,
                                            policy.model.cfg.max_position_embeddings)
        finally:
            if published is not None and distributed.is_main():  # loaded: the folder is spent
                shutil.rmtree(published, ignore_errors=True)
        return None if summary is None else _played(summary, out)

    def _fleet_holding(self, policy, version: str):
        """(a FleetEngine whose servers hold `policy` as `version`, the published folder).
        Every process calls it (each writes its shards)."""
        r = self.config.rollouts
        engine = build.rollout_engine(self.config, self.config.rl.max_length,
                                      model_cfg=policy.model.cfg)
        weights_dir = Path(r.weights_dir) if r.weights_dir else self.workdir / "published"
        path = build.publish_weights(engine.client, policy, weights_dir, version,
                                     build.tokenizer_files(self.config))
        return engine, path

    def _play_evaluation(self, label: str, split: str, engine, out: Path,
                         max_positions: int) -> dict:
        from t1jax.rollout.evaluate import evaluate
        s = self.stack()
        tasks = self.split("heldout") if split == "test" else self.split("validation")
        name = label if split == "test" else f"{split}_{label}"
        c = self.config
        me, processes = distributed.process_index(), distributed.process_count()
        played = len(range(me, len(tasks) * c.eval.attempts, processes))  # this one's share
        # the policy as evaluated: at eval.temperature within one row, TITO whatever a training
        # ablation (rollouts.tito=False) does to its rollouts
        episode = self.episode(temperature=c.eval.temperature, max_positions=max_positions,
                               top_p=c.eval.top_p, timeout_s=c.eval.timeout_s)
        # each process reaps only its own sandboxes
        site = self.site(f"recipe-eval-{self.workdir.name}-{name}"
                         + (f"-p{me}" if processes > 1 else ""))
        return evaluate(tasks, engine, s.tokenizer, site, label=label,
                        episode=episode.replace(tito=True), attempts=c.eval.attempts,
                        harness="tools", out_dir=out, seed=self.eval_seed(),
                        progress=killing_progress(
                            count_bar(self.bars, f"eval {name}: trials", played, ("trial",)),
                            f"eval_{name}", "trial", kind="trial"),
                        share=(me, processes),
                        gather=(None if processes == 1 else lambda rows: distributed.
                                exchange_objects(f"eval/{split}/{label}", rows)))

    def final_evals(self) -> None:
        from t1jax.checkpoint import has_checkpoint
        for label, split in self.final_labels():
            if (self.eval_dir(label, split) / "summary.json").is_file():
                continue  # kept: no need to read the checkpoint
            ckpt = self.workdir / label / "checkpoints"
            if label != "base" and not has_checkpoint(ckpt):
                logging.warning("eval: no %s row: %s holds no finished checkpoint", label, ckpt)
                continue
            folder = self.eval_dir(label, split)
            if distributed.is_main():  # what it evaluates, before any trial
                folder.mkdir(parents=True, exist_ok=True)
                (folder / "FROM").write_text(json.dumps({"id": done_id(self.workdir / label),
                                                         "config": self.config_dict}) + "\n")
            # base: the untrained policy, no DONE, id None
            self.evaluate(label, self.base_policy() if label == "base" else
                          build.restored_actor(self.model(), ckpt), split=split)


def run(config, workdir: Path) -> int:
    from t1jax.jobs.progress import job_progress

    from t1jax.report.summary import write_report
    wanted = [p for p in config.phases.split(",") if p] or list(PHASES)
    unknown = sorted(set(wanted) - set(PHASES) - set(OPT_IN))
    if unknown:
        raise UsageError(f"config.phases names unknown phases {unknown}; known: "
                         f"{PHASES + OPT_IN}")
    if "aot" in wanted:
        if distributed.requested() is not None:
            raise UsageError("the aot phase compiles for a whole TPU topology (every host's "
                             "chips) from one process; run it as one process")
        from t1jax.jobs import aot
        code = aot.check(config, workdir)
        wanted.remove("aot")
        if code or not wanted:
            return code
    if "ppo" in wanted:  # before hours of SFT and Warm-Up, not when PPO starts
        build.check_off_policy(config, config.rollouts.carry_over)
    check_sources(config)
    recipe = Recipe(config, workdir)
    if config.reuse and distributed.is_main():
        workdir.mkdir(parents=True, exist_ok=True)
        linked = link_reused(Path(config.reuse), workdir, warmup=config.warmup.steps > 0,
                             config=json.loads(config.to_json_best_effort()))
        logging.info("reusing %s from %s", ", ".join(linked) or "nothing", config.reuse)
    distributed.rendezvous("recipe/start")
    recipe.check_lineage(wanted)
    with job_progress() as bars:
        recipe.bars = bars
        for phase in [p for p in PHASES if p in wanted and p != "report"]:
            finished = recipe.finished(phase)  # a finished phase returns at once: not timed
            t0 = time.monotonic()
            if phase not in MAIN_ONLY or distributed.is_main():
                getattr(recipe, "final_evals" if phase == "eval" else phase)()
            # the same rendezvous on every process whether the phase ran or was finished
            distributed.rendezvous(f"recipe/{phase}")
            if not finished:
                _log_time(workdir, phase, time.monotonic() - t0)
        recipe.bars = None
    if "report" in wanted and distributed.is_main():
        out = write_report(workdir)
        print((out / "summary.md").read_text())
    return 0
