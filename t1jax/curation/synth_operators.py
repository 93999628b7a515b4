"""Rewrite operators for task synthesis: each extends a task's workflow with one more executable
step after its goal is reached, and returns what the instruction, solution and tests gain.

Why all three at once: a new step is only worth training on if it is stated, solvable and checked;
`t1jax.curation.synth` validates them together in sandboxes. The offline operators need no model and
leave the environment unchanged; `llm_rewrite` asks an OpenAI-compatible endpoint for the same."""

from __future__ import annotations

import ast
import json
import re
import shlex
from dataclasses import dataclass

from t1jax.curation.llm import LLMConfig

MAX_OUTPUTS = 200  # more would make the instruction a file listing
_SAFE_PATH = re.compile(r"[^\x00-\x1f\x7f\\]+")  # sha256sum escapes backslash/newline names


@dataclass(frozen=True)
class Output:
    """A regular file the task's reference solution added or changed under /app."""
    path: str  # relative to /app
    size: int
    text: bool  # valid UTF-8 without NUL bytes


@dataclass(frozen=True)
class Parent:
    """What an operator may read about the task it extends, in the round it extends it."""
    task: object  # t1jax.tasks.task.Task
    outputs: tuple[Output, ...]
    lineage: tuple[str, ...]  # operators applied from the round-0 ancestor down to `task`
    round: int  # the round the new task is made in
    root_id: str


@dataclass(frozen=True)
class Rewrite:
    instruction: str  # appended to instruction.md, after a separator
    solution: str  # bash appended to solution/solve.sh (runs in /app under set -euo pipefail)
    tests: str  # python appended to tests/test_outputs.py
    new_paths: tuple[str, ...] = ()  # absolute paths the new step creates


class RewriteError(ValueError):
    """An operator could not produce a usable rewrite; the message is the rejection reason."""

    def __init__(self, message: str, raw: str | None = None):
        super().__init__(message)
        self.raw = raw  # what the model said, kept beside reason.txt


def _listing(paths) -> str:
    return ", ".join(f"`{p}`" for p in paths)


def _args(paths) -> str:
    return " ".join(map(shlex.quote, paths))


class Operator:
    """Subclasses give `step(files, parent)`: (instruction, bash, tests, new paths), where the
    tests may use @T@ (the test name prefix) and @C@ (a constant holding `files`)."""
    name = code = summary = ""  # code: short tag used in task ids; summary: for descriptions
    imports = "os"  # modules the generated tests import
    needs_outputs = True

    def feasible(self, parent: Parent) -> str | None:
        """None when this operator can extend `parent`, else why not."""
        task = parent.task
        if self.name in parent.lineage:
            return f"{self.name} was already applied in this lineage"
        if task.layout != "tb2" or task.solution_script is None \
                or not (task.tests_dir / "test_outputs.py").is_file():
            return "only Harbor tasks with solution/solve.sh and tests/test_outputs.py extend"
        if self.needs_outputs:
            if not parent.outputs:
                return "the reference solution writes no output files under /app"
            if len(parent.outputs) > MAX_OUTPUTS:
                return f"{len(parent.outputs)} output files (more than {MAX_OUTPUTS})"
            bad = [o.path for o in parent.outputs
                   if not _SAFE_PATH.fullmatch(o.path) or o.path.startswith("-")]
            if bad:
                return f"output names unsafe to list: {bad[:3]}"
        return None

    def prefix(self, parent: Parent) -> str:
        return f"test_r{parent.round}_{self.name}_"

    def rewrite(self, parent: Parent) -> Rewrite:
        files = sorted((o.path for o in parent.outputs), key=str.encode)  # LC_ALL=C order
        instruction, solution, tests, new_paths = self.step(files, parent)
        const = f"R{parent.round}_{self.name.upper()}_FILES"
        tests = "".join(f"import {m}\n" for m in self.imports.split()) + \
            f"\n{const} = {files!r}\n\n" + tests.lstrip("\n").replace("@T@", self.prefix(parent)).replace("@C@", const)
        return Rewrite("Finally, once everything above is done, " + instruction,
                       solution.lstrip("\n"), tests, new_paths)

    def step(self, files: list[str], parent: Parent):
        raise NotImplementedError


