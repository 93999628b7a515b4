"""Task-format loader tests: both layouts, every validation error, and pools."""

from __future__ import annotations

import pickle
import textwrap
from pathlib import Path

import pytest

from t1jax.tasks.pool import (PoolLoadError, default_pool_dir, find_task_dirs, load_pool)
from t1jax.tasks.task import (AgentConfig, EnvironmentConfig, SolutionConfig, TaskFormatError,
                              VerifierConfig, load_task)

MINIMAL_TOML = 'version = "1.0"\n'

FULL_TOML = """
schema_version = "1.1"

[task]
name = "org/full-task"
description = "A task using every section."
keywords = ["kw1", "kw2"]
authors = [{ name = "Ada", email = "ada@example.com" }]

[metadata]
author_name = "Ada"
author_email = "ada@example.com"
difficulty = "hard"
category = "systems"
tags = ["c", "build"]
difficulty_explanation = "many steps"
expert_time_estimate_min = 30
junior_time_estimate_min = 120

[verifier]
timeout_sec = 120
env = { API_KEY = "x", MODE = "strict" }
user = "tester"

[agent]
timeout_sec = 900.5
user = "agent"

[environment]
build_timeout_sec = 1200
docker_image = "ghcr.io/org/full:1"
cpus = 2
memory_mb = 8192
storage_mb = 20480
gpus = 1
allow_internet = false

[solution]
env = { HINT = "1" }
"""


def write_task(root: Path, name: str, files: dict[str, str | None] | None = None, *,
               toml: str | None = MINIMAL_TOML) -> Path:
    """A valid minimal TB2 task, with `files` overriding (None deletes) paths in it."""
    d = root / name
    layout = {
        "task.toml": toml,
        "instruction.md": "Do the thing.\n",
        "environment/Dockerfile": "FROM ubuntu:24.04\n",
        "tests/test.sh": "#!/bin/bash\nexit 0\n",
        "solution/solve.sh": "#!/bin/bash\ntrue\n",
    }
    layout.update(files or {})
    for rel, text in layout.items():
        if text is not None:
            (d / rel).parent.mkdir(parents=True, exist_ok=True)
            (d / rel).write_text(textwrap.dedent(text))
    d.mkdir(parents=True, exist_ok=True)
    return d


def write_tb1(root: Path, name: str, files: dict[str, str | None] | None = None) -> Path:
    """A valid legacy Terminal-Bench 1 task."""
    layout = {
        "task.toml": None, "instruction.md": None, "environment/Dockerfile": None,
        "tests/test.sh": None, "solution/solve.sh": None,
        "task.yaml": """\
            instruction: |
              Fix the server.
            author_name: Bob
            author_email: bob@example.com
            difficulty: medium
            category: networking
            tags: [nginx, http]
            parser_name: pytest
            max_agent_timeout_sec: 360
            max_test_timeout_sec: 60
            run_tests_in_same_shell: false
            """,
        "Dockerfile": "FROM python:3.12\n",
        "docker-compose.yaml": "services: {client: {build: .}}\n",
        "run-tests.sh": "#!/bin/bash\npytest $TEST_DIR/test_outputs.py\n",
        "tests/test_outputs.py": "def test_ok():\n    assert True\n",
        "solution.sh": "#!/bin/bash\ntrue\n",
    }
    layout.update(files or {})
    return write_task(root, name, layout, toml=None)


