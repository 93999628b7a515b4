"""Generated task families for the tiny setting: short shell skills over a small entity vocabulary.

Why: a 4-layer MoE with a 512-token vocabulary learns "instruction -> one shell command" in
minutes on 2 CPU cores only when sequences are short, tokens are whole words and each entity is
seen many times (docs/FEASIBILITY.md). These families give exactly that, in the ordinary Harbor /
Terminal-Bench 2 layout (task.toml, instruction.md, environment/, solution/solve.sh, tests/), so
the real loader, sandboxes, verifier and agent loop run them unchanged:

- one sentence of instruction, a one-line solve.sh (one tool call), 2-4 pytest assertions per
  task (goal assertions plus `test_invariant_*` ones), so the dense reward sees partial progress;
- every task shares one byte-identical environment/ directory (a fixed fixture set under
  /app/data created by the Dockerfile), so the whole pool is one image build (image tags are
  content hashes of the build context);
- the held-out split holds out *combinations*: for every family a few key entities never appear
  with that family in train (they do appear with other families), plus fresh instances of
  train combinations (a new second slot); `split.json` lists both.

`family_corpus` gives the BPE corpus that makes the chat glue and the entity words compact.
"""

from __future__ import annotations

import json
import random
import shutil
from pathlib import Path

# -- vocabulary and fixtures -------------------------------------------------------------------
ENTITIES = ("red", "blue", "green", "gold", "pink", "gray", "cat", "dog", "fox", "owl", "bee",
            "ant", "sun", "moon", "star", "tree")
# name -> lines: small, unsorted, distinct line counts (3..6) so counting tasks differ
FIXTURES = {
    "notes": ("pear", "fig", "kiwi"),
    "names": ("tom", "ann", "bob", "eve"),
    "items": ("pen", "cup", "box", "bag", "key"),
    "words": ("yes", "no", "up", "down", "left", "right"),
}
FAMILIES = ("write", "mkdir", "copy", "append", "count", "sort")
SYSTEM_PROMPT = ("Use the bash tool to run one command in /app. When done, reply without a "
                 "tool call.")
FINAL_ANSWER = "Done."

_DOCKERFILE = "FROM t1jax/base:bookworm\nWORKDIR /app\nRUN mkdir -p /app/data" + "".join(
    f" \\\n && printf '%s\\n' {' '.join(lines)} > /app/data/{name}.txt"
    for name, lines in FIXTURES.items()) + "\n"

_TEST_SH = """#!/bin/bash
# Verifier: the task's pytest file with the image's own pytest; JUnit XML gives per-assertion results.
mkdir -p /logs/verifier
cd /app 2>/dev/null || cd /
PYTHONDONTWRITEBYTECODE=1 python3 -m pytest -p no:cacheprovider -rA --junitxml=/logs/verifier/junit.xml /tests/test_outputs.py
if [ $? -eq 0 ]; then echo 1 > /logs/verifier/reward.txt; else echo 0 > /logs/verifier/reward.txt; fi
"""

_TEST_HEAD = '''import os

FIXTURES = {fixtures!r}


def _lines(path):
    with open(path) as f:
        return f.read().splitlines()


def test_invariant_other_fixtures_intact():
    for name, lines in FIXTURES.items():
        if name != {skip!r}:
            assert _lines(f"/app/data/{{name}}.txt") == list(lines), name
'''


# -- the families: (instruction, solve command, test body) per instance ------------------------
# An instance is (family, key, second): `key` is the entity that defines the held-out
# combination, `second` the other slot (an entity word or a fixture name).
def _second_choices(family: str, key: str) -> list[str]:
    if family in ("copy", "count", "sort", "append"):
        return list(FIXTURES)
    return [e for e in ENTITIES if e != key]


_FILE_EXISTS = '''
def test_file_exists():
    assert os.path.isfile("/app/{key}.txt")
'''

