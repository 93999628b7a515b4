"""Decontamination: copies, paraphrases and renamed tasks are found; unrelated ones are not."""

from __future__ import annotations

import pickle
from pathlib import Path

import pytest

from t1jax.tasks.decontam import (ContaminationError, check_pool, find_overlaps, load_benchmark,
                                  normalize_code, report_markdown)
from t1jax.tasks.pool import default_pool_dir, load_pool

TEST_SH = """#!/bin/bash
# Shared harness boilerplate: identical in every task, so it must never count as evidence.
mkdir -p /logs/verifier
cd /app 2>/dev/null || cd /
python3 -m pytest -p no:cacheprovider -rA --junitxml=/logs/verifier/junit.xml /tests/test_outputs.py
if [ $? -eq 0 ]; then echo 1 > /logs/verifier/reward.txt; else echo 0 > /logs/verifier/reward.txt; fi
"""


def words(prefix: str, n: int) -> str:
    return " ".join(f"{prefix}{i}" for i in range(n))


def topic_tests(topic: str) -> str:
    """A realistic, topic-specific pytest file (well over 20 words)."""
    return "\n".join(
        ["import os", "", f'OUT = "/app/{topic}.txt"', ""]
        + [f"def test_{topic}_{i}():\n    # check step {i}\n"
           f"    assert os.path.exists(OUT), 'missing {topic} output {i}'\n"
           f"    assert open(OUT).read().count('{topic}-{i}') == {i}, 'wrong {topic} count {i}'\n"
           for i in range(6)])


def write_task(root: Path, task_id: str, instruction: str, tests: str | None, *,
               name: str | None = None, test_sh: str = TEST_SH, compose: bool = False) -> Path:
    d = root / task_id
    (d / "environment").mkdir(parents=True)
    (d / "tests").mkdir()
    toml = 'schema_version = "1.1"\n'
    if name:
        toml += f'\n[task]\nname = "{name}"\n'
    (d / "task.toml").write_text(toml)
    (d / "instruction.md").write_text(instruction)
    if compose:  # our loader rejects compose-only tasks; decontamination must still see them
        (d / "environment" / "docker-compose.yaml").write_text("services: {}\n")
    else:
        (d / "environment" / "Dockerfile").write_text("FROM t1jax/base:bookworm\n")
    (d / "tests" / "test.sh").write_text(test_sh)
    if tests is not None:
        (d / "tests" / "test_outputs.py").write_text(tests)
    return d


def tasks_in(root: Path):
    return load_pool(root).tasks


def kinds(overlaps):
    return sorted(o.kind for o in overlaps)


@pytest.fixture
def pools(tmp_path):
    train, bench = tmp_path / "train", tmp_path / "bench"
    write_task(train, "parse-logs", f"Parse the logs. {words('log', 40)}", topic_tests("logs"))
    write_task(train, "sum-csv", f"Sum the CSV. {words('csv', 40)}", topic_tests("csv"))
    write_task(bench, "weather-api", f"Query the weather. {words('wx', 40)}",
               topic_tests("weather"))
    write_task(bench, "git-bisect", f"Find the bad commit. {words('git', 40)}", topic_tests("git"))
    return train, bench


def test_unrelated_pools_are_clean(pools):
    train, bench = pools
    assert find_overlaps(tasks_in(train), tasks_in(bench)) == []
    assert check_pool(tasks_in(train), [bench]) == {str(bench): 2}


def test_copied_task_found_by_name_instruction_and_tests(pools):
    train, bench = pools
    src = train / "parse-logs"
    write_task(bench, "Parse_Logs", (src / "instruction.md").read_text(),
               (src / "tests" / "test_outputs.py").read_text())
    found = find_overlaps(tasks_in(train), tasks_in(bench))
    assert kinds(found) == ["instruction", "name", "tests"]
    assert all(o.train_task == "parse-logs" and o.bench_task == "Parse_Logs" for o in found)
    assert all(o.score == 1.0 and o.bench_dir == str(bench) for o in found)


