"""One task directory, validated into frozen dataclasses.

Why: the sandbox, the verifier and the trainer all need the same view of a task,
and a malformed task should fail at load time, with a message naming the task dir,
the file and the field, rather than mid-rollout. Two layouts are read: Harbor /
Terminal-Bench 2 (``task.toml``) and legacy Terminal-Bench 1 (``task.yaml``).

One module at ~420 lines: the task format is one concept, the dataclasses and the two readers
that fill them with their value checks; and tests/test_layout.py puts this module in the layer
below verify/ and rollout/, where a new module beside it in tasks/ would not be.
"""

from __future__ import annotations

import math
import os
import re
import tomllib
from dataclasses import dataclass, field as dc_field
from pathlib import Path
from typing import Any, Callable

import yaml

# Harbor's task.toml versions we read (Harbor itself treats the number as a label): 1.1 added
# [task], environment.workdir/env and [[steps]]; 1.2 environment.os; 1.3 network_mode (read as
# allow_internet) and allowed_hosts; 1.4 [task] version. Keys we do not act on are reported as
# ignored (Task.warnings), never silently dropped, except the known-harmless ones below.
TB2_SCHEMAS = ("1.0", "1.1", "1.2", "1.3", "1.4")


def _empty(v: Any) -> bool:
    return v in (None, [], {}, "")


# Harbor keys we do not act on, and when ignoring them changes nothing (then no warning): every
# official TB2.1 task.toml carries `artifacts = []` and `mcp_servers = []`.
_HARMLESS: dict[str, Callable[[Any], bool]] = {
    "artifacts": lambda v: True,  # files copied out after a trial; the reward never reads them
    "source": lambda v: True,
    "multi_step_reward_strategy": lambda v: True,  # [[steps]] are refused on their own
    "environment.mcp_servers": _empty,
    "environment.gpu_types": _empty,
    "environment.skills_dir": _empty,
    "environment.allowed_hosts": _empty,
    "task.version": lambda v: True,
    "agent.network_mode": lambda v: v in (None, "public"),
    "verifier.network_mode": lambda v: v in (None, "public"),
}
_NETWORK_MODES = {"public": True, "no-network": False, "allowlist": True}
_COMPOSE_FILES = ("docker-compose.yaml", "docker-compose.yml", "compose.yaml", "compose.yml")
_COMPOSE_MSG = "docker-compose environments are unsupported; use a single Dockerfile"


class TaskFormatError(ValueError):
    """A malformed task; says where (dir, file, field) so its author can fix it."""

    def __init__(self, task_dir, file, message, field=None):
        super().__init__(task_dir, file, message, field)  # full args keep it picklable
        self.task_dir, self.file, self.message, self.field = task_dir, file, message, field

    def __str__(self) -> str:
        where = ", ".join(p for p in (self.file, self.field and f"field {self.field}") if p)
        where = f" ({where})" if where else ""
        return f"invalid task {self.task_dir}{where}: {self.message}"


@dataclass(frozen=True)
class VerifierConfig:
    timeout_sec: float = 600.0
    env: dict = dc_field(default_factory=dict)
    user: str | None = None


@dataclass(frozen=True)
class AgentConfig:
    timeout_sec: float = 600.0
    user: str | None = None


@dataclass(frozen=True)
class EnvironmentConfig:
    """Harbor's defaults; allow_internet=True is Harbor's, our sandbox must also allow it."""

    build_timeout_sec: float = 600.0
    docker_image: str | None = None
    cpus: float = 1.0
    memory_mb: int = 2048
    storage_mb: int = 10240
    gpus: int = 0
    allow_internet: bool = True
    env: dict = dc_field(default_factory=dict)  # set in every sandbox of the task
    workdir: str | None = None  # overrides the image's WORKDIR for every command (Harbor 1.1)
    os: str = "linux"  # Harbor 1.2; windows tasks are refused at load