# family -> (instruction, solve.sh command, test functions), each a str.format template over
# {key} and {second}
_TEMPLATES = {
    "write": ("Write the word {second} to the file {key}.txt.", "echo {second} > {key}.txt",
              _FILE_EXISTS + '''

def test_content():
    assert _lines("/app/{key}.txt") == ["{second}"]
'''),
    "mkdir": ("Make the directories {key} and {second}.", "mkdir {key} {second}", '''
def test_first_directory():
    assert os.path.isdir("/app/{key}")


def test_second_directory():
    assert os.path.isdir("/app/{second}")
'''),
    "copy": ("Copy data/{second}.txt into a new directory {key}.",
             "mkdir {key} && cp data/{second}.txt {key}/", '''
def test_directory():
    assert os.path.isdir("/app/{key}")


def test_copied_file():
    assert _lines("/app/{key}/{second}.txt") == list(FIXTURES["{second}"])


def test_invariant_source_kept():
    assert _lines("/app/data/{second}.txt") == list(FIXTURES["{second}"])
'''),
    "append": ("Append the line {key} to data/{second}.txt.", "echo {key} >> data/{second}.txt", '''
def test_last_line():
    assert _lines("/app/data/{second}.txt")[-1:] == ["{key}"]


def test_one_line_added():
    assert len(_lines("/app/data/{second}.txt")) == len(FIXTURES["{second}"]) + 1


def test_invariant_original_lines_kept():
    lines = _lines("/app/data/{second}.txt")
    assert lines[:len(FIXTURES["{second}"])] == list(FIXTURES["{second}"])
'''),
    "count": ("Write the line count of data/{second}.txt to {key}.txt.",
              "wc -l < data/{second}.txt > {key}.txt", _FILE_EXISTS + '''

def test_count():
    assert _lines("/app/{key}.txt")[0].strip() == str(len(FIXTURES["{second}"]))
'''),
    "sort": ("Sort data/{second}.txt into {key}.txt.", "sort data/{second}.txt > {key}.txt",
             _FILE_EXISTS + '''

def test_sorted():
    assert _lines("/app/{key}.txt") == sorted(FIXTURES["{second}"])
'''),
}


# A careless teacher's slip per family: a command of the same shape as the reference that
# misses the goal (a forgotten suffix, one directory of two, no mkdir, > for >>, wc naming its
# file, cat for sort). configs/tiny_cpu.py's SFT data show it beside the reference on every
# train task, so SFT imitates a teacher right half the time; what reward can then teach, and
# imitation cannot, is to stop slipping (docs/probes.md, "A teacher that slips").
_SLIPS = {
    "write": "echo {second} > {key}",
    "mkdir": "mkdir {key}",
    "copy": "cp data/{second}.txt {key}",
    "append": "echo {key} > data/{second}.txt",
    "count": "wc -l data/{second}.txt > {key}.txt",
    "sort": "cat data/{second}.txt > {key}.txt",
}


def slip_command(family: str, key: str, second: str) -> str:
    """The teacher's slip on this instance: looks like the reference, never solves it."""
    if family not in _SLIPS:
        raise ValueError(f"unknown family {family!r}; known: {FAMILIES}")
    return _SLIPS[family].format(key=key, second=second)


def render(family: str, key: str, second: str) -> tuple[str, str, str, str | None]:
    """(instruction, solve.sh command, test functions, fixture the task may change)."""
    if family not in _TEMPLATES:
        raise ValueError(f"unknown family {family!r}; known: {FAMILIES}")
    instruction, command, tests = (t.format(key=key, second=second) for t in _TEMPLATES[family])
    return instruction, command, tests, second if family == "append" else None


def task_id(family: str, key: str, second: str) -> str:
    return f"{family}-{key}-{second}"


def _task_toml(family: str, key: str, second: str) -> str:
    tid = task_id(family, key, second)
    return f'''schema_version = "1.1"

[task]
name = "t1jax/families/{tid}"
description = "Generated '{family}' task (key entity {key}, second slot {second})."
authors = [{{ name = "t1jax", email = "t1jax@example.com" }}]
keywords = ["families", "{family}"]

[metadata]
difficulty = "easy"
category = "{family}"
tags = ["families", "{family}", "{key}", "{second}"]
family = "{family}"
key = "{key}"
second = "{second}"

[verifier]
timeout_sec = 30.0

[agent]
timeout_sec = 60.0

[environment]
build_timeout_sec = 300.0
cpus = 1
memory_mb = 512
storage_mb = 1024
allow_internet = false
'''


def write_task(task_dir: Path, family: str, key: str, second: str) -> Path:
    """One task directory in the Harbor / Terminal-Bench 2 layout."""
    instruction, command, tests, changes = render(family, key, second)
    task_dir = Path(task_dir)
    if task_dir.exists():
        shutil.rmtree(task_dir)
    (task_dir / "environment").mkdir(parents=True)
    (task_dir / "solution").mkdir()
    (task_dir / "tests").mkdir()
    (task_dir / "task.toml").write_text(_task_toml(family, key, second))
    (task_dir / "instruction.md").write_text(instruction)  # no newline: it enters the prompt
    (task_dir / "environment" / "Dockerfile").write_text(_DOCKERFILE)
    (task_dir / "solution" / "solve.sh").write_text(f"#!/bin/bash\n{command}\n")
    (task_dir / "tests" / "test.sh").write_text(_TEST_SH)
    (task_dir / "tests" / "test_outputs.py").write_text(
        _TEST_HEAD.format(fixtures={k: list(v) for k, v in FIXTURES.items()}, skip=changes)
        + tests)
    for p in (task_dir / "solution" / "solve.sh", task_dir / "tests" / "test.sh"):
        p.chmod(0o755)
    return task_dir