def test_task_name_matches_other_task_id(tmp_path, pools):
    train, bench = pools
    write_task(train, "renamed", f"Build widgets. {words('w', 30)}", topic_tests("widget"),
               name="acme/widget-build")
    write_task(bench, "widget_build", f"Other text. {words('o', 30)}", topic_tests("other"))
    found = find_overlaps(tasks_in(train), tasks_in(bench))
    assert [(o.train_task, o.bench_task, o.kind) for o in found] == [
        ("renamed", "widget_build", "name")]
    assert "acme/widget-build" in found[0].detail


def test_paraphrase_sharing_a_long_sentence(pools):
    train, bench = pools
    shared = words("shared", 20)  # 20 words: 20 - 13 + 1 = 8 shared 13-grams
    write_task(train, "para-train", f"{words('a', 10)}. {shared}! {words('b', 10)}",
               topic_tests("p1"))
    write_task(bench, "para-bench", f"{words('c', 25)}, {shared}; {words('d', 5)}",
               topic_tests("p2"))
    found = find_overlaps(tasks_in(train), tasks_in(bench))
    assert [(o.train_task, o.bench_task, o.kind) for o in found] == [
        ("para-train", "para-bench", "instruction")]
    assert found[0].score == pytest.approx(8 / (40 - 12))  # shared / the training side's 13-grams
    assert "8/28" in found[0].detail
    assert find_overlaps(tasks_in(train), tasks_in(bench), instruction_threshold=0.5) == []


def test_short_instructions_fall_back_to_equality(pools):
    train, bench = pools
    write_task(train, "short-a", "Fix the build.", topic_tests("s1"))
    write_task(bench, "short-b", "  fix THE build!! ", topic_tests("s2"))
    write_task(bench, "short-c", "Fix the tests.", topic_tests("s3"))
    found = find_overlaps(tasks_in(train), tasks_in(bench))
    assert [(o.train_task, o.bench_task, o.kind, o.score) for o in found] == [
        ("short-a", "short-b", "instruction", 1.0)]


def test_renamed_task_with_same_tests_found_by_tests(pools):
    train, bench = pools
    original = topic_tests("deploy")
    write_task(bench, "deploy-app", f"Deploy it. {words('dep', 30)}", original)
    reformatted = "# a new header comment\n\n" + original.replace("    assert", "    assert  ")
    write_task(train, "ship-service", f"Ship it. {words('ship', 30)}", reformatted)
    lines = original.splitlines()
    lines[-1] += "  # trailing note"
    lines.insert(3, "EXTRA = 1")  # a real (small) edit: near-duplicate, not identical
    write_task(train, "ship-service-v2", f"Ship v2. {words('two', 30)}", "\n".join(lines))
    found = find_overlaps(tasks_in(train), tasks_in(bench))
    got = {(o.train_task, o.bench_task, o.kind): o for o in found}
    assert set(got) == {("ship-service", "deploy-app", "tests"),
                        ("ship-service-v2", "deploy-app", "tests")}
    assert got["ship-service", "deploy-app", "tests"].score == 1.0
    assert "exact" in got["ship-service", "deploy-app", "tests"].detail
    near = got["ship-service-v2", "deploy-app", "tests"]
    assert 0.8 <= near.score < 1.0 and "jaccard" in near.detail
    assert ("ship-service-v2", "deploy-app") not in {
        (o.train_task, o.bench_task) for o in find_overlaps(
            tasks_in(train), tasks_in(bench), tests_threshold=0.999)}


def test_runner_script_counts_only_when_it_is_the_only_test_file(pools):
    train, bench = pools
    script = "\n".join(f"test -f /app/out{i}.txt || exit 1  # check {i}" for i in range(8))
    write_task(train, "shell-only", f"Make files. {words('mk', 30)}", None, test_sh=script)
    write_task(bench, "shell-bench", f"Other. {words('zz', 30)}", None, test_sh=script)
    found = find_overlaps(tasks_in(train), tasks_in(bench))
    assert [(o.train_task, o.bench_task, o.kind) for o in found] == [
        ("shell-only", "shell-bench", "tests")]
    assert "test.sh = test.sh" in found[0].detail


