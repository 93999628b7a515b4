"""Task audit: static checks, the LLM client and judge, probes in real sandboxes, the job."""

import contextlib
import functools
import http.server
import json
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from t1jax.curation import audit
from t1jax.curation.llm import LLMConfig, LLMError, chat
from t1jax.tasks.task import load_task
from t1jax.rollout.trial import TrialSite

ROOT = Path(__file__).resolve().parents[2]
INSTRUCTION = """# Count words

`/app/words.txt` holds words separated by whitespace. Count how often each word occurs and
write `/app/counts.txt` with one line per distinct word in the form `<word>: <count>`, sorted
by count (highest first), ties by word (alphabetically). End with a line `TOTAL: <n>`, the
number of words. Do not modify `/app/words.txt`.
"""
TESTS = '''import hashlib
import re

OUT = "/app/counts.txt"
EXPECTED = [("apple", 3), ("pear", 2), ("fig", 1), ("kiwi", 1)]


def _lines():
    with open(OUT) as f:
        lines = f.read().splitlines()
    assert lines, "empty report"
    return lines


def test_line_format():
    assert all(re.fullmatch(r"[a-z]+: [0-9]+", l) for l in _lines()[:-1])
    assert len(_lines()) == 5


def test_counts():
    assert dict((w, int(c)) for w, c in (l.split(": ") for l in _lines()[:-1])) == dict(EXPECTED)


def test_order():
    assert [l.split(":")[0] for l in _lines()[:-1]] == [w for w, _ in EXPECTED]


def test_total_line():
    assert _lines()[-1] == "TOTAL: 7"


def test_most_frequent_first():
    assert _lines()[0] == "apple: 3"


def test_single_total():
    assert sum(l.startswith("TOTAL:") for l in _lines()) == 1 and len(_lines()) > 1


def test_invariant_input_unchanged():
    with open("/app/words.txt", "rb") as f:
        assert hashlib.sha256(f.read()).hexdigest() == "%s"
'''
SOLVE = """#!/bin/bash
# Count words, most frequent first, then the total.
set -euo pipefail
cd /app
tr -s '[:space:]' '\\n' < words.txt \\
  | grep -v '^$' \\
  | sort \\
  | uniq -c \\
  | awk '{ print $2 ": " $1 }' \\
  | sort -t: -k2,2nr -k1,1 > counts.txt
total=$(awk -F': ' '{ t += $2 } END { print t }' counts.txt)
echo "TOTAL: $total" >> counts.txt
cat counts.txt
"""
TEST_SH = """#!/bin/bash
mkdir -p /logs/verifier
cd /app
python3 -m pytest -p no:cacheprovider -rA --junitxml=/logs/verifier/junit.xml /tests/test_outputs.py
if [ $? -eq 0 ]; then echo 1; else echo 0; fi > /logs/verifier/reward.txt
"""
WORDS = "apple pear apple\nfig kiwi\npear apple\n"
TOML = """schema_version = "1.1"
[metadata]
difficulty = "medium"
category = "text-processing"
tags = ["sort", "uniq"]
[verifier]
timeout_sec = 60.0
[agent]
timeout_sec = 120.0
[environment]
memory_mb = 512
allow_internet = false
"""


def make_task(root: Path, name: str, *, instruction=INSTRUCTION, tests=None, solve=SOLVE,
              extra_tests="", leak_tests=False) -> Path:
    import hashlib
    d = root / name
    for sub in ("environment", "tests", "solution"):
        (d / sub).mkdir(parents=True, exist_ok=True)
    (d / "task.toml").write_text(TOML)
    (d / "instruction.md").write_text(instruction)
    (d / "environment" / "words.txt").write_text(WORDS)
    body = tests if tests is not None else TESTS % hashlib.sha256(WORDS.encode()).hexdigest()
    (d / "tests" / "test_outputs.py").write_text(body + extra_tests)
    dockerfile = "FROM t1jax/base:bookworm\nWORKDIR /app\nCOPY words.txt /app/words.txt\n"
    if leak_tests:  # the agent can read the tests
        (d / "environment" / "test_outputs.py").write_text(body + extra_tests)
        dockerfile += "COPY test_outputs.py /app/tests/test_outputs.py\n"
    (d / "environment" / "Dockerfile").write_text(dockerfile)
    (d / "tests" / "test.sh").write_text(TEST_SH)
    (d / "solution" / "solve.sh").write_text(solve)
    return d


# -- the LLM client and the judge (no sandbox) --------------------------------------------------

class _Handler(http.server.BaseHTTPRequestHandler):
    def log_message(self, *args):
        pass

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.server.requests.append((self.path, body))
        if self.server.status != 200:
            self.send_response(self.server.status)
            self.end_headers()
            self.wfile.write(b"model 'nope' not found")
            return
        text = "\n".join(m["content"] for m in body["messages"])
        content = ("It looks fine, 8/10." if "MALFORMED-JUDGE" in text else
                   '```json\n{"instruction.clarity": 0.6, "value.task_value": 0.4, '
                   '"rationale": "clear but small"}\n```')
        data = json.dumps({"choices": [{"message": {"role": "assistant", "content": content}}]})
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(data.encode())