@dataclass(frozen=True)
class SolutionConfig:
    env: dict = dc_field(default_factory=dict)


@dataclass(frozen=True)
class Task:
    task_id: str
    path: Path
    layout: str
    schema_version: str
    instruction: str
    name: str | None
    description: str | None
    authors: tuple
    keywords: tuple
    metadata: dict
    verifier: VerifierConfig
    agent: AgentConfig
    environment: EnvironmentConfig
    solution: SolutionConfig
    environment_dir: Path | None
    dockerfile: Path | None
    tests_dir: Path
    test_script: Path
    solution_script: Path | None
    warnings: tuple[str, ...]

    def test_files(self) -> dict[str, Path]:
        """Path under /tests in the container -> host file, i.e. what the verifier copies in."""
        files: dict[str, Path] = {}
        if self.tests_dir.is_dir():
            for p in sorted(self.tests_dir.rglob("*")):
                rel = p.relative_to(self.tests_dir)
                if p.is_file() and "__pycache__" not in rel.parts and p.suffix != ".pyc":
                    files[rel.as_posix()] = p
        if self.layout == "tb1":  # TB1 copies the root run-tests.sh next to tests/*
            files[self.test_script.name] = self.test_script
        return files

    def _meta_str(self, key: str) -> str | None:
        value = self.metadata.get(key)
        return value if isinstance(value, str) else None

    difficulty = property(lambda self: self._meta_str("difficulty"), doc="easy|medium|hard, if set")
    category = property(lambda self: self._meta_str("category"), doc="metadata category, if set")

    @property
    def tags(self) -> tuple[str, ...]:
        value = self.metadata.get("tags")
        if isinstance(value, (list, tuple)) and value:
            return tuple(str(t) for t in value)
        return tuple(self.keywords)


_ENV_REF = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")


def resolve_env(task: "Task", table: dict, section: str) -> dict:
    """A task's env table with Harbor's `${VAR}` / `${VAR:-default}` filled from the host's
    environment (how tasks take API keys and the like); an unset VAR without a default is an
    error naming the task and the key, never an empty value."""
    def fill(key: str, value: str) -> str:
        def one(m: re.Match) -> str:
            if m[1] in os.environ:
                return os.environ[m[1]]
            if m[2] is not None:
                return m[2]
            raise TaskFormatError(task.path, "task.toml", f"${{{m[1]}}} is not set on this host "
                                  f"(export it, or give a default: ${{{m[1]}:-value}})",
                                  f"{section}.{key}")
        return _ENV_REF.sub(one, value)
    return {k: fill(k, v) for k, v in table.items()}


class _Bad(Exception):
    """A value failed a check; the caller adds task dir, file and field."""


def _show(v: Any) -> str:
    return f"{type(v).__name__} {v!r}"


def _check(ok: Callable[[Any], bool], want: str, convert: Callable = lambda v: v) -> Callable:
    """A checker: converted value if ``ok(value)``, else _Bad saying what was wanted."""
    def check(v: Any) -> Any:
        if not ok(v):
            raise _Bad(f"expected {want}, got {_show(v)}")
        return convert(v)
    return check


def _is_int(v: Any) -> bool:  # bool is an int subclass; never accept it as a number
    return isinstance(v, int) and not isinstance(v, bool)


def _is_strs(values: Any) -> bool:
    return all(isinstance(x, str) for x in values)


def _int_at_least(n: int) -> Callable:
    return _check(lambda v: _is_int(v) and v >= n, f"an integer >= {n}")


_pos_float = _check(lambda v: (_is_int(v) or isinstance(v, float)) and 0 < v < math.inf,
                    "a positive number", float)
_str = _check(lambda v: isinstance(v, str), "a string")
_bool = _check(lambda v: isinstance(v, bool), "true or false")
_str_dict = _check(lambda v: isinstance(v, dict) and _is_strs(v.values()),
                   "a table of string values", dict)