class ChecksumManifest(Operator):
    name, code, imports = "checksum_manifest", "sums", "os re subprocess"
    summary = "write a SHA256SUMS manifest of the outputs"

    def step(self, files, parent):
        instruction = (
            "write a checksum manifest `/app/SHA256SUMS` in `sha256sum` format: one line per "
            "file, made of the file's 64-character lowercase hex SHA-256 digest, two spaces, and "
            f"the file's path relative to `/app`. It must list exactly these {len(files)} "
            "file(s), sorted by path in plain byte order (as `LC_ALL=C sort` sorts), and nothing "
            f"else: {_listing(files)}. Running `sha256sum -c SHA256SUMS` from `/app` must "
            "succeed, so write it after the files are final.")
        solution = f"LC_ALL=C sha256sum -- {_args(files)} > SHA256SUMS\n"
        tests = """
def @T@file_exists():
    assert os.path.isfile("/app/SHA256SUMS"), "missing /app/SHA256SUMS"

def @T@lists_exactly_the_outputs():
    with open("/app/SHA256SUMS", encoding="utf-8") as f:
        lines = f.read().splitlines()
    paths = []
    for line in lines:
        m = re.fullmatch(r"[0-9a-f]{64}  (.+)", line)
        assert m, f"not a sha256sum line: {line!r}"
        paths.append(m.group(1))
    assert paths == @C@

def @T@verifies_from_app():
    res = subprocess.run(["sha256sum", "-c", "--strict", "SHA256SUMS"], cwd="/app",
                         capture_output=True, text=True)
    assert res.returncode == 0, res.stdout + res.stderr
"""
        return instruction, solution, tests, ("/app/SHA256SUMS",)


class ArchiveOutputs(Operator):
    name, code, imports = "archive_outputs", "tar", "os tarfile"
    summary = "pack the outputs into a tar.gz deliverable"

    def step(self, files, parent):
        archive = f"/app/deliverables/{parent.root_id}.tar.gz"
        instruction = (
            f"pack these {len(files)} file(s) into a gzip-compressed tar archive `{archive}` "
            f"(create `/app/deliverables/`): {_listing(files)}. Each archive member must be "
            "named by the file's path relative to `/app` exactly as listed (a leading `./` is "
            "tolerated); the archive must hold exactly these files as regular-file members and "
            "nothing else (no directory entries), with contents identical to the files on disk.")
        solution = ("mkdir -p deliverables\ntar --no-recursion -czf "
                    f"{shlex.quote(archive)} -- {_args(files)}\n")
        tests = """
def _@T@members():
    with tarfile.open(@A@, "r:gz") as tar:
        return {(m.name[2:] if m.name.startswith("./") else m.name): (
            m, tar.extractfile(m).read() if m.isfile() else None) for m in tar.getmembers()}

def @T@exists_and_is_gzip():
    with open(@A@, "rb") as f:
        assert f.read(2) == b"\\x1f\\x8b", "not gzip-compressed"

def @T@members_are_the_outputs():
    members = _@T@members()
    assert sorted(members) == sorted(@C@)
    assert all(m.isfile() for m, _ in members.values())

def @T@contents_match_disk():
    members = _@T@members()
    for path in @C@:
        assert path in members, f"{path} missing from the archive"
        with open(os.path.join("/app", path), "rb") as f:
            assert members[path][1] == f.read(), path
""".replace("@A@", repr(archive))
        return instruction, solution, tests, (archive,)