@pytest.fixture(scope="module")
def judge_server():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    server.requests, server.status = [], 200
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server
    server.shutdown()


def test_chat_posts_openai_format(judge_server):
    url = f"http://127.0.0.1:{judge_server.server_port}"
    reply = chat(LLMConfig(url + "/v1/", model="m", max_tokens=7),
                 [{"role": "user", "content": "hi"}])
    assert "instruction.clarity" in reply
    path, body = judge_server.requests[-1]
    assert path == "/v1/chat/completions" and body["model"] == "m" and body["max_tokens"] == 7


def test_chat_errors_name_the_url(judge_server):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead = s.getsockname()[1]
    with pytest.raises(LLMError, match=f"http://127.0.0.1:{dead}/v1/chat/completions"):
        chat(LLMConfig(f"http://127.0.0.1:{dead}", timeout_s=5),
             [{"role": "user", "content": "hi"}])
    judge_server.status = 404
    try:
        with pytest.raises(LLMError, match="HTTP 404.*model 'nope' not found"):
            chat(LLMConfig(f"http://127.0.0.1:{judge_server.server_port}"), [])
    finally:
        judge_server.status = 200


def test_judge_reply_parsing(tmp_path, judge_server):
    task = load_task(make_task(tmp_path, "words"))
    got = audit.llm_judge(task, LLMConfig(f"http://127.0.0.1:{judge_server.server_port}",
                                          model="m"))
    assert got["instruction.clarity"] == 0.6 and got["value.task_value"] == 0.4
    assert "Count words" in judge_server.requests[-1][1]["messages"][1]["content"]
    for bad in ("no json here", '{"instruction.clarity": 2, "value.task_value": 0.5}',
                '{"instruction.clarity": "high", "value.task_value": 0.5}'):
        with pytest.raises(audit.JudgeError):
            audit.parse_judge(bad)


# -- static checks --------------------------------------------------------------------------------

def test_static_checks_on_a_good_task(tmp_path):
    task = load_task(make_task(tmp_path, "words"))
    assert audit.check_coverage(task) == ([], [])
    score, lines, answers = audit.solution_substance(task)
    assert score == 1.0 and lines >= 8 and answers == []
    assert audit.static_leaks(task) == []
    assert audit.output_paths(task.instruction) == ["/app/counts.txt", "/app/words.txt"]


def test_coverage_flags_hidden_paths_and_missing_formats(tmp_path):
    extra = '\n\ndef test_secret():\n    assert open("/app/secret_name.txt").read() == "ok"\n' \
            '\n\ndef test_header():\n    assert _lines()[0] == "name,freq"\n'
    task = load_task(make_task(tmp_path, "hidden", extra_tests=extra))
    assert audit.check_coverage(task) == (["/app/secret_name.txt"], ["name,freq"])
    # with probe data: a path that exists in the image, or that the oracle never made, is fine
    assert audit.check_coverage(task, {"/app/secret_name.txt"}, set())[0] == []
    assert audit.check_coverage(task, set(), {"/app/secret_name.txt"})[0] == [
        "/app/secret_name.txt"]


def test_hard_coded_answers_are_penalised(tmp_path):
    solve = "#!/bin/bash\nprintf 'apple: 3\\npear: 2\\n' > /app/counts.txt\n" \
            "echo 'The answer is 42 words long' >> /app/counts.txt\n"
    extra = '\n\ndef test_answer():\n    assert _lines()[2] == "The answer is 42 words long"\n'
    task = load_task(make_task(tmp_path, "lazy", solve=solve, extra_tests=extra))
    score, lines, answers = audit.solution_substance(task)
    assert lines == 2 and answers == ["The answer is 42 words long"] and score == 0.125


def test_static_leaks_in_a_tb1_build_context(tmp_path):
    d = tmp_path / "tb1-leak"
    (d / "tests").mkdir(parents=True)
    (d / "task.yaml").write_text("instruction: Write /app/out.txt containing hello.\n")
    (d / "Dockerfile").write_text("FROM t1jax/base:bookworm\nWORKDIR /app\nCOPY . /app/\n")
    (d / "run-tests.sh").write_text(TEST_SH)
    (d / "tests" / "test_outputs.py").write_text("def test_x():\n    assert open('/app/out.txt')\n")
    (d / "solution.sh").write_text("#!/bin/bash\necho hello > /app/out.txt\n")
    leaks = audit.static_leaks(load_task(d))
    assert any("copies '.'" in leak for leak in leaks), leaks


# -- probes in real sandboxes ----------------------------------------------------------------------

