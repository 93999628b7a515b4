"""Recursive task synthesis: operators, realignment, the three validation runs, rounds and
lineage, the LLM rewriter against a local OpenAI-compatible server, and the synth job."""

import json
import os
import subprocess
import sys
import threading
import tomllib
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from t1jax.curation import synth as synth_mod
from t1jax.rollout.trial import TrialSite
from t1jax.tasks.pool import default_pool_dir
from t1jax.curation.synth import (Candidate, Node, Synthesizer, child_id, dump_toml, judge,
                               synthesize, write_child)
from t1jax.curation.synth_operators import (OFFLINE, ChecksumManifest, LLMConfig, Output, Parent,
                                         RewriteError, make_operators, parse_llm_reply)
from t1jax.tasks.task import load_task
from t1jax.verify.results import Assertion
from t1jax.verify.reward import INVARIANT
from t1jax.verify.verifier import VerifierReport

ROOT = Path(__file__).resolve().parents[2]
NEW_PATH = {"checksum_manifest": "/app/SHA256SUMS", "summary_json": "/app/run_summary.json",
            "readonly_publish": "/app/published/",
            "archive_outputs": "/app/deliverables/count-log-errors.tar.gz"}
# each offline operator on a seed: organize-files has many outputs, names with spaces, binary files
PAIRING = {"checksum_manifest": "organize-files", "archive_outputs": "count-log-errors",
           "summary_json": "organize-files", "readonly_publish": "count-log-errors",
           "broken": "count-log-errors"}
OFFLINE_NAMES = [op.name for op in OFFLINE]


def seed(task_id):
    return load_task(default_pool_dir() / task_id)


def quiet(*args):
    pass


def reap(backend, run_id):
    """Leftovers of a failed test; listing races with other runs' containers vanishing."""
    import docker.errors
    try:
        backend.reap(run_id)
    except docker.errors.NotFound:
        pass


def candidate(parent_task, op, out_dir, rnd=1, lineage=()):
    new_id = child_id(parent_task.task_id, op.code, rnd, set())
    return Candidate(new_id, parent_task.task_id, parent_task.task_id, rnd, op.name,
                     lineage + (op.name,), (parent_task.task_id, new_id), out_dir / new_id)


# -- no sandbox needed --------------------------------------------------------------------------
def test_child_ids_are_short_and_unique():
    taken = set()
    assert child_id("count-log-errors", "sums", 1, taken) == "count-log-errors--sums-r1"
    assert child_id("count-log-errors", "sums", 1, taken) == "count-log-errors--sums-r1-2"
    long_id = "x" * 80
    a, b = child_id(long_id, "tar", 2, taken), child_id(long_id + "y", "tar", 2, taken)
    assert len(a) <= 64 and len(b) <= 64 and a != b and a.endswith("--tar-r2")


def test_task_toml_round_trips():
    for task_dir in ("count-log-errors", "organize-files"):
        data = tomllib.loads((default_pool_dir() / task_dir / "task.toml").read_text())
        assert tomllib.loads(dump_toml(data)) == data


def test_realignment_without_sandboxes(tmp_path):
    parent_task = seed("count-log-errors")
    outputs = (Output("report.txt", 60, True),)
    for op in OFFLINE:
        parent = Parent(parent_task, outputs, (), 1, parent_task.task_id)
        assert op.feasible(parent) is None
        cand = candidate(parent_task, op, tmp_path)
        write_child(parent, op, op.rewrite(parent), cand)
        child = load_task(cand.path)
        assert child.task_id == cand.task_id and child.name == f"t1jax/{cand.task_id}"
        meta = child.metadata
        assert (meta["t1jax_parent"], meta["t1jax_operator"], meta["t1jax_round"],
                meta["t1jax_root"]) == ("count-log-errors", op.name, 1, "count-log-errors")
        assert meta["difficulty"] == "medium" and meta["t1jax_steps"] == 2
        addendum = child.instruction.split("\n---\n")[-1]
        assert addendum.strip().startswith("Finally,") and "`report.txt`" in addendum
        assert NEW_PATH[op.name] in addendum
        assert child.instruction.startswith(parent_task.instruction.rstrip())
        solve = child.solution_script.read_text()
        assert solve.startswith(parent_task.solution_script.read_text().rstrip())
        assert cand.new_tests and all(n.startswith(f"test_r1_{op.name}_") for n in cand.new_tests)
        compile((child.tests_dir / "test_outputs.py").read_text(), "test_outputs.py", "exec")
        assert (child.tests_dir / "test.sh").read_bytes() == \
            (parent_task.tests_dir / "test.sh").read_bytes()
        assert (child.environment_dir / "Dockerfile").read_bytes() == \
            (parent_task.environment_dir / "Dockerfile").read_bytes()


