"""The import rules of docs/ARCHITECTURE.md, read from the source (nothing is imported): a layer
never imports a higher one, `rl/` never reaches a shell (rollouts come to it as Samples), and no
module takes another module's private names. KNOWN lists the exceptions still left, each with
the change that removes it (issue #28); a new one fails here."""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1] / "t1jax"

# Lowest first; a module belongs to the longest prefix that names it.
LAYERS = (
    ("t1jax.sharding", "t1jax.faults", "t1jax.metrics_log", "t1jax.checkpoint",
     "t1jax.distributed"),
    ("t1jax.model", "t1jax.sandbox", "t1jax.verify", "t1jax.tasks"),  # tasks: the format alone
    ("t1jax.rollout",),
    ("t1jax.curation", "t1jax.rl"),  # what runs trials over tasks (validate, synth, audit), training
    ("t1jax.report", "t1jax.jobs", "t1jax"),
)
# rl/ takes from rollout/ only the data types rollouts reach it as
RL_MAY_IMPORT_FROM_ROLLOUT = ("t1jax.rollout.sample",)
KNOWN: dict = {}  # (importer, imported) -> the change that removes it


def layer(module: str) -> int:
    best = max(((len(p), i) for i, names in enumerate(LAYERS) for p in names
                if module == p or module.startswith(p + ".")), default=None)
    assert best is not None, f"{module} is in no layer: place it in LAYERS"
    return best[1]


def imports():
    """(importer, imported) for every t1jax import, at any depth of the module (imports inside
    functions count: they run too). `from pkg import name` names the module `pkg.name` when
    that is a module, else `pkg.name` as a (possibly private) attribute."""
    out = []
    for path in sorted(ROOT.rglob("*.py")):
        parts = path.relative_to(ROOT.parent).with_suffix("").parts
        module = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                out += [(module, a.name) for a in node.names if a.name.startswith("t1jax")]
            elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("t1jax"):
                out += [(module, f"{node.module}.{a.name}") for a in node.names]
    return out


def target_module(name: str) -> str:
    """The module an imported name lives in: itself if it is a module or package."""
    rel = Path(*name.split(".")[1:]) if "." in name else Path()
    if (ROOT / rel).with_suffix(".py").is_file() or (ROOT / rel).is_dir():
        return name
    return name.rsplit(".", 1)[0]


def test_every_module_is_in_a_layer():
    for importer, _ in imports():
        layer(importer)


def test_no_layer_imports_a_higher_one():
    bad = []
    for importer, name in imports():
        target = target_module(name)
        if layer(target) > layer(importer) and (importer, target) not in KNOWN:
            bad.append(f"{importer} -> {target}")
    assert not bad, "upward imports (docs/ARCHITECTURE.md):\n" + "\n".join(sorted(set(bad)))


def test_rl_never_reaches_a_shell():
    bad = []
    for importer, name in imports():
        target = target_module(name)
        if not importer.startswith("t1jax.rl"):
            continue
        banned = target.startswith(("t1jax.sandbox", "t1jax.verify", "t1jax.tasks",
                                    "t1jax.jobs")) or (
            target.startswith("t1jax.rollout") and target not in RL_MAY_IMPORT_FROM_ROLLOUT)
        if banned and (importer, target) not in KNOWN:
            bad.append(f"{importer} -> {target}")
    assert not bad, "rl/ imports beyond rollout's data types:\n" + "\n".join(sorted(set(bad)))


def test_no_module_takes_private_names_from_another():
    bad = [f"{i} -> {n}" for i, n in imports()
           if n.rsplit(".", 1)[1].startswith("_") and target_module(n) != i
           and (i, n) not in KNOWN]
    assert not bad, "private names imported across modules:\n" + "\n".join(sorted(set(bad)))


def test_known_exceptions_still_exist():
    """An exception fixed is taken off KNOWN, so the list stays the work left."""
    found = {(i, target_module(n)) for i, n in imports()} | set(imports())
    assert not [k for k in KNOWN if k not in found], [k for k in KNOWN if k not in found]


def test_no_import_cycles_between_modules():
    """Module A imports B and B imports A (at any depth), outside KNOWN_CYCLES."""
    edges = {}
    for importer, name in imports():
        edges.setdefault(importer, set()).add(target_module(name))
    cycles, seen = [], set()

    def walk(node, path):
        for nxt in sorted(edges.get(node, ())):
            if nxt == path[0]:
                cycle = tuple(sorted(path))
                if cycle not in seen:
                    seen.add(cycle)
                    cycles.append(" -> ".join(path + [nxt]))
            elif nxt not in path and len(path) < 6 and layer(nxt) == layer(path[0]):
                walk(nxt, path + [nxt])

    for module in sorted(edges):
        walk(module, [module])
    new = [c for c in cycles if tuple(sorted(c.split(" -> ")[:-1])) not in KNOWN_CYCLES]
    assert not new, "import cycles:\n" + "\n".join(new)


