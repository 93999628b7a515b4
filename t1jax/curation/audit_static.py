"""The audit's static reads of a task directory: paths the tests check but the instruction never
names (hidden requirements), test or solution files leaking into the agent's image, and how
substantial the solution and clear the instruction are."""

from __future__ import annotations

import ast
import hashlib
import json
import re
from pathlib import Path

# Paths of the system, the verifier harness and scratch space: never task requirements.
_SYSTEM = re.compile(r"^/(?:proc|sys|dev|usr|lib\w*|bin|sbin|etc|var/lib|tests|logs|tmp|run)(/|$)")
_ABS = re.compile(r"(?<![^\s\"'`=(,\[{])/[\w.*?+@-]+(?:/[\w.*?+@-]+)*/?")
_EXT = ("txt|csv|tsv|json|jsonl|ndjson|ya?ml|toml|ini|cfg|conf|log|md|py|sh|db|sqlite3?|sql|xml|"
        "html?|js|ts|c|h|cpp|go|rs|java|rb|pl|gz|tgz|tar|zip|bz2|xz|png|jpe?g|gif|pdf|out|pem|"
        "key|crt|parquet|npy|pkl|bin|lock|dat|bak|patch|diff|sha256|pid|env")
_QUOTED_NAME = re.compile(rf"([\"'])((?:[\w.-]+/)*[\w-][\w.-]*\.(?:{_EXT}))\1", re.I)
_HARNESS = {"junit.xml", "ctrf.json", "reward.txt", "reward.json", "pytest.ini", "conftest.py"}
_PLACEHOLDER = re.compile(r"\b(?:TODO|FIXME|TBD|XXX)\b|(?i:lorem ipsum|<placeholder>|"
                          r"\[placeholder\]|\binsert [^.\n]{0,30} here\b)")

def _mentions(text: str, needle: str) -> bool:
    return re.search(r"(?<![\w.-])" + re.escape(needle) + r"(?![\w-]|\.\w)", text) is not None


def file_texts(files) -> dict[str, str]:
    """{relative name: text} of (relative name, path) pairs."""
    return {str(rel): Path(p).read_text(errors="replace") for rel, p in files}


def secret_files(task) -> dict[str, str]:
    """sha256 -> name of every test and solution file big enough to be worth hiding."""
    files = {f"tests/{rel}": p for rel, p in task.test_files().items()}
    if sol := task.solution_script:
        for p in (sol.parent.rglob("*") if task.layout == "tb2" else [sol]):
            files[f"solution/{p.relative_to(sol.parent).as_posix()}"] = p
    return {hashlib.sha256(p.read_bytes()).hexdigest(): name for name, p in files.items()
            if p.is_file() and p.stat().st_size >= 16}


def _hidden_dirs(task) -> list[Path]:
    sol = task.solution_script
    return [task.tests_dir.resolve(), task.test_script.resolve()] + (
        [(sol if task.layout == "tb1" else sol.parent).resolve()] if sol else [])


def _env_files(task) -> list[Path]:
    """The build context's files under 1 MiB, less the tests and solution (a TB1 context is
    the whole task dir)."""
    hidden = _hidden_dirs(task)
    return [p for p in sorted((task.environment_dir or task.path / "-").rglob("*"))
            if p.is_file() and p.stat().st_size < 1 << 20
            and not any(h == p.resolve() or h in p.resolve().parents for h in hidden)]


def static_leaks(task) -> list[str]:
    """Tests or solution copied into the build context, or COPY/ADDed from their dirs."""
    secrets, leaks = secret_files(task), []
    for p in _env_files(task):
        if name := secrets.get(hashlib.sha256(p.read_bytes()).hexdigest()):
            leaks.append(f"{p.relative_to(task.path).as_posix()} is a copy of {name}")
    text = task.dockerfile.read_text(errors="replace") if task.dockerfile else ""
    for m in re.finditer(r"^\s*(?:COPY|ADD)\s+(.+)$", text.replace("\\\n", " "), re.I | re.M):
        try:
            args = json.loads(m[1]) if m[1].lstrip().startswith("[") else m[1].split()
        except ValueError:
            args = m[1].split()
        if any(str(a).startswith("--from") for a in args):
            continue
        for src in [a.lstrip("/") or "." for a in args if not a.startswith("--")][:-1]:
            ctx = task.environment_dir
            for path in (list(ctx.glob(src)) if any(c in src for c in "*?[") else [ctx / src]):
                path = path.resolve()
                if any(h == path or path in h.parents or h in path.parents
                       for h in _hidden_dirs(task)):
                    leaks.append(f"the Dockerfile copies {src!r} into the image: {m[0].strip()}")
    return sorted(set(leaks))


def _strings(node, listed=False):
    """String constants of a literal, and whether each sits in a container literal."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        yield node.value, listed
    elif isinstance(node, (ast.List, ast.Tuple, ast.Set, ast.Dict)):
        for child in (node.elts if not isinstance(node, ast.Dict) else node.keys + node.values):
            yield from _strings(child, True) if child is not None else ()


def _compared(source: str):
    """(string, the other side's source, sits in a container) for every string literal compared
    with == or `in` in a test file; module-level constants are resolved."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return
    consts = {n.targets[0].id: n.value for n in tree.body if isinstance(n, ast.Assign)
              and len(n.targets) == 1 and isinstance(n.targets[0], ast.Name)}
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare) and any(isinstance(o, (ast.Eq, ast.In))
                                                 for o in node.ops):
            sides = [node.left, *node.comparators]
            for i, side in enumerate(sides):
                other = " ".join(ast.unparse(s) for j, s in enumerate(sides) if j != i)
                side = consts.get(side.id, side) if isinstance(side, ast.Name) else side
                yield from ((value, other, listed) for value, listed in _strings(side))