def test_feasibility():
    task = seed("count-log-errors")
    op = ChecksumManifest()
    out = (Output("report.txt", 60, True),)
    assert op.feasible(Parent(task, out, (), 1, task.task_id)) is None
    assert "already applied" in op.feasible(Parent(task, out, ("checksum_manifest",), 2, "x"))
    assert "no output files" in op.feasible(Parent(task, (), (), 1, task.task_id))
    assert "unsafe" in op.feasible(Parent(task, (Output("a\nb", 1, True),), (), 1, "x"))
    with pytest.raises(ValueError, match="llm_rewrite needs llm.base_url"):
        make_operators(["llm_rewrite"])
    assert [o.name for o in make_operators(None, LLMConfig("http://x"))][-1] == "llm_rewrite"


VALID = {"instruction_addendum": "Finally, write the TOTAL count alone to `/app/total.txt`.",
         "solution_steps": "awk -F': ' '/^TOTAL:/ {print $2}' /app/report.txt > /app/total.txt",
         "tests": "import os\n\ndef test_r1_llm_rewrite_total():\n"
                  "    assert open('/app/total.txt').read() == '27\\n'\n"}


@pytest.mark.parametrize("reply, reason", [
    ("Sure! Here is a step.", "not a JSON object"),
    (json.dumps({**VALID, "tests": ""}), "lacks non-empty string field(s) ['tests']"),
    (json.dumps({**VALID, "solution_steps": 3}), "['solution_steps']"),
    (json.dumps({**VALID, "tests": "def test_x(:\n"}), "do not parse"),
    (json.dumps({**VALID, "tests": "X = 1\ndef test_x(): pass\n"}), "found Assign"),
    (json.dumps({**VALID, "tests": "def helper(): pass\n"}), "found helper"),
    (json.dumps({**VALID, "tests": "def test_counts_per_service(): pass\n"}), "reuse existing"),
    (json.dumps({**VALID, "tests": "import os\n"}), "define no test_ function"),
])
def test_malformed_llm_replies_are_rejected(reply, reason):
    with pytest.raises(RewriteError, match=None) as info:
        parse_llm_reply(reply, {"test_counts_per_service", "EXPECTED"})
    assert reason in str(info.value) and info.value.raw == reply


def test_llm_reply_in_a_fence_is_accepted():
    rewrite = parse_llm_reply("Here you go:\n```json\n" + json.dumps(VALID) + "\n```", set())
    assert rewrite.instruction.startswith("Finally,") and "total.txt" in rewrite.solution
    rewrite = parse_llm_reply("```json\n" + json.dumps(VALID) + "\n```", set())
    assert "def test_r1_llm_rewrite_total" in rewrite.tests


def report(statuses, solved):
    assertions = [Assertion(f"tests.test_outputs::{n}", s) for n, s in statuses.items()]
    return VerifierReport("t", assertions, 1.0 if solved else 0.0, solved, 0.0, "dense", [], {},
                          0, False, "", {})


def test_judge_names_each_failure():
    new = {"test_r1_x_a"}
    ok = report({"test_goal": "passed", "test_invariant_kept": "passed",
                 "test_r1_x_a": "passed"}, True), (), None
    nothing = report({"test_goal": "failed", "test_invariant_kept": "passed",
                      "test_r1_x_a": "failed"}, False), (), None
    parent = report({"test_goal": "passed", "test_invariant_kept": "passed",
                     "test_r1_x_a": "failed"}, False), (), None
    assert INVARIANT.search("tests.test_outputs::test_invariant_kept")
    assert judge(new, ok, nothing, parent) is None
    assert judge(new, ok, ok, parent).startswith("new assertion passes on do-nothing")
    assert judge(new, ok, nothing, ok).startswith("new assertion passes on the parent's solution")
    leaky = report({"test_goal": "passed", "test_r1_x_a": "failed"}, False), (), None
    assert judge(new, ok, leaky, parent).startswith("goal assertion passes on do-nothing")
    assert judge(new, parent, nothing, parent).startswith("oracle fails")
    assert judge({"test_r1_x_b"}, ok, nothing, parent).startswith("new tests never ran")
    assert judge(new, (None, (), "boom"), nothing, parent) == "oracle run failed: boom"