_str_tuple = _check(lambda v: isinstance(v, list) and _is_strs(v), "a list of strings", tuple)
_authors = _check(lambda v: isinstance(v, list) and all(
    isinstance(a, dict) and _is_strs(a.values()) for a in v),
    "a list of {name, email} tables", lambda v: tuple(dict(a) for a in v))
_UNIT_MB = {None: 1, "K": 1 / 1024, "M": 1, "G": 1024, "T": 1024 * 1024}
_SIZE_RE = re.compile(r"\s*(\d+(?:\.\d+)?)\s*(?:([KMGT])i?B?)?\s*", re.I)


def _size_mb(v: Any) -> int:
    """Deprecated ``memory``/``storage``: "4G"-style strings, or plain MB."""
    m = isinstance(v, str) and _SIZE_RE.fullmatch(v)
    if m and float(m[1]) > 0:
        return max(1, math.ceil(float(m[1]) * _UNIT_MB[m[2] and m[2].upper()]))
    return _check(lambda x: _is_int(x) and x > 0, "a size like '4G' or a positive number of MB")(v)


_SECTIONS: dict[str, dict[str, Callable[[Any], Any]]] = {
    "task": {"name": _str, "description": _str, "authors": _authors, "keywords": _str_tuple},
    "verifier": {"timeout_sec": _pos_float, "env": _str_dict, "user": _str},
    "agent": {"timeout_sec": _pos_float, "user": _str},
    "environment": {"build_timeout_sec": _pos_float, "docker_image": _str, "cpus": _pos_float,
                    "memory_mb": _int_at_least(1), "storage_mb": _int_at_least(1),
                    "gpus": _int_at_least(0), "allow_internet": _bool,
                    "memory": _size_mb, "storage": _size_mb, "env": _str_dict,
                    "workdir": _check(lambda v: isinstance(v, str) and v.startswith("/"),
                                      "an absolute path"),
                    "os": _check(lambda v: v == "linux", '"linux" (windows tasks are not '
                                 'supported: their scripts are .bat files)')},
    "solution": {"env": _str_dict},
}
_TB1_KEYS = {"instruction", "author_name", "author_email", "difficulty", "category", "tags",
             "parser_name", "max_agent_timeout_sec", "max_test_timeout_sec",
             "run_tests_in_same_shell", "disable_asciinema", "estimated_duration_sec",
             "expert_time_estimate_min", "junior_time_estimate_min"}


@dataclass
class _Ctx:
    """Where we are while parsing, so every error and warning names it."""

    task_dir: Path
    file: str
    warnings: list

    def fail(self, message: str, field: str | None = None, file: str | None = None):
        raise TaskFormatError(self.task_dir, file or self.file, message, field)

    def check(self, fn: Callable[[Any], Any], value: Any, field: str) -> Any:
        try:
            return fn(value)
        except _Bad as e:
            self.fail(str(e), field)

    def read(self, rel: str, what: str | None = None) -> str:
        if not (self.task_dir / rel).is_file():
            self.fail("missing", what, file=rel)
        try:
            return (self.task_dir / rel).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as e:
            self.fail(f"cannot read: {e}", what, file=rel)

    def parse(self, loads: Callable[[str], Any], error: type[Exception],
              problem: Callable[[Exception], str]) -> Any:
        """This file read and parsed; a syntax error fails naming the file and `problem(e)`."""
        try:
            return loads(self.read(self.file))
        except error as e:
            self.fail(problem(e))


def _schema_version(ctx: _Ctx, raw: dict) -> str:
    key = "schema_version" if "schema_version" in raw else "version"
    value = raw.get(key)
    if value is None:
        ctx.warnings.append(f"{ctx.file}: no schema_version; assuming 1.0")
        return "1.0"
    if "version" in raw and raw["version"] != value:
        ctx.fail(f"conflicts with version = {raw['version']!r}", "schema_version")
    if value not in TB2_SCHEMAS:
        ctx.fail(f"unknown schema {value!r}; supported: {', '.join(TB2_SCHEMAS)} (as strings)", key)
    return value