def test_full_tb2_round_trips(tmp_path):
    task = load_task(write_task(tmp_path, "full", toml=FULL_TOML))
    assert task.task_id == "full" and task.path == tmp_path / "full"
    assert (task.layout, task.schema_version) == ("tb2", "1.1")
    assert task.instruction == "Do the thing.\n"
    assert task.name == "org/full-task" and task.description.startswith("A task")
    assert task.authors == ({"name": "Ada", "email": "ada@example.com"},)
    assert task.keywords == ("kw1", "kw2")
    assert task.metadata["expert_time_estimate_min"] == 30
    assert (task.difficulty, task.category, task.tags) == ("hard", "systems", ("c", "build"))
    assert task.verifier == VerifierConfig(120.0, {"API_KEY": "x", "MODE": "strict"}, "tester")
    assert task.agent == AgentConfig(900.5, "agent")
    assert task.environment == EnvironmentConfig(1200.0, "ghcr.io/org/full:1", 2.0, 8192, 20480, 1, False)
    assert isinstance(task.verifier.timeout_sec, float) and isinstance(task.environment.cpus, float)
    assert task.solution == SolutionConfig({"HINT": "1"})
    assert task.environment_dir == task.path / "environment"
    assert task.dockerfile == task.path / "environment" / "Dockerfile"
    assert task.test_script == task.path / "tests" / "test.sh"
    assert task.solution_script == task.path / "solution" / "solve.sh"
    assert task.warnings == ()


def test_minimal_tb2_gets_defaults(tmp_path):
    task = load_task(write_task(tmp_path, "mini", {"solution/solve.sh": None}))
    assert task.schema_version == "1.0"
    assert task.verifier == VerifierConfig() and task.verifier.timeout_sec == 600.0
    assert task.agent == AgentConfig() and task.solution == SolutionConfig()
    assert task.environment == EnvironmentConfig()
    assert task.environment.allow_internet is True and task.environment.memory_mb == 2048
    assert (task.name, task.description, task.authors, task.keywords) == (None, None, (), ())
    assert task.metadata == {} and task.tags == () and task.difficulty is None
    assert task.solution_script is None and task.warnings == ()


# An official TB2.1 task.toml's shape (fields and forms only; the values are ours).
TB21_TOML = """schema_version = "1.1"
artifacts = []

[task]
name = "local/shape"
description = "A task in the official layout."
keywords = ["shape"]

[[task.authors]]
name = "Someone"
email = "someone@example.com"

[metadata]
difficulty = "easy"
category = "software-engineering"
tags = ["git"]

[verifier]
timeout_sec = 900.0

[verifier.env]

[agent]
timeout_sec = 900.0

[environment]
build_timeout_sec = 600.0
cpus = 1
memory_mb = 2048
storage_mb = 10240
gpus = 0
allow_internet = true
mcp_servers = []

[environment.env]

[solution.env]
"""


def test_official_tb21_task_toml_loads_without_noise(tmp_path):
    """Every official TB2.1 task.toml carries artifacts = [], mcp_servers = [] and empty env
    tables: known and harmless, so no warning (a warning on every task is noise)."""
    task = load_task(write_task(tmp_path, "shape", {"task.toml": TB21_TOML}))
    assert task.warnings == ()
    assert task.name == "local/shape" and task.authors[0]["name"] == "Someone"
    assert task.environment.env == {} and task.verifier.env == {} and task.solution.env == {}
    assert task.environment.allow_internet and task.category == "software-engineering"


def test_schema_1_2_to_1_4_keys(tmp_path):
    toml = ('schema_version = "1.2"\n[task]\nname = "local/x"\n[verifier]\ntimeout_sec = 60.0\n'
            '[environment]\nos = "linux"\nworkdir = "/workspace"\nmcp_servers = [{name = "m", '
            'transport = "sse", url = "http://localhost:1"}]\n[environment.env]\nA = "1"\n')
    task = load_task(write_task(tmp_path, "v12", {"task.toml": toml}))
    assert task.schema_version == "1.2" and task.verifier.timeout_sec == 60.0
    assert task.environment.workdir == "/workspace" and task.environment.env == {"A": "1"}
    # an MCP server the task expects is not started here: that one is said
    assert task.warnings == ("task.toml: unknown key 'environment.mcp_servers' ignored",)
    with pytest.raises(TaskFormatError, match=r"environment\.os.*windows tasks are not supported"):
        load_task(write_task(tmp_path, "win", {"task.toml": 'schema_version = "1.2"\n'
                                               '[environment]\nos = "windows"\n'}))
    with pytest.raises(TaskFormatError, match=r"environment\.workdir.*absolute path"):
        load_task(write_task(tmp_path, "rel", {"task.toml": '[environment]\nworkdir = "app"\n'}))
    for mode, allowed in (("no-network", False), ("public", True), ("allowlist", True)):
        toml = f'schema_version = "1.3"\n[environment]\nnetwork_mode = "{mode}"\n'
        task = load_task(write_task(tmp_path, f"net-{mode}", {"task.toml": toml}))
        assert task.environment.allow_internet is allowed
        assert bool(task.warnings) is (mode == "allowlist")
    toml = 'schema_version = "1.4"\n[task]\nname = "local/y"\nversion = "2"\n'
    assert load_task(write_task(tmp_path, "v14", {"task.toml": toml})).warnings == ()