def test_job_config_errors_are_clear(tmp_path):
    base = [sys.executable, str(ROOT / "experiments" / "run.py"), "--config",
            str(ROOT / "configs" / "synth.py"), f"--workdir={tmp_path}",
            "--config.task_filter=count-log-errors"]
    for flag, message in (("--config.operators=checksum_manifest,shuffle", "shuffle"),
                          ("--config.operators=llm_rewrite", "llm.base_url"),
                          ("--config.rounds=0", "rounds")):
        proc = subprocess.run(base + [flag], capture_output=True, text=True, cwd=ROOT,
                              timeout=120)
        assert proc.returncode != 0 and message in proc.stderr, proc.stderr[-2000:]


# -- real sandboxes -----------------------------------------------------------------------------
class Broken(ChecksumManifest):
    """Adds a "new" assertion that the parent's solution already meets."""
    name = "broken"

    def rewrite(self, parent):
        rewrite = super().rewrite(parent)
        extra = "\n\ndef test_r1_broken_report_exists():\n" \
                "    assert os.path.isfile('/app/report.txt')\n"
        return type(rewrite)(rewrite.instruction, rewrite.solution, rewrite.tests + extra)


@pytest.fixture(scope="module")
def applied(docker_backend, tmp_path_factory):
    """Each offline operator applied to a seed, validated once; the judge's inputs recorded."""
    out = tmp_path_factory.mktemp("applied")
    run_id = f"test-synth-ops-{os.getpid()}"
    nodes = {n: Node(seed(n), n, chain=(n,)) for n in set(PAIRING.values())}
    synth, calls, real = Synthesizer(TrialSite(docker_backend, run_id=run_id)), {}, \
        synth_mod.judge

    def spy(new, oracle, nothing, parent_run):
        calls[frozenset(new)] = (oracle, nothing, parent_run)
        return real(new, oracle, nothing, parent_run)

    try:
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(synth_mod, "judge", spy)
            assert synth.collect(list(nodes.values()), quiet) == {}
            cands, pending = {}, []
            for op in OFFLINE + (Broken(),):
                node = nodes[PAIRING[op.name]]
                parent = Parent(node.task, node.outputs, (), 1, node.root_id)
                cands[op.name] = cand = candidate(node.task, op, out)
                write_child(parent, op, op.rewrite(parent), cand)
                pending.append((cand, node.task))
            synth.validate(pending, quiet)
    finally:
        reap(docker_backend, run_id)
    return nodes, cands, calls


@pytest.mark.slow
@pytest.mark.parametrize("op_name", OFFLINE_NAMES)
def test_offline_operator_makes_a_valid_task(applied, op_name):
    nodes, cands, calls = applied
    cand = cands[op_name]
    assert cand.status == "accepted", cand.reason
    oracle, nothing, parent_run = calls[frozenset(cand.new_tests)]
    new = lambda a: a.name.rsplit("::", 1)[-1] in cand.new_tests  # noqa: E731
    assert len([a for a in oracle[0].assertions if new(a)]) == len(cand.new_tests) == 3
    assert oracle[0].solved and all(a.status == "passed" for a in oracle[0].assertions)
    assert not any(a.status == "passed" for a in nothing[0].assertions
                   if not INVARIANT.search(a.name))
    assert not any(a.status == "passed" for a in parent_run[0].assertions if new(a))
    # the parent's own goal still holds under the parent's solution: only the new step is missing
    assert all(a.status == "passed" for a in parent_run[0].assertions if not new(a))
    child = load_task(cand.path)
    assert child.metadata["t1jax_parent"] == PAIRING[op_name]
    assert child.metadata["t1jax_operator"] == op_name and child.metadata["t1jax_round"] == 1
    addendum = child.instruction.split("\n---\n")[-1]
    paths = [o.path for o in nodes[PAIRING[op_name]].outputs]
    assert paths and all(f"`{p}`" in addendum for p in paths)
    assert cand.new_paths and all(p in addendum for p in cand.new_paths)
    assert cand.assertions == oracle[0].total