def _load_tb2(path: Path, warnings: list) -> dict:
    ctx = _Ctx(path, "task.toml", warnings)
    raw = ctx.parse(tomllib.loads, tomllib.TOMLDecodeError, lambda e: f"invalid TOML: {e}")
    version = _schema_version(ctx, raw)
    if "steps" in raw:  # before instruction.md: a multi-step task keeps one per step
        ctx.fail("multi-step tasks ([[steps]], one instruction and verifier per step) are not "
                 "supported yet; run each step as its own task", "steps")
    sections: dict[str, dict] = {name: {} for name in _SECTIONS}
    metadata: dict = {}
    for key, value in raw.items():
        if key in ("schema_version", "version"):
            continue
        if key not in _SECTIONS and key != "metadata":
            if not _HARMLESS.get(key, lambda v: False)(value):
                warnings.append(f"task.toml: unknown top-level key '{key}' ignored")
            continue
        if not isinstance(value, dict):
            ctx.fail(f"expected a table, got {_show(value)}", key)
        if key == "metadata":
            metadata = dict(value)
            continue
        for sub, item in value.items():
            if sub in _SECTIONS[key]:
                sections[key][sub] = ctx.check(_SECTIONS[key][sub], item, f"{key}.{sub}")
            elif (key, sub) == ("environment", "network_mode"):
                if item not in _NETWORK_MODES:
                    ctx.fail(f"expected one of {sorted(_NETWORK_MODES)}, got {_show(item)}",
                             "environment.network_mode")
                if item == "allowlist":
                    warnings.append("task.toml: environment.network_mode 'allowlist' is not "
                                    "enforced here: read as allow_internet = true")
                sections[key]["allow_internet"] = _NETWORK_MODES[item]
            elif not _HARMLESS.get(f"{key}.{sub}", lambda v: False)(item):
                warnings.append(f"task.toml: unknown key '{key}.{sub}' ignored")
    env = sections["environment"]
    for old, new in (("memory", "memory_mb"), ("storage", "storage_mb")):
        if old in env:  # every TB2.0 task writes memory = "2G": read, not warned about
            mb = env.pop(old)
            if env.setdefault(new, mb) != mb:
                ctx.fail(f"{mb} MB conflicts with {new} = {env[new]}", f"environment.{old}")
    environment = EnvironmentConfig(**env)

    instruction = ctx.read("instruction.md", "instruction")
    if not instruction.strip():
        ctx.fail("is empty", "instruction", file="instruction.md")
    env_dir = path / "environment"
    dockerfile = _dockerfile(ctx, env_dir, "environment/", environment.docker_image, tb2=True)
    if not (path / "tests" / "test.sh").is_file():
        ctx.fail("missing verifier script", file="tests/test.sh")
    solve = path / "solution" / "solve.sh"
    meta = sections["task"]
    return dict(
        layout="tb2", schema_version=version, instruction=instruction,
        name=meta.get("name"), description=meta.get("description"),
        authors=meta.get("authors", ()), keywords=meta.get("keywords", ()), metadata=metadata,
        verifier=VerifierConfig(**sections["verifier"]), agent=AgentConfig(**sections["agent"]),
        environment=environment, solution=SolutionConfig(**sections["solution"]),
        environment_dir=env_dir if env_dir.is_dir() else None, dockerfile=dockerfile,
        tests_dir=path / "tests", test_script=path / "tests" / "test.sh",
        solution_script=solve if solve.is_file() else None)