def test_environment_env_fills_host_variables(tmp_path, monkeypatch):
    """Harbor's ${VAR} / ${VAR:-default} in env tables come from the host; an unset one with no
    default is an error naming the task and the key, never an empty value."""
    from t1jax.tasks.task import resolve_env
    toml = ('[environment.env]\nKEY = "${T1JAX_TEST_KEY}"\nLEVEL = "${T1JAX_TEST_UNSET:-3}"\n'
            'PLAIN = "x"\n')
    task = load_task(write_task(tmp_path, "envs", {"task.toml": toml}))
    monkeypatch.setenv("T1JAX_TEST_KEY", "secret")
    monkeypatch.delenv("T1JAX_TEST_UNSET", raising=False)
    assert resolve_env(task, task.environment.env, "environment.env") == {
        "KEY": "secret", "LEVEL": "3", "PLAIN": "x"}
    monkeypatch.delenv("T1JAX_TEST_KEY")
    with pytest.raises(TaskFormatError, match=r"envs.*environment\.env\.KEY.*T1JAX_TEST_KEY"):
        resolve_env(task, task.environment.env, "environment.env")


def test_unknown_schema_names_the_versions_read(tmp_path):
    with pytest.raises(TaskFormatError,
                       match=r"unknown schema '2\.0'; supported: 1\.0, 1\.1, 1\.2, 1\.3, 1\.4"):
        load_task(write_task(tmp_path, "v2", {"task.toml": 'schema_version = "2.0"\n'}))


def test_keywords_are_tag_fallback(tmp_path):
    toml = 'schema_version = "1.1"\n[task]\nkeywords = ["a", "b"]\n'
    assert load_task(write_task(tmp_path, "kw", toml=toml)).tags == ("a", "b")


@pytest.mark.parametrize("memory, storage, mem_mb, sto_mb", [
    ('"4G"', '"10G"', 4096, 10240), ('"512M"', '"1T"', 512, 1024 * 1024),
    ("3000", '"1.5GB"', 3000, 1536), ('"8Gi"', '"2048"', 8192, 2048)])
def test_deprecated_sizes(tmp_path, memory, storage, mem_mb, sto_mb):
    toml = f'version = "1.0"\n[environment]\nmemory = {memory}\nstorage = {storage}\n'
    task = load_task(write_task(tmp_path, "sizes", toml=toml))
    assert (task.environment.memory_mb, task.environment.storage_mb) == (mem_mb, sto_mb)
    assert task.warnings == ()  # TB2.0's own form: converted, no noise


def test_docker_image_without_dockerfile(tmp_path):
    toml = 'version = "1.0"\n[environment]\ndocker_image = "alpine:3"\n'
    task = load_task(write_task(tmp_path, "img", {"environment/Dockerfile": None}, toml=toml))
    assert task.dockerfile is None and task.environment.docker_image == "alpine:3"


def test_unknown_keys_warn(tmp_path):
    toml = MINIMAL_TOML + '[verifier]\nretries = 3\n[agent]\nmodel = "x"\n[extras]\nfoo = 1\n'
    task = load_task(write_task(tmp_path, "warn", toml=toml))
    assert task.verifier == VerifierConfig()
    assert any("task.toml" in w and "verifier.retries" in w for w in task.warnings)
    assert any("task.toml" in w and "agent.model" in w for w in task.warnings)
    assert any("task.toml" in w and "extras" in w for w in task.warnings)