@pytest.mark.slow
def test_two_rounds_on_two_seeds(docker_backend, tmp_path):
    seeds = [seed("count-log-errors"), seed("organize-files")]
    run_id = f"test-synth-rounds-{os.getpid()}"
    events = []
    try:
        rep = synthesize(seeds, TrialSite(docker_backend, run_id=run_id), tmp_path, rounds=2,
                         seed=3, progress=lambda kind, what, total=0: events.append(kind))
    finally:
        reap(docker_backend, run_id)
    assert [c.round for c in rep.candidates] == [1, 1, 2, 2]
    assert all(c.status == "accepted" for c in rep.candidates), [c.reason for c in rep.candidates]
    round1 = {c.task_id for c in rep.candidates if c.round == 1}
    for cand in (c for c in rep.candidates if c.round == 2):
        assert cand.parent_id in round1 and cand.chain[1] == cand.parent_id
        assert len(set(cand.lineage)) == 2 and cand.path.parent.name == "round-2"
        meta = load_task(cand.path).metadata
        assert meta["t1jax_round"] == 2 and meta["t1jax_root"] == cand.root_id
        assert meta["difficulty"] == "hard" and meta["t1jax_steps"] == 3
        assert json.loads((cand.path / "lineage.json").read_text())["lineage"] == \
            list(cand.lineage)
    counts = rep.counts()
    assert sum(c["accepted"] + c["rejected"] for r in counts.values() for c in r.values()) == 4
    assert sum(rep.assertion_counts().values()) == len(rep.accepted) == 4
    lines = (tmp_path / "lineage.jsonl").read_text().splitlines()
    assert [json.loads(line)["task_id"] for line in lines] == [c.task_id for c in rep.candidates]
    summary = (tmp_path / "summary.md").read_text()
    assert "4 of 4 new tasks accepted" in summary and "| round | checksum_manifest" in summary
    assert events.count("round") == 2 and events.count("step") == 2 + 4
    assert events.index("grow") == 1 and events[-1] == "round_done"


@pytest.mark.slow
def test_broken_operator_is_rejected(applied):
    _, cands, _ = applied
    cand = cands["broken"]
    assert cand.status == "rejected"
    assert cand.reason.startswith("new assertion passes on the parent's solution")
    assert "test_r1_broken_report_exists" in cand.reason
    assert "test_r1_broken_file_exists" not in cand.reason  # the honest ones still fail


class FakeLLM(BaseHTTPRequestHandler):
    """POST /v1/chat/completions: a valid step for count-log-errors, chatter for anything else."""
    prompts: list = []

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        prompt = body["messages"][-1]["content"]
        FakeLLM.prompts.append(prompt)
        content = json.dumps(VALID) if "Count ERROR lines" in prompt else "Sure! Copy the files."
        data = json.dumps({"choices": [{"message": {"role": "assistant", "content": content}}]})
        status = 200 if self.path == "/v1/chat/completions" else 404
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(data.encode())

    def log_message(self, *args):
        pass


@pytest.mark.slow
def test_llm_rewrite_against_a_local_server(docker_backend, tmp_path):
    server = ThreadingHTTPServer(("127.0.0.1", 0), FakeLLM)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    run_id = f"test-synth-llm-{os.getpid()}"
    try:
        rep = synthesize([seed("count-log-errors"), seed("organize-files")],
                         TrialSite(docker_backend, run_id=run_id), tmp_path, rounds=1,
                         operators=["llm_rewrite"],
                         llm=LLMConfig(f"http://127.0.0.1:{server.server_port}"))
    finally:
        server.shutdown()
        reap(docker_backend, run_id)
    by_id = {c.task_id: c for c in rep.candidates}
    good, bad = by_id["count-log-errors--llm-r1"], by_id["organize-files--llm-r1"]
    assert good.status == "accepted", good.reason
    assert good.new_tests == ("test_r1_llm_rewrite_total",)
    assert "/app/total.txt" in load_task(good.path).instruction
    assert bad.status == "rejected" and "not a JSON object" in bad.reason
    assert bad.path == tmp_path / "rejected" / bad.task_id
    assert (bad.path / "reason.txt").read_text().strip() == bad.reason
    assert (bad.path / "llm_reply.txt").read_text() == "Sure! Copy the files."
    assert not (tmp_path / "round-1" / bad.task_id).exists()
    assert "1 / 1" in (tmp_path / "summary.md").read_text()
    assert len(FakeLLM.prompts) == 2 and all("test_r1_llm_rewrite_" in p for p in FakeLLM.prompts)
    assert any("- report.txt" in p for p in FakeLLM.prompts)


@pytest.mark.slow
def test_synth_job(tmp_path, docker_backend):
    proc = subprocess.run(
        [sys.executable, str(ROOT / "experiments" / "run.py"), "--config",
         str(ROOT / "configs" / "synth.py"), "--config.task_filter=count-log-errors",
         "--config.rounds=1", f"--workdir={tmp_path}"],
        capture_output=True, text=True, cwd=ROOT, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    summary = (tmp_path / "summary.md").read_text()
    assert "1 of 1 new tasks accepted" in summary and "| round |" in proc.stdout
    assert len((tmp_path / "lineage.jsonl").read_text().splitlines()) == 1
