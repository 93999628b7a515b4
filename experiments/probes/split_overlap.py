"""Which of today's validation and test tasks did earlier choices of settings look at?

    .venv/bin/python experiments/probes/split_overlap.py [--seeds 0,1,2,3]

The generated task space is small (64 instances per fixture family, 240 per entity family), so
a new split cannot avoid every task an earlier split held. This prints, for each seed's
validation and test split of configs/tiny_cpu.py as t1jax/curation/families.py makes them now, how
many tasks were in the splits that settings still in force were chosen on (or printed on),
each rebuilt with the families.py of its time (git show), seed 0 as they ran:
  - "held-out 24" (11776f9~1, 2026-11-30..12-05): the single held-out split on which
    train_per_family 50, SFT batch 16 and lr 3e-3, critic lr 1e-3 and 20 PPO steps were chosen;
  - "validation 24" and "test 48" (11776f9..bcabd4b, 2026-12-05..06): teacher slips, actor lr
    3e-4 and 2400 SFT steps were chosen on that validation split; that test split's results of
    several configurations were printed before the headline run.
Why: docs/main_job.md says plainly what each split's tasks have been through (issue #47).
"""

from __future__ import annotations

import argparse
import importlib.util
import subprocess
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

from configs import tiny_cpu  # noqa: E402
from t1jax.curation import families  # noqa: E402

# (name, the families.py revision, plan_split arguments, the plan's key) of each earlier split
EARLIER = (("held-out 24", "11776f9~1", dict(train_per_family=50, heldout_per_family=4),
            "heldout"),
           ("validation 24", "bcabd4b", dict(train_per_family=50, heldout_per_family=8,
                                              validation_per_family=4), "validation"),
           ("test 48", "bcabd4b", dict(train_per_family=50, heldout_per_family=8,
                                        validation_per_family=4), "heldout"))


def families_at(rev: str):
    """t1jax/curation/families.py as it was at `rev`, imported as its own module."""
    text = subprocess.run(["git", "show", f"{rev}:t1jax/curation/families.py"], cwd=ROOT,
                          check=True, capture_output=True, text=True).stdout
    path = Path(tempfile.mkdtemp()) / f"families_{rev.replace('~', '_')}.py"
    path.write_text(text)
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", default="0,1,2,3")
    args = parser.parse_args()
    earlier = {name: set(families_at(rev).plan_split(seed=0, **kwargs)[key])
               for name, rev, kwargs, key in EARLIER}
    c = tiny_cpu.get_config().pool
    print("| seed | split | tasks | " + " | ".join(f"in {n}" for n in earlier) + " |")
    print("|---" * (3 + len(earlier)) + "|")
    for seed in [int(s) for s in args.seeds.split(",") if s]:
        plan = families.plan_split(seed=seed, train_per_family=c.train_per_family,
                                   heldout_per_family=c.heldout_per_family,
                                   heldout_keys_per_family=c.heldout_keys_per_family,
                                   validation_per_family=c.validation_per_family,
                                   validation_keys_per_family=c.validation_keys_per_family)
        for split, key in (("validation", "validation"), ("test", "heldout")):
            tasks = set(plan[key])
            print(f"| {seed} | {split} | {len(tasks)} | "
                  + " | ".join(str(len(tasks & old)) for old in earlier.values()) + " |")


if __name__ == "__main__":
    main()