def test_tb1_task_loads(tmp_path):
    task = load_task(write_tb1(tmp_path, "legacy"))
    assert (task.layout, task.schema_version) == ("tb1", "tb1")
    assert task.instruction == "Fix the server.\n"
    assert task.agent.timeout_sec == 360.0 and task.verifier.timeout_sec == 60.0
    assert (task.difficulty, task.category, task.tags) == ("medium", "networking", ("nginx", "http"))
    assert task.metadata["parser_name"] == "pytest" and "instruction" not in task.metadata
    assert task.authors == ({"name": "Bob", "email": "bob@example.com"},)
    assert task.environment_dir == task.path and task.dockerfile == task.path / "Dockerfile"
    assert task.test_script == task.path / "run-tests.sh"
    assert task.solution_script == task.path / "solution.sh"
    assert task.test_files() == {"run-tests.sh": task.path / "run-tests.sh",
                                 "test_outputs.py": task.path / "tests" / "test_outputs.py"}
    assert task.warnings == ()


def test_tb1_defaults_and_solution_yaml(tmp_path):
    d = write_tb1(tmp_path, "old", {"task.yaml": "instruction: hi\nfancy: 1\n", "tests/test_outputs.py": None,
                                   "solution.sh": None, "solution.yaml": "- command: ls\n"})
    task = load_task(d)
    assert task.agent.timeout_sec == 180.0 and task.verifier.timeout_sec == 30.0
    assert task.solution_script is None
    assert any("solution.yaml" in w for w in task.warnings)
    assert any("task.yaml" in w and "fancy" in w for w in task.warnings)
    assert task.test_files() == {"run-tests.sh": d / "run-tests.sh"}


def test_test_files_lists_nested(tmp_path):
    task = load_task(write_task(tmp_path, "nested", {
        "tests/test_outputs.py": "x = 1\n", "tests/data/golden/out.txt": "ok\n",
        "tests/__pycache__/junk.pyc": "zz"}))
    assert task.test_files() == {
        "data/golden/out.txt": task.tests_dir / "data" / "golden" / "out.txt",
        "test.sh": task.tests_dir / "test.sh",
        "test_outputs.py": task.tests_dir / "test_outputs.py"}