# -- the split ---------------------------------------------------------------------------------
def plan_split(*, seed: int = 0, train_per_family: int = 16, heldout_per_family: int = 4,
               heldout_keys_per_family: int = 3, validation_per_family: int = 0,
               validation_keys_per_family: int = 1, families=None) -> dict:
    """Which instances go where, deterministic in seed. Per family, `heldout_keys_per_family`
    key entities are held out for the test split and, when a validation split is asked for,
    `validation_keys_per_family` other ones for it (chosen so every entity stays in train with
    some family). The test tasks are ceil(n/2) instances of the test's held-out combinations
    and the rest fresh instances of train combinations (an unseen second slot);
    `validation_per_family` more, made the same way from the validation's own held-out keys and
    disjoint from both, make the validation split that settings are chosen on. Validation and
    test share no task and no held-out (family, key) combination, so what a choice on
    validation learnt about a combination cannot show up on test. Where a family has too few
    fresh instances left after train (the fixture families: 4 second slots per key), held-out
    combinations fill the rest."""
    families = tuple(families or FAMILIES)
    unknown = sorted(set(families) - set(FAMILIES))
    if unknown:
        raise ValueError(f"unknown families {unknown}; known: {FAMILIES}")
    n_val_keys = validation_keys_per_family if validation_per_family > 0 else 0
    rng = random.Random(f"t1jax-families-{seed}")
    # rotate held-out keys over a shuffled entity list so no entity is held out everywhere
    order = list(ENTITIES)
    rng.shuffle(order)
    plan = {"seed": seed, "families": list(families), "entities": list(ENTITIES),
            "fixtures": {k: list(v) for k, v in FIXTURES.items()}, "train": [],
            "heldout": [], "heldout_combinations": [], "heldout_fresh": [],
            "validation": [], "validation_combinations": [], "validation_fresh": []}
    for fi, family in enumerate(families):
        start = (fi * (heldout_keys_per_family + n_val_keys)) % len(order)
        held_all = [order[(start + j) % len(order)]
                    for j in range(heldout_keys_per_family + n_val_keys)]
        held, val_keys = held_all[:heldout_keys_per_family], held_all[heldout_keys_per_family:]
        train_keys = [e for e in ENTITIES if e not in held_all]
        train_pool = [(family, k, s) for k in train_keys for s in _second_choices(family, k)]
        rng.shuffle(train_pool)
        # spread train over keys first (round-robin) so every train combination is seen
        by_key: dict[str, list] = {}
        for inst in train_pool:
            by_key.setdefault(inst[1], []).append(inst)
        spread, i = [], 0
        while any(by_key.values()):
            k = train_keys[i % len(train_keys)]
            if by_key.get(k):
                spread.append(by_key[k].pop())
            i += 1
        if train_per_family > len(spread):
            raise ValueError(f"family {family}: {train_per_family} train instances exceed its "
                             f"{len(spread)} train-combination instances (held out: "
                             f"{heldout_keys_per_family} test + {n_val_keys} validation keys)")
        train = spread[:train_per_family]
        seen = {(f, k) for f, k, _ in train}
        fresh_pool = [x for x in spread[train_per_family:] if (x[0], x[1]) in seen]

        def take(n: int, keys: list[str], split: str) -> tuple[list, list]:
            """n tasks: ceil(n/2) combinations of `keys` (cycling over them), the rest fresh
            instances while they last, then combinations again."""
            combos = [(family, k, s) for k in keys for s in _second_choices(family, k)]
            rng.shuffle(combos)
            n_fresh = min(n // 2, len(fresh_pool))
            fresh = [fresh_pool.pop(0) for _ in range(n_fresh)]
            combo: list = []
            for _ in range(n - n_fresh):
                left = [x for x in combos if x not in combo]
                if not left:
                    raise ValueError(f"family {family}: not enough held-out combinations for "
                                     f"{n} {split} tasks ({len(keys)} held-out keys)")
                key = keys[len(combo) % len(keys)]
                combo.append(next((x for x in left if x[1] == key), left[0]))
            return combo, fresh

        combo, fresh = take(heldout_per_family, held, "test")
        vcombo, vfresh = take(validation_per_family, val_keys, "validation")
        plan["train"] += [task_id(*x) for x in train]
        plan["heldout_combinations"] += [task_id(*x) for x in combo]
        plan["heldout_fresh"] += [task_id(*x) for x in fresh]
        plan["heldout"] += [task_id(*x) for x in combo + fresh]
        plan["validation_combinations"] += [task_id(*x) for x in vcombo]
        plan["validation_fresh"] += [task_id(*x) for x in vfresh]
        plan["validation"] += [task_id(*x) for x in vcombo + vfresh]
        plan.setdefault("heldout_keys", {})[family] = held
        plan.setdefault("validation_keys", {})[family] = val_keys
        plan.setdefault("instances", {}).update(
            {task_id(*x): list(x) for x in train + combo + fresh + vcombo + vfresh})
    return plan


def write_family_pool(out_dir, *, seed: int = 0, train_per_family: int = 16,
                      heldout_per_family: int = 4, heldout_keys_per_family: int = 3,
                      validation_per_family: int = 0, validation_keys_per_family: int = 1,
                      families=None) -> dict:
    """Write `out_dir/train/<task-id>/`, `out_dir/heldout/<task-id>/` (the test split),
    `out_dir/validation/<task-id>/` (when asked for) and `out_dir/split.json` (the plan: train,
    heldout, validation, their combination / fresh parts, heldout_keys, instances).
    Deterministic in seed; returns the plan."""
    out_dir = Path(out_dir)
    plan = plan_split(seed=seed, train_per_family=train_per_family,
                      heldout_per_family=heldout_per_family,
                      heldout_keys_per_family=heldout_keys_per_family,
                      validation_per_family=validation_per_family,
                      validation_keys_per_family=validation_keys_per_family, families=families)
    for split in ("train", "heldout", "validation"):
        if (out_dir / split).exists():
            shutil.rmtree(out_dir / split)
        for tid in plan[split]:
            write_task(out_dir / split / tid, *plan["instances"][tid])
    (out_dir / "split.json").write_text(json.dumps(plan, indent=1, sort_keys=True) + "\n")
    return plan


# -- tokenizer corpus --------------------------------------------------------------------------
def _instances_from(pool_dir_or_tasks, splits=("train",)) -> list[tuple[str, str, str]]:
    if isinstance(pool_dir_or_tasks, (str, Path)):
        plan = json.loads((Path(pool_dir_or_tasks) / "split.json").read_text())
        return [tuple(plan["instances"][t]) for split in splits for t in plan[split]]
    out = []
    for t in pool_dir_or_tasks:
        if isinstance(t, (tuple, list)):
            out.append(tuple(t))
        else:
            m = t.metadata
            out.append((m["family"], m["key"], m["second"]))
    return out


def family_corpus(pool_dir_or_tasks=None, *, system_prompt: str = SYSTEM_PROMPT,
                  repeats: int = 4, splits=("train",)) -> list[str]:
    """BPE training text for the tiny tokenizer: the chat glue exactly as the agent loop renders
    it (prefix with `system_prompt` and the bash tools block, tool calls, observations, final
    answer), every instruction and solution command, and typical outputs, repeated so the
    merges make the constant glue and the entity words whole tokens.

    pool_dir_or_tasks: a pool written by write_family_pool (its `splits`: train only by
    default, so no validation or test text shapes the tokenizer; every entity word still
    becomes a token, as the corpus lists them all), loaded Tasks of it, instances
    (family, key, second), or None for every instance of every family."""
    from t1jax.rollout.chat import render_observation, render_prefix, render_tool_call
    if pool_dir_or_tasks is None:
        insts = [(f, k, s) for f in FAMILIES for k in ENTITIES for s in _second_choices(f, k)]
    else:
        insts = _instances_from(pool_dir_or_tasks, splits)
    # Merges go to the most frequent pairs and a 512 vocabulary has ~250 of them: weight the
    # variable parts (entity words in every form they take after pre-tokenization, instruction
    # words, commands, the tool-call JSON) above the constant system/tools block, which costs
    # compute but nothing to learn.
    episodes, texts = [], []
    for family, key, second in insts:
        instruction, command, _, _ = render(family, key, second)
        episodes.append(render_prefix(system_prompt, instruction) + render_tool_call(command)
                        + "<|im_end|>" + render_observation(["[exit code: 0]"]) + FINAL_ANSWER
                        + "<|im_end|>")
        texts += [instruction, render_tool_call(command) + "<|im_end|>"]
    names = list(ENTITIES) + list(FIXTURES)
    words = [" ".join(names), " ".join(f"{n}.txt" for n in names)]
    outputs = ["[exit code: 0]", "[exit code: 1]", "[exit code: 127]", "No such file or directory"]
    # measured (pool of 120): a sample of ~305 tokens (max ~325), constant prefix ~244 tokens,
    # every entity one token, instruction + tool call ~36 tokens
    return (texts * 2 + words * (len(insts) // 2 + 1) + outputs * 4
            + episodes[:max(1, len(episodes) // 2)]) * repeats


__all__ = ["ENTITIES", "FAMILIES", "FINAL_ANSWER", "FIXTURES", "SYSTEM_PROMPT", "family_corpus",
           "plan_split", "render", "slip_command", "task_id", "write_family_pool", "write_task"]