KNOWN_CYCLES: set = set()


REPO = ROOT.parent
# files that run inside a task's sandbox (its environment and tests), not in t1jax's Python
TASK_PAYLOADS = (REPO / "t1jax" / "tasks" / "seed_tasks", REPO / "t1jax" / "tasks" / "tb2_shaped")


def test_nothing_edits_sys_path():
    """t1jax is an installed project (pyproject.toml; scripts/setup.sh runs pip install -e .):
    no script, test, notebook or module puts a folder on sys.path to find it."""
    edits, calls = [], ("sys.path." + "insert(", "sys.path." + "append(")  # (not this line)
    for folder in ("t1jax", "experiments", "tests", "configs", "colabs", "scripts"):
        for path in sorted((REPO / folder).rglob("*")):
            if path.suffix not in (".py", ".ipynb", ".sh") or \
                    any(path.is_relative_to(p) for p in TASK_PAYLOADS):
                continue
            text = path.read_text()
            edits += [f"{path.relative_to(REPO)}: {line.strip()}" for line in text.splitlines()
                      if any(call in line for call in calls)]
    assert not edits, edits


def test_the_installed_project_imports_from_another_folder(tmp_path):
    """`import t1jax`, the config files' `configs` and the scripts' `experiments` resolve
    from any working directory, with no PYTHONPATH, to this checkout."""
    import os
    import subprocess
    import sys
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    code = ("import t1jax, configs.tiny_cpu, experiments.launch_local as l; "
            "print(t1jax.__file__); print(configs.tiny_cpu.__file__); print(l.__file__)")
    proc = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    got = [Path(line).resolve() for line in proc.stdout.split()]
    assert got == [REPO / "t1jax" / "__init__.py", REPO / "configs" / "tiny_cpu.py",
                   REPO / "experiments" / "launch_local.py"], (got, "pip install -e . here")


def test_every_package_docstring_names_its_modules():
    """A newcomer opening t1jax/<package>/__init__.py finds the whole package: its docstring
    names every module (and subpackage) in it, one line each."""
    missing = []
    for init in sorted(ROOT.rglob("__init__.py")):
        if any(init.is_relative_to(p) for p in TASK_PAYLOADS):
            continue
        doc = ast.get_docstring(ast.parse(init.read_text())) or ""
        folder = init.parent
        names = [p.name for p in folder.glob("*.py") if p.name != "__init__.py"]
        names += [f"{p.name}/" for p in folder.iterdir()
                  if p.is_dir() and (p / "__init__.py").is_file()]
        missing += [f"{folder.relative_to(REPO)}: {name}" for name in sorted(names)
                    if f"{name}:" not in doc]
    assert not missing, missing


MAX_PARAMETERS = 10


def test_no_function_takes_more_than_ten_parameters_without_saying_why():
    """Big signatures are how a config gets taken apart instead of handed down (issue #46):
    a function over MAX_PARAMETERS takes a settings value (EpisodeSettings, TrialSite,
    Teacher, Settings), or its docstring (or its class's) says why, naming its count ("Why 12
    parameters: ...", "its keywords (11) are a SandboxSpec's fields")."""
    import re
    unexplained = []
    for path in sorted(ROOT.rglob("*.py")):
        if any(path.is_relative_to(p) for p in TASK_PAYLOADS):
            continue
        tree = ast.parse(path.read_text(), str(path))
        owner = {id(item): node for node in ast.walk(tree) if isinstance(node, ast.ClassDef)
                 for item in node.body}
        for node in ast.walk(tree):
            if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            a = node.args
            n = len([x for x in a.posonlyargs + a.args + a.kwonlyargs
                     if x.arg not in ("self", "cls")])
            if n <= MAX_PARAMETERS:
                continue
            doc = " ".join(((ast.get_docstring(node) or "") + " " + (
                ast.get_docstring(owner[id(node)]) or "" if id(node) in owner else "")).split())
            if not re.search(rf"\b{n} parameters\b|\({n}\)", doc):
                unexplained.append(f"{path.relative_to(REPO)}:{node.lineno} {node.name} ({n})")
    assert not unexplained, unexplained