BAD_TB2 = {
    "bad-toml": ({"task.toml": 'version = "1.0"\n[agent\n'}, "task.toml", None),
    "schema": ({"task.toml": 'schema_version = "2.0"\n'}, "task.toml", "schema_version"),
    "multi-step": ({"task.toml": 'schema_version = "1.2"\n[[steps]]\nname = "one"\n',
                    "instruction.md": None}, "task.toml", "steps"),
    "schema-old-key": ({"task.toml": 'version = "0.9"\n'}, "task.toml", "version"),
    "timeout-str": ({"task.toml": MINIMAL_TOML + '[verifier]\ntimeout_sec = "fast"\n'},
                    "task.toml", "verifier.timeout_sec"),
    "timeout-zero": ({"task.toml": MINIMAL_TOML + "[agent]\ntimeout_sec = 0\n"},
                     "task.toml", "agent.timeout_sec"),
    "timeout-neg": ({"task.toml": MINIMAL_TOML + "[environment]\nbuild_timeout_sec = -5\n"},
                    "task.toml", "environment.build_timeout_sec"),
    "timeout-bool": ({"task.toml": MINIMAL_TOML + "[agent]\ntimeout_sec = true\n"},
                     "task.toml", "agent.timeout_sec"),
    "cpus": ({"task.toml": MINIMAL_TOML + "[environment]\ncpus = -1\n"}, "task.toml", "environment.cpus"),
    "memory-mb": ({"task.toml": MINIMAL_TOML + "[environment]\nmemory_mb = 0\n"},
                  "task.toml", "environment.memory_mb"),
    "memory-float": ({"task.toml": MINIMAL_TOML + "[environment]\nmemory_mb = 1.5\n"},
                     "task.toml", "environment.memory_mb"),
    "gpus-bool": ({"task.toml": MINIMAL_TOML + "[environment]\ngpus = true\n"}, "task.toml", "environment.gpus"),
    "internet": ({"task.toml": MINIMAL_TOML + '[environment]\nallow_internet = "no"\n'},
                 "task.toml", "environment.allow_internet"),
    "memory-str": ({"task.toml": MINIMAL_TOML + '[environment]\nmemory = "lots"\n'},
                   "task.toml", "environment.memory"),
    "env-not-table": ({"task.toml": MINIMAL_TOML + '[verifier]\nenv = "A=1"\n'}, "task.toml", "verifier.env"),
    "env-not-str": ({"task.toml": MINIMAL_TOML + "[solution]\nenv = { A = 1 }\n"}, "task.toml", "solution.env"),
    "section-not-table": ({"task.toml": MINIMAL_TOML.replace("\n", "\nagent = 5\n")}, "task.toml", "agent"),
    "keywords": ({"task.toml": 'schema_version = "1.1"\n[task]\nkeywords = "a"\n'}, "task.toml", "task.keywords"),
    "no-instruction": ({"instruction.md": None}, "instruction.md", "instruction"),
    "empty-instruction": ({"instruction.md": "  \n\n"}, "instruction.md", "instruction"),
    "no-test-sh": ({"tests/test.sh": None}, "tests/test.sh", None),
    "no-dockerfile": ({"environment/Dockerfile": None}, "environment/Dockerfile", "environment.docker_image"),
    "compose-only": ({"environment/Dockerfile": None, "environment/docker-compose.yaml": "services: {}\n"},
                     "environment/docker-compose.yaml", None),
}
BAD_TB1 = {
    "tb1-bad-yaml": ({"task.yaml": "instruction: [unclosed\n"}, "task.yaml", None),
    "tb1-not-mapping": ({"task.yaml": "- a\n- b\n"}, "task.yaml", None),
    "tb1-empty-instruction": ({"task.yaml": "instruction: ''\n"}, "task.yaml", "instruction"),
    "tb1-no-instruction": ({"task.yaml": "difficulty: easy\n"}, "task.yaml", "instruction"),
    "tb1-timeout": ({"task.yaml": "instruction: hi\nmax_agent_timeout_sec: fast\n"},
                    "task.yaml", "max_agent_timeout_sec"),
    "tb1-tags": ({"task.yaml": "instruction: hi\ntags: nginx\n"}, "task.yaml", "tags"),
    "tb1-no-run-tests": ({"run-tests.sh": None}, "run-tests.sh", None),
    "tb1-no-dockerfile": ({"Dockerfile": None, "docker-compose.yaml": None}, "Dockerfile", None),
    "tb1-compose-only": ({"Dockerfile": None}, "docker-compose.yaml", None),
}


def _assert_names(err: TaskFormatError, name: str, file: str | None, field: str | None):
    text = str(err)
    assert name in text and err.task_dir.name == name
    assert err.file == file and (file is None or file in text)
    assert err.field == field and (field is None or field in text)


@pytest.mark.parametrize("name", sorted(BAD_TB2))
def test_malformed_tb2(tmp_path, name):
    files, file, field = BAD_TB2[name]
    with pytest.raises(TaskFormatError) as info:
        load_task(write_task(tmp_path, name, files))
    _assert_names(info.value, name, file, field)


@pytest.mark.parametrize("name", sorted(BAD_TB1))
def test_malformed_tb1(tmp_path, name):
    files, file, field = BAD_TB1[name]
    with pytest.raises(TaskFormatError) as info:
        load_task(write_tb1(tmp_path, name, files))
    _assert_names(info.value, name, file, field)


def test_error_details(tmp_path):
    with pytest.raises(TaskFormatError, match=r"line \d+, column \d+"):
        load_task(write_task(tmp_path, "toml-pos", {"task.toml": 'version = "1.0"\n[agent\n'}))
    with pytest.raises(TaskFormatError, match=r"line \d+, column \d+"):
        load_task(write_tb1(tmp_path, "yaml-pos", {"task.yaml": "instruction: [unclosed\n"}))
    with pytest.raises(TaskFormatError, match="docker-compose environments are unsupported"):
        load_task(write_task(tmp_path, "compose", {"environment/Dockerfile": None,
                                                   "environment/docker-compose.yaml": "x: 1\n"}))
    err = pickle.loads(pickle.dumps(TaskFormatError(tmp_path, "task.toml", "boom", "agent.user")))
    assert (err.file, err.field, err.message) == ("task.toml", "agent.user", "boom")


