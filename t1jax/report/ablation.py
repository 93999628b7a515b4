"""Single-axis ablation arms of the tiny recipe, run and read back (what the notebooks use).

An arm is `experiments/run.py` on a recipe config (configs/tiny_cpu.py or
configs/ablations.py:<variant>) in its own workdir, reusing a finished base run's pool,
tokenizer, SFT actor and Critic Warm-Up (`--config.reuse`), so arms differ only in what their
config changes and in the seed they are given. Arms run as subprocesses, the way a user runs
them, and resume like any recipe run: re-running a finished arm costs nothing.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path

from t1jax.metrics_log import read_jsonl
from t1jax.rollout.eval_summary import scored
from t1jax.sandbox.output import strip_ansi

ROOT = Path(__file__).resolve().parents[2]  # the repository: experiments/, configs/
BASE_PHASES = ("pool", "oracle", "sft", "warmup")


class ArmFailed(RuntimeError):
    """An arm's run exited non-zero; the message names the command and quotes its output."""


def _readable(text: str, limit: int = 3000) -> str:
    """The tail of a run's stderr without terminal control codes (its progress bars)."""
    text = strip_ansi(text)
    return "\n".join(line for line in text.splitlines() if line.strip())[-limit:]


def _run(workdir: Path, config: str, overrides: list[str], timeout_s: float) -> float:
    cmd = [sys.executable, str(ROOT / "experiments" / "run.py"), "--config",
           str(ROOT / "configs" / config), "--workdir", str(workdir), *overrides]
    t0 = time.monotonic()
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout_s)
    if proc.returncode != 0:
        raise ArmFailed(f"{' '.join(cmd)} exited {proc.returncode}:\n{_readable(proc.stderr)}")
    return time.monotonic() - t0


def base_finished(base, evaluated: bool = False) -> bool:
    """Pool, oracle, SFT and Critic Warm-Up finished in `base` (and, with `evaluated`, the
    held-out evaluations of the random-init and SFT policies, which arms then reuse)."""
    base = Path(base)
    return all((base / phase / "DONE").is_file() for phase in BASE_PHASES) and (
        not evaluated or all((base / "eval" / label / "summary.json").is_file()
                             for label in ("base", "sft")))


def ensure_base(base, overrides=(), *, evaluated: bool = False,
                timeout_s: float = 4 * 3600) -> float:
    """Run the recipe's phases up to Critic Warm-Up (and, with `evaluated`, the base and SFT
    held-out evaluations) into `base` unless finished: about 30 (35) minutes on 2 cores at the
    tiny_cpu defaults. Returns the seconds it took (0 when there was nothing to do)."""
    base = Path(base)
    if base_finished(base, evaluated):
        return 0.0
    phases = BASE_PHASES + (("eval",) if evaluated else ())
    return _run(base.resolve(), "tiny_cpu.py",
                [f"--config.phases={','.join(phases)}", *overrides], timeout_s)


def run_arm(workdir, config: str, base, *, seed: int = 0, ppo_steps: int,
            evaluate: bool = False, overrides=(), timeout_s: float = 4 * 3600) -> float:
    """PPO (and, with `evaluate`, its held-out evaluation) of `config` from `base`'s SFT
    actor and warmed critic. Returns the seconds it took (0 for an arm already finished).
    A phase whose config block differs from the base's (say a longer Critic Warm-Up, through
    `overrides`) is not reused but runs in the arm (t1jax.jobs.recipe.link_reused).

    `workdir/arm.json` records the arm's settings: a finished arm is read back only when they
    match, and a workdir holding an arm with other settings is an error, never overwritten."""
    workdir = Path(workdir)
    settings = {"config": config, "base": str(Path(base).resolve()), "seed": seed,
                "ppo_steps": ppo_steps, "evaluate": evaluate, "overrides": list(overrides)}
    record = workdir / "arm.json"
    if record.is_file():
        before = json.loads(record.read_text())
        if before != settings:
            changed = sorted(k for k in settings.keys() | before.keys()
                             if before.get(k) != settings.get(k))
            raise ArmFailed(f"{workdir} holds an arm run with other settings ({', '.join(changed)}"
                            f": {before} vs now {settings}); use another workdir or delete it")
        if (workdir / "ppo" / "DONE").is_file() and (
                not evaluate or (workdir / "eval" / "ppo" / "summary.json").is_file()):
            return 0.0
    elif workdir.exists() and any(workdir.iterdir()):
        raise ArmFailed(f"{workdir} is not empty and was not made by run_arm (no arm.json)")
    if not base_finished(base, evaluated=evaluate):
        raise ArmFailed(f"base run {base} has not finished {BASE_PHASES}"
                        + (" and its base/SFT evaluations" if evaluate else "")
                        + ": run ensure_base first")
    workdir.mkdir(parents=True, exist_ok=True)
    record.write_text(json.dumps(settings, indent=1) + "\n")
    phases = "sft,warmup,ppo,eval" if evaluate else "sft,warmup,ppo"
    return _run(workdir.resolve(), config,
                [f"--config.reuse={Path(base).resolve()}", f"--config.phases={phases}",
                 f"--config.seed={seed}", f"--config.ppo.steps={ppo_steps}",
                 "--config.eval.every=0", *overrides], timeout_s)


def stage_metrics(workdir, stage: str = "ppo") -> list[dict]:
    """One dict per logged step of `stage` (ppo, warmup, sft), in step order; a step logged
    twice (a run resumed from an earlier checkpoint) keeps its last row, and a value logged as
    non-finite (explained variance of constant returns) reads back as NaN."""
    path = Path(workdir) / stage / "metrics.jsonl"
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no metrics (has the {stage} phase run?)")
    by_step = {row["step"]: {k: math.nan if v is None else v for k, v in row.items()}
               for row in read_jsonl(path) if "step" in row}  # None: logged non-finite
    return [by_step[step] for step in sorted(by_step)]


def heldout_summary(workdir, label: str = "ppo") -> dict:
    """eval/<label>/summary.json: resolved rate, avg dense reward, goal progress, pass@k."""
    path = Path(workdir) / "eval" / label / "summary.json"
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no held-out evaluation named {label!r}")
    return json.loads(path.read_text())


def heldout_trials(workdir, label: str = "ppo") -> list[dict]:
    """eval/<label>/trials.jsonl: one row per held-out trial (task_id, reward, resolved, ...)."""
    return read_jsonl(Path(workdir) / "eval" / label / "trials.jsonl")


def paired_by_task(a: list[dict], b: list[dict], key: str) -> tuple[float, float, int]:
    """Mean over tasks of (task mean of `key` in a) - (same in b), its standard error over
    tasks, and the number of tasks both evaluated. Pairing by task removes the task-difficulty
    variance that two independent resolved rates would carry; SE is 0 for one task."""
    means = []
    for rows in (a, b):
        per_task = defaultdict(list)
        for row in rows:
            if scored(row):  # infrastructure failures are no verdict on the policy
                per_task[row["task_id"]].append(float(row[key]))
        means.append({task: sum(v) / len(v) for task, v in per_task.items()})
    tasks = sorted(set(means[0]) & set(means[1]))
    if not tasks:
        raise ValueError(f"no task was evaluated in both sets (key {key!r})")
    diffs = [means[0][t] - means[1][t] for t in tasks]
    mean = sum(diffs) / len(diffs)
    if len(diffs) < 2:
        return mean, 0.0, len(diffs)
    var = sum((d - mean) ** 2 for d in diffs) / (len(diffs) - 1)
    return mean, math.sqrt(var / len(diffs)), len(diffs)