class SummaryJson(Operator):
    name, code, imports = "summary_json", "summary", "json os"
    summary = "write a JSON summary of the outputs"

    def step(self, files, parent):
        text = [p for p in files if p in {o.path for o in parent.outputs if o.text}]
        instruction = (
            "write `/app/run_summary.json`: a JSON object with exactly three keys. `files`: the "
            f"list of these {len(files)} path(s) relative to `/app`, sorted in plain byte order "
            f"(as `LC_ALL=C sort` sorts): {_listing(files)}. `total_bytes`: an integer, the sum "
            "of the sizes in bytes of these files as they are on disk at the end. `line_counts`: "
            "an object mapping the path of each of these files that is text (valid UTF-8 "
            "without NUL bytes) to its number of newline characters (what `wc -l` prints); the "
            f"text files are {_listing(text) if text else 'none (use an empty object)'}.")
        count = """
def _@T@line_counts(files, root="."):
    counts = {}
    for path in files:
        with open(os.path.join(root, path), "rb") as f:
            data = f.read()
        try:
            data.decode("utf-8")
        except UnicodeDecodeError:
            continue
        if b"\\0" not in data:
            counts[path] = data.count(b"\\n")
    return counts
"""
        solution = ("python3 - <<'T1JAX_PY'\nimport json, os\n"
                    + count.replace("@T@", "").lstrip("\n") + f"files = {files!r}\n"
                    "summary = {'files': files, 'line_counts': _line_counts(files),\n"
                    "           'total_bytes': sum(os.path.getsize(p) for p in files)}\n"
                    "with open('run_summary.json', 'w') as f:\n"
                    "    json.dump(summary, f, indent=2)\nT1JAX_PY\n")
        tests = count + """
def _@T@load():
    with open("/app/run_summary.json", encoding="utf-8") as f:
        return json.load(f)

def @T@keys_and_files():
    data = _@T@load()
    assert isinstance(data, dict) and set(data) == {"files", "total_bytes", "line_counts"}
    assert data["files"] == @C@

def @T@total_bytes():
    got = _@T@load()["total_bytes"]
    assert isinstance(got, int) and not isinstance(got, bool)
    assert got == sum(os.path.getsize(os.path.join("/app", p)) for p in @C@)

def @T@line_counts():
    assert _@T@load()["line_counts"] == _@T@line_counts(@C@, "/app")
"""
        return instruction, solution, tests, ("/app/run_summary.json",)


class ReadonlyPublish(Operator):
    name, code, imports = "readonly_publish", "publish", "os stat"
    summary = "publish read-only copies of the outputs"

    def step(self, files, parent):
        instruction = (
            f"publish read-only copies of these {len(files)} file(s): {_listing(files)}. Copy "
            "each to `/app/published/<path>`, keeping its path relative to `/app` (e.g. "
            f"`{files[0]}` -> `/app/published/{files[0]}`), creating directories as needed. "
            "Each copy must be byte-identical to its original and have permission mode exactly "
            "`0444` (`r--r--r--`); `/app/published/` must contain no other files. Leave the "
            "originals in place, unchanged.")
        solution = (f"for f in {_args(files)}; do\n"
                    '  mkdir -p "published/$(dirname -- "$f")"\n  cp -- "$f" "published/$f"\n'
                    '  chmod 0444 "published/$f"\ndone\n')
        tests = """
def @T@copies_identical():
    for path in @C@:
        copy = os.path.join("/app/published", path)
        assert os.path.isfile(copy) and not os.path.islink(copy), f"missing {copy}"
        with open(copy, "rb") as a, open(os.path.join("/app", path), "rb") as b:
            assert a.read() == b.read(), path

def @T@modes_are_0444():
    for path in @C@:
        mode = stat.S_IMODE(os.stat(os.path.join("/app/published", path)).st_mode)
        assert mode == 0o444, f"{path}: {oct(mode)}"

def @T@nothing_else():
    found = set()
    for root, _, names in os.walk("/app/published"):
        found.update(os.path.relpath(os.path.join(root, n), "/app/published") for n in names)
    assert found == set(@C@)
"""
        return instruction, solution, tests, ("/app/published/",)


OFFLINE = (ChecksumManifest(), ArchiveOutputs(), SummaryJson(), ReadonlyPublish())

# -- the LLM-backed rewriter -------------------------------------------------------------------
SYSTEM_PROMPT = (
    "You extend training tasks for terminal agents, solved in a Linux container in /app and "
    "checked by pytest afterwards: add ONE more executable step that starts after the task's goal "
    "is reached and builds on the files it produces. Reply with one JSON object, nothing else.")
USER_PROMPT = """## Instruction given to the agent
{instruction}
## Reference solution (solution/solve.sh)
```bash
{solution}
```
## Tests (tests/test_outputs.py)
```python
{tests}
```
## Files the reference solution creates or changes (relative to /app)
{outputs}

Add one new step the agent must do after everything above. Reply with a JSON object with exactly
these string fields: "instruction_addendum": one paragraph starting with "Finally," stating every
new requirement precisely (absolute paths, formats, permissions), so that the tests are passable
from this text alone; "solution_steps": bash that does the new step, appended to solve.sh and run
from /app under `set -euo pipefail`; "tests": Python appended to the test file, import statements
and pytest test functions only (no other top-level code), every function named "{prefix}..." and
new. Each test must fail when only the original solution ran, and pass once the new step is done.
"""