def test_benchmark_tasks_our_loader_rejects_are_still_checked(pools):
    train, bench = pools
    write_task(bench, "compose-task", (train / "sum-csv" / "instruction.md").read_text(),
               topic_tests("compose"), compose=True)
    assert "compose-task" not in {t.task_id for t in load_pool(bench, skip_invalid=True).tasks}
    assert "compose-task" in {t.task_id for t in load_benchmark(bench)}
    with pytest.raises(ContaminationError) as info:
        check_pool(tasks_in(train), [bench])
    assert [(o.train_task, o.bench_task, o.kind) for o in info.value.overlaps] == [
        ("sum-csv", "compose-task", "instruction")]


def test_check_pool_lists_every_pair(tmp_path, pools):
    train, bench = pools
    bench2 = tmp_path / "bench2"
    write_task(bench, "sum-csv", f"Unrelated. {words('u', 30)}", topic_tests("u"))
    write_task(bench2, "logs-again", (train / "parse-logs" / "instruction.md").read_text(),
               topic_tests("v"))
    write_task(bench2, "csv-again", f"Again. {words('again', 30)}",
               (train / "sum-csv" / "tests" / "test_outputs.py").read_text())
    with pytest.raises(ContaminationError) as info:
        check_pool(tasks_in(train), [bench, bench2])
    err = info.value
    assert isinstance(err, ValueError)
    assert {(o.train_task, o.bench_dir, o.bench_task, o.kind) for o in err.overlaps} == {
        ("sum-csv", str(bench), "sum-csv", "name"),
        ("parse-logs", str(bench2), "logs-again", "instruction"),
        ("sum-csv", str(bench2), "csv-again", "tests")}
    message = str(err)
    assert "3 overlap(s) in 3 task pair(s)" in message
    for o in err.overlaps:
        assert f"train {o.train_task} ~ {o.bench_dir}/{o.bench_task}: {o.kind}" in message
    assert str(pickle.loads(pickle.dumps(err))) == message
    report = report_markdown(err.overlaps)
    assert report.count("\n| ") == 1 + 3 and "| parse-logs | " in report
    assert "No overlaps found." in report_markdown([])


def test_check_pool_rejects_a_benchmark_dir_without_tasks(tmp_path, pools):
    train, _ = pools
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="contains no tasks"):
        check_pool(tasks_in(train), [tmp_path / "empty"])
    with pytest.raises(FileNotFoundError):
        check_pool(tasks_in(train), [tmp_path / "missing"])


def test_bad_thresholds_are_rejected(pools):
    train, bench = pools
    for kwargs in ({"instruction_threshold": 0}, {"tests_threshold": 1.5}, {"ngram": 0}):
        with pytest.raises(ValueError):
            find_overlaps(tasks_in(train), tasks_in(bench), **kwargs)


def test_normalize_code_strips_comments_blank_lines_and_whitespace():
    text = "#!/bin/bash\n\n  x  =   1   # set x\n// js comment\n\ty\t=\t2\n"
    assert normalize_code(text) == "x = 1\ny = 2"


def test_seed_pool_has_no_internal_collisions_and_is_clean(pools):
    _, bench = pools
    seed = load_pool(default_pool_dir(), skip_invalid=True).tasks
    assert len(seed) >= 8
    cross = [o for o in find_overlaps(seed, seed) if o.train_task != o.bench_task]
    assert [o for o in cross if o.kind == "name"] == []
    assert cross == [], report_markdown(cross)  # nor near-duplicate instructions or tests
    assert find_overlaps(seed, []) == []
    assert check_pool(seed, [bench]) == {str(bench): 2}