def test_not_a_task(tmp_path):
    with pytest.raises(TaskFormatError, match="does not exist"):
        load_task(tmp_path / "missing")
    (tmp_path / "file.txt").write_text("x")
    with pytest.raises(TaskFormatError, match="not a directory"):
        load_task(tmp_path / "file.txt")
    (tmp_path / "empty").mkdir()
    with pytest.raises(TaskFormatError) as info:
        load_task(tmp_path / "empty")
    assert "empty" in str(info.value) and "task.toml" in str(info.value) and "task.yaml" in str(info.value)


def test_find_task_dirs(tmp_path):
    write_task(tmp_path / "group", "b")
    write_task(tmp_path, "a", {"tests/inner/task.toml": MINIMAL_TOML})  # no descent into tasks
    write_task(tmp_path / ".hidden", "c")
    write_tb1(tmp_path / "group" / "deeper", "d")
    assert find_task_dirs(tmp_path) == [tmp_path / "a", tmp_path / "group" / "b",
                                        tmp_path / "group" / "deeper" / "d"]
    assert find_task_dirs(tmp_path / "a") == [tmp_path / "a"]


def _mixed_pool(root: Path) -> None:
    write_task(root, "good-1")
    write_tb1(root, "good-2")
    write_task(root, "bad-1", {"tests/test.sh": None})
    write_task(root / "sub", "bad-2", {"task.toml": 'version = "9"\n'})


def test_load_pool_reports_all_errors(tmp_path):
    _mixed_pool(tmp_path)
    with pytest.raises(PoolLoadError) as info:
        load_pool(tmp_path)
    text = str(info.value)
    assert "2 invalid task(s)" in text and "bad-1" in text and "bad-2" in text
    assert "good-1" not in text and len(info.value.errors) == 2


def test_load_pool_skip_invalid(tmp_path):
    _mixed_pool(tmp_path)
    result = load_pool(tmp_path, skip_invalid=True)
    assert sorted(t.task_id for t in result.tasks) == ["good-1", "good-2"]
    assert sorted(e.task_dir.name for e in result.errors) == ["bad-1", "bad-2"]


def test_load_pool_duplicates(tmp_path):
    write_task(tmp_path / "x", "same")
    write_task(tmp_path / "y", "same")
    write_task(tmp_path, "unique")
    with pytest.raises(PoolLoadError) as info:
        load_pool(tmp_path)
    text = str(info.value)
    assert "duplicate" in text and str(tmp_path / "x" / "same") in text and str(tmp_path / "y" / "same") in text
    result = load_pool(tmp_path, skip_invalid=True)
    assert [t.task_id for t in result.tasks] == ["unique"] and len(result.errors) == 1


def test_default_pool_dir_loads():
    root = default_pool_dir()
    assert root.name == "seed_tasks" and root.is_dir()
    assert load_pool(root).tasks or not find_task_dirs(root)  # bundled tasks must be valid


def test_loader_warnings_are_grouped_once_per_run(tmp_path):
    """What a job prints of the loader's warnings: one line per distinct warning, with how
    many tasks gave it."""
    from t1jax.jobs.build import grouped_warnings
    toml = MINIMAL_TOML + "[environment]\nmcp_servers = [{name = \"m\"}]\n"
    tasks = [load_task(write_task(tmp_path, f"t{i}", {"task.toml": toml})) for i in range(5)]
    tasks.append(load_task(write_task(tmp_path, "odd", {"task.toml": MINIMAL_TOML + "x = 1\n"})))
    lines = grouped_warnings(tasks)
    assert lines == ["task loader: task.toml: unknown key 'environment.mcp_servers' ignored "
                     "[t0, t1, t2, ... (5 tasks)]",
                     "task loader: task.toml: unknown top-level key 'x' ignored [odd]"]