def check_coverage(task, existing: set | None = None, created: set | None = None):
    """(hidden, missing). Hidden: paths and file names the tests use that the instruction never
    names, that the agent cannot find in its image (`existing`) and that the oracle creates
    (`created`); without probe data, every such path absent from the build context. Missing:
    output formats the tests compare that neither the instruction nor the inputs show."""
    instr, tests = task.instruction, file_texts(task.test_files().items())
    env_text = "\n".join(file_texts((p, p) for p in _env_files(task)).values())
    env_names = {p.name for p in _env_files(task)}
    made = {p for p in created or () if not _SYSTEM.match(p)}
    # names the oracle made that an input already had: inputs moved or copied, not requirements
    made_names = {Path(p).name for p in made} - {Path(p).name for p in existing or ()}
    hidden, missing = set(), set()

    def covered(path: str) -> bool:
        dirs = [str(p) for p in Path(path).parents if str(p) != "/"]
        return _mentions(instr, path) or (_mentions(instr, Path(path).name)
                                          and any(_mentions(instr, d) for d in dirs))

    def unseen(path: str) -> bool:
        if existing is None or created is None:
            return path not in env_text and Path(path).name not in env_names
        return path not in existing and path in made

    for rel, text in tests.items():
        for raw in _ABS.findall(text):
            parts = raw.rstrip("/.,").split("/")
            cut = next((i for i, c in enumerate(parts) if any(g in c for g in "*?[")), len(parts))
            path = "/".join(parts[:cut]).rstrip("/")
            if path and not _SYSTEM.match(path) and not covered(path) and unseen(path):
                hidden.add(path)
        for _, name in _QUOTED_NAME.findall(text):
            base = name.rsplit("/", 1)[-1]
            if not (base in _HARNESS or base in {Path(r).name for r in tests}
                    or _mentions(instr, base)) and base in made_names:
                hidden.add(base)
        for value, other, listed in (_compared(text) if rel.endswith(".py") else ()):
            m = re.fullmatch(r"([A-Z][\w -]{0,30}:) \S.*|([A-Z_]\w*=)[^\s;]*|(#+ \w.*)", value)
            if re.fullmatch(r"[A-Za-z_]\w*(?:[,\t|;][A-Za-z_]\w*)+", value):
                want = value  # a header line
            elif listed and re.search(r"\[0\]|col|header|field", other, re.I):
                want = value  # one column of a header row
            elif m and not listed:
                want = next(g for g in m.groups() if g)  # a "KEY: " / "KEY=" prefix, a heading
            else:
                continue
            fields = [f for f in re.split(r"[,\t|;]", want) if f.strip()]
            if not (_mentions(instr, want) or want in env_text
                    or all(_mentions(instr, f.strip()) for f in fields)):
                missing.add(want)
    return sorted(hidden), sorted(missing)


def solution_substance(task) -> tuple[float, int, list[str]]:
    """solve.sh's command lines, and the answers it hard-codes: strings the tests compare
    against that it contains verbatim but the instruction does not give."""
    if task.solution_script is None:
        return 0.0, 0, []
    solve = task.solution_script.read_text(errors="replace")
    lines = sum(1 for ln in solve.splitlines() if ln.strip()
                and not re.match(r"#|set\s+[-+]", ln.strip()))
    literals = set()
    for rel, text in file_texts(task.test_files().items()).items():
        if rel.endswith(".py"):
            literals.update(value for value, _, _ in _compared(text))
        else:  # a shell verifier: its quoted strings
            literals.update(a or b for a, b in re.findall(r"\"([^\"\n]+)\"|'([^'\n]+)'", text))
    answers = sorted(s for s in literals if len(s.strip()) >= 12 and s in solve and not all(
        _mentions(task.instruction, tok) for tok in re.findall(r"[\w.@+/-]*\w", s)))
    return min(1.0, lines / 8) * (0.5 if answers else 1.0), lines, answers


def instruction_clarity(task) -> tuple[float, list[str]]:
    """The instruction's clarity score in [0, 1] and notes on what lowered it."""
    words, notes = len(task.instruction.split()), []
    length = 1.0 if 20 <= words <= 800 else words / 20 if words < 20 else max(0, 2 - words / 800)
    if length < 1:
        notes.append(f"instruction has {words} words (sensible: 20..800)")
    if not (where := bool(_ABS.search(task.instruction))):
        notes.append("instruction names no absolute path for its outputs")
    if placeholder := _PLACEHOLDER.search(task.instruction):
        notes.append(f"instruction contains placeholder text {placeholder[0]!r}")
    return (length + where + (not placeholder)) / 3, notes


def output_paths(instruction: str) -> list[str]:
    """Absolute paths an instruction names (globs skipped): what a shortcut agent fakes."""
    return sorted({p.rstrip(".,") for p in _ABS.findall(instruction)
                   if not any(g in p for g in "*?[") and not _SYSTEM.match(p)})