@pytest.fixture(scope="module")
def pool_reports(tmp_path_factory, docker_backend, judge_server):
    root = tmp_path_factory.mktemp("audit-pool")
    # one task per verdict, but a task may earn two hard rejects (each is checked on its own)
    dirs = [
        make_task(root, "good"),
        make_task(root, "hidden-and-leaky", extra_tests='\n\ndef test_marker():\n'
                  '    assert open("/app/secret_name.txt").read() == "ok\\n"\n',
                  solve=SOLVE + "echo ok > /app/secret_name.txt\n",
                  leak_tests=True),
        make_task(root, "exists-only", instruction=INSTRUCTION + "\nMALFORMED-JUDGE\n", tests=(
            "import os\n\nOUT = '/app/counts.txt'\n\n\ndef test_exists():\n"
            "    assert os.path.exists(OUT)\n\n\ndef test_is_file():\n"
            "    assert os.path.isfile(OUT)\n\n\ndef test_readable():\n"
            "    assert os.access(OUT, os.R_OK)\n")),
        make_task(root, "weak-and-broken", extra_tests='\n\ndef test_input_present():\n'
                  '    assert open("/app/words.txt").read().split()\n',
                  solve="#!/bin/bash\necho 'apple: 3' > /app/counts.txt\n"),
    ]
    judge = functools.partial(audit.llm_judge, llm=LLMConfig(
        f"http://127.0.0.1:{judge_server.server_port}", model="m"))
    reports = audit.audit_pool([load_task(d) for d in dirs],
                               TrialSite(docker_backend, run_id="test-audit"), judge=judge)
    with contextlib.suppress(Exception):  # a safety net; reap races other users of the daemon
        docker_backend.reap("test-audit")
    return {r.task_id: r for r in reports}, reports


def _why(report):
    return json.dumps([report.reasons, report.details], default=str)[:3000]


@pytest.mark.slow
def test_good_task_scores_high(pool_reports):
    good = pool_reports[0]["good"]
    assert not good.rejected and good.quality > 0.9, _why(good)
    assert good.scores["verifier.strength"] == good.scores["solution.correct"] == 1.0
    assert good.scores["verifier.shortcut_resistance"] == 1.0
    # the judge's 0.6 / 0.4 are averaged with the automatic 1.0 / 0.84
    assert good.scores["instruction.clarity"] == 0.8 and good.scores["value.task_value"] == 0.62
    assert good.details["judge"]["rationale"] == "clear but small"


@pytest.mark.slow
@pytest.mark.parametrize("task_id,reason,naming", [
    ("hidden-and-leaky", "hidden requirement", "/app/secret_name.txt"),
    ("exists-only", "solution shortcut", "/app/counts.txt"),
    ("weak-and-broken", "weak verifier", "test_input_present"),
    ("hidden-and-leaky", "test leakage", "/app/tests/test_outputs.py in the agent's image"),
    ("hidden-and-leaky", "test leakage", "environment/test_outputs.py is a copy of tests/"),
    ("weak-and-broken", "broken oracle", "test_counts"),
])
def test_hard_rejects(pool_reports, task_id, reason, naming):
    report = pool_reports[0][task_id]
    assert report.rejected, _why(report)
    hits = [r for r in report.reasons if r.startswith(reason)]
    assert hits and any(naming in r for r in hits), _why(report)


@pytest.mark.slow
def test_malformed_judge_reply_is_a_warning(pool_reports):
    report = pool_reports[0]["exists-only"]
    assert any("LLM judge ignored" in w for w in report.details["warnings"])
    assert "judge" not in report.details and report.scores["instruction.clarity"] == 1.0


@pytest.mark.slow
def test_ranking_and_report_files(pool_reports, tmp_path):
    reports = pool_reports[1]
    assert reports[0].task_id == "good"
    assert all(r.rejected for r in reports[1:])
    assert [r.quality for r in reports[1:]] == sorted((r.quality for r in reports[1:]),
                                                      reverse=True)
    audit.write_reports(reports, tmp_path)
    scores = json.loads((tmp_path / "scores.json").read_text())
    assert scores["good"] == {"score": reports[0].quality, "rejected": False}
    assert scores["exists-only"]["rejected"] is True
    rows = [json.loads(line) for line in (tmp_path / "audit.jsonl").read_text().splitlines()]
    assert [r["task_id"] for r in rows] == [r.task_id for r in reports]
    table = (tmp_path / "audit.md").read_text()
    assert "| 1 | good |" in table and "4 tasks, 3 rejected" in table
    assert "hidden requirement" in table


@pytest.mark.slow
def test_audit_job_on_seed_tasks(tmp_path, docker_backend):
    picked = "count-log-errors,organize-files,python-debug"
    proc = subprocess.run(
        [sys.executable, str(ROOT / "experiments" / "run.py"), "--config",
         str(ROOT / "configs" / "audit.py"), f"--workdir={tmp_path}",
         f"--config.task_filter={picked}", "--config.sandbox.concurrency=4"],
        capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    scores = json.loads((tmp_path / "scores.json").read_text())
    assert sorted(scores) == sorted(picked.split(","))
    assert all(not s["rejected"] and s["score"] > 0.8 for s in scores.values()), scores
    assert len((tmp_path / "audit.jsonl").read_text().splitlines()) == 3
    assert "3 tasks, 0 rejected" in (tmp_path / "audit.md").read_text()