def _dockerfile(ctx: _Ctx, env_dir: Path, prefix: str, image: str | None, tb2: bool) -> Path | None:
    """The single Dockerfile we build; compose-only tasks are rejected, not half-run."""
    dockerfile = env_dir / "Dockerfile"
    compose = [n for n in _COMPOSE_FILES if (env_dir / n).is_file()]
    if dockerfile.is_file():
        if compose and tb2:  # TB1 tasks ship a boilerplate compose file next to it
            ctx.warnings.append(f"{prefix}{compose[0]}: ignored; only the Dockerfile is used")
        return dockerfile
    if compose:
        ctx.fail(_COMPOSE_MSG, file=prefix + compose[0])
    if image is None:
        ctx.fail("missing, and no environment.docker_image is set",
                 "environment.docker_image" if tb2 else None, file=prefix + "Dockerfile")
    return None


def _yaml_problem(e: Exception) -> str:
    mark = getattr(e, "problem_mark", None)
    at = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
    return f"invalid YAML{at}: {getattr(e, 'problem', None) or e}"


def _load_tb1(path: Path, warnings: list) -> dict:
    ctx = _Ctx(path, "task.yaml", warnings)
    raw = ctx.parse(yaml.safe_load, yaml.YAMLError, _yaml_problem)
    if not isinstance(raw, dict):
        ctx.fail(f"expected a mapping at the top level, got {_show(raw)}")
    instruction = raw.get("instruction")
    if not isinstance(instruction, str) or not instruction.strip():
        ctx.fail(f"must be a non-empty string, got {_show(instruction)}", "instruction")
    timeout = {key: ctx.check(_pos_float, raw.get(key, default), key)  # TB1 defaults
               for key, default in (("max_agent_timeout_sec", 180), ("max_test_timeout_sec", 30))}
    for key, fn in (("tags", _str_tuple), ("difficulty", _str), ("category", _str)):
        if raw.get(key) is not None:
            ctx.check(fn, raw[key], key)
    for key in sorted(set(raw) - _TB1_KEYS, key=str):
        warnings.append(f"task.yaml: unknown key '{key}' kept in metadata")
    metadata = {k: v for k, v in raw.items() if k != "instruction"}
    authors = ()
    if isinstance(raw.get("author_name"), str):
        authors = ({"name": raw["author_name"], "email": str(raw.get("author_email") or "")},)

    dockerfile = _dockerfile(ctx, path, "", None, tb2=False)
    if not (path / "run-tests.sh").is_file():
        ctx.fail("missing verifier script", file="run-tests.sh")
    solution = path / "solution.sh"
    if not solution.is_file():
        solution = None
        if (path / "solution.yaml").is_file():
            warnings.append("solution.yaml: command-list solutions are unsupported; ignored")
    return dict(
        layout="tb1", schema_version="tb1", instruction=instruction, name=None, description=None,
        authors=authors, keywords=(), metadata=metadata,
        verifier=VerifierConfig(timeout_sec=timeout["max_test_timeout_sec"]),
        agent=AgentConfig(timeout_sec=timeout["max_agent_timeout_sec"]),
        environment=EnvironmentConfig(), solution=SolutionConfig(),
        environment_dir=path, dockerfile=dockerfile, tests_dir=path / "tests",
        test_script=path / "run-tests.sh", solution_script=solution)


def load_task(path: str | os.PathLike) -> Task:
    """Load and validate one task directory; raises TaskFormatError on any problem."""
    path = Path(os.path.abspath(os.fspath(path)))
    if not path.is_dir():
        raise TaskFormatError(path, None, "not a directory" if path.exists() else "does not exist")
    warnings: list[str] = []
    if (path / "task.toml").is_file():
        if (path / "task.yaml").is_file():
            warnings.append("task.yaml: ignored; task.toml takes precedence")
        fields = _load_tb2(path, warnings)
    elif (path / "task.yaml").is_file():
        fields = _load_tb1(path, warnings)
    else:
        raise TaskFormatError(path, "task.toml", "neither task.toml nor task.yaml found")
    return Task(task_id=path.name, path=path, warnings=tuple(warnings), **fields)