def llm_prompt(parent: Parent, prefix: str) -> list[dict]:
    def clip(text: str, limit: int = 8000) -> str:
        return text if len(text) <= limit else text[:limit] + "\n[... truncated]"
    task = parent.task
    user = USER_PROMPT.format(
        instruction=clip(task.instruction), prefix=prefix,
        solution=clip(task.solution_script.read_text(errors="replace")),
        tests=clip((task.tests_dir / "test_outputs.py").read_text(errors="replace")),
        outputs="\n".join(f"- {o.path} ({o.size} bytes{', text' if o.text else ''})"
                          for o in parent.outputs) or "- (none)")
    return [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": user}]


def top_level_names(source: str) -> set[str]:
    """Names a module binds at top level, imports aside (those may repeat harmlessly)."""
    names: set[str] = set()
    for node in ast.parse(source).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names.update(n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name))
    return names


def parse_llm_reply(text: str, taken: set[str]) -> Rewrite:
    """The model's JSON reply as a Rewrite. RewriteError (with the raw reply) unless it has the
    three fields and its tests are imports plus new test_ functions only."""
    def fail(message: str):
        raise RewriteError(message, raw=text)
    body, data = re.sub(r"^```(?:json)?\s*|\s*```$", "", text.strip()), None
    for span in (body, body[body.find("{"):body.rfind("}") + 1]):  # or a chatty reply's {...}
        try:
            data = json.loads(span)
            break
        except ValueError:
            pass
    if not isinstance(data, dict):
        fail("LLM reply is not a JSON object")
    fields = ("instruction_addendum", "solution_steps", "tests")
    bad = [f for f in fields if not isinstance(data.get(f), str) or not data[f].strip()]
    if bad:
        fail(f"LLM reply lacks non-empty string field(s) {bad}")
    try:
        tree = ast.parse(data["tests"])
    except SyntaxError as err:
        fail(f"LLM tests do not parse: {err.msg} (line {err.lineno})")
    names = []
    for node in tree.body:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            continue
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) \
                or not node.name.startswith("test_"):
            fail("LLM tests may only import modules and define test_ functions; found "
                 f"{getattr(node, 'name', type(node).__name__)} at line {node.lineno}")
        names.append(node.name)
    reused = sorted({n for n in names if n in taken or names.count(n) > 1})
    if not names or reused:
        fail(f"LLM tests reuse existing test names: {reused}" if reused
             else "LLM tests define no test_ function")
    return Rewrite(data["instruction_addendum"].strip(), data["solution_steps"].strip() + "\n",
                   data["tests"].strip() + "\n")


@dataclass(frozen=True)
class LLMRewrite(Operator):
    config: LLMConfig
    name, code, summary = "llm_rewrite", "llm", "do a model-written extra step"
    needs_outputs = False

    def rewrite(self, parent: Parent) -> Rewrite:
        from t1jax.curation.llm import LLMError, chat  # only runs that use a model need it
        try:
            reply = chat(self.config, llm_prompt(parent, self.prefix(parent)))
        except LLMError as err:
            raise RewriteError(f"LLM request failed: {err}")
        source = (parent.task.tests_dir / "test_outputs.py").read_text(errors="replace")
        return parse_llm_reply(reply, top_level_names(source))


def make_operators(names=None, llm: LLMConfig | None = None) -> list[Operator]:
    """The named operators (default: every offline one, plus llm_rewrite when `llm` is set)."""
    known = {op.name: op for op in OFFLINE + ((LLMRewrite(llm),) if llm else ())}
    unknown = [n for n in names or () if n not in known]
    if unknown:
        hint = " (llm_rewrite needs llm.base_url)" if "llm_rewrite" in unknown else ""
        raise ValueError(f"unknown operator(s) {unknown}{hint}; known: {sorted(known)}")
    return [known[n] for n in dict.fromkeys(names)] if names else list(known.values())
