"""t1jax.report on a small synthetic run: plots, summary.md, and the trajectory viewer rendered by
headless Chromium (escaping of untrusted model text, no JS errors, a non-blank screenshot).

The Chromium tests skip where no chromium binary is installed, except in CI
(T1JAX_REQUIRE_DOCKER=1), where that is a failure. ``python tests/report/test_report.py OUT.png`` renders
the synthetic run's viewer to a screenshot (docs/trajectory_viewer.png comes from it).
"""

import html.parser
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import pytest

from t1jax.report import summary as report

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
EVIL = "<script>alert(1)</script>"


def _write_jsonl(path: Path, rows):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def _trial(label, task_id, *, resolved, reward, passed, total, category, model_text,
           failure_mode=None, attempt=0):
    assertions = [{"name": f"test_outputs.py::test_{i}",
                   "status": "passed" if i < passed else "failed",
                   "message": "" if i < passed else f"AssertionError: step {i} output differs"}
                  for i in range(total)]
    return {
        "label": label, "task_id": task_id, "attempt": attempt, "category": category,
        "difficulty": "medium", "harness": "terminus-2", "status": "done", "skip_reason": None,
        "resolved": resolved, "reward": reward, "passed": passed, "total": total, "turns": 2,
        "tool_calls": 2, "tokens": 812, "sampled_tokens": 140, "finish": "done",
        "failure_mode": failure_mode, "duration_s": 12.5,
        "instruction": f"Create /app/out.csv from /app/data.json ({task_id}).",
        "segments": [
            {"text": "<|im_start|>system\nYou are a terminal agent.<|im_end|>\n<|im_start|>user\n"
                     "Create /app/out.csv ...<|im_end|>\n<|im_start|>assistant\n",
             "trained": False},
            {"text": model_text, "trained": True},
            {"text": "<|im_end|>\n<|im_start|>user\n[exit code: 0]\ndata.json\n<|im_end|>\n"
                     "<|im_start|>assistant\n", "trained": False},
            {"text": "<tool_call>{\"command\": \"python3 convert.py\"}</tool_call>",
             "trained": True},
            {"text": "<|im_end|>\n<|im_start|>user\n[exit code: 1]\nTraceback ...<|im_end|>\n",
             "trained": False},
        ],
        "commands": [
            {"turn": 0, "command": "ls /app", "exit_code": 0, "timed_out": False,
             "output": "data.json\n"},
            {"turn": 1, "command": "python3 convert.py", "exit_code": 1, "timed_out": False,
             "output": "Traceback (most recent call last):\n  ValueError: bad row </div>"},
        ],
        "assertions": assertions,
        "verifier_log": f"{passed} passed, {total - passed} failed",
    }


def make_run(root: Path) -> Path:
    """A small run directory: a few metric rows per stage, two eval labels (base, ppo)."""
    _write_jsonl(root / "sft" / "metrics.jsonl", [
        {"step": s, "time": 1e9 + s, "sft/nll": 2.0 - 0.3 * s, "sft/token_accuracy": 0.4 + 0.1 * s}
        for s in range(4)])
    _write_jsonl(root / "warmup" / "metrics.jsonl", [
        {"step": s, "time": 1e9 + s, "critic/explained_variance": -0.5 + 0.3 * s,
         "critic/value_loss": 1.0 / (s + 1)} for s in range(4)])
    _write_jsonl(root / "ppo" / "metrics.jsonl", [
        {"step": s, "time": 1e9 + s, "reward/mean": 1.0 + 0.5 * s, "reward/resolved": 0.1 * s,
         "critic/explained_variance": 0.4 + 0.05 * s, "critic/value_loss": 0.3,
         "mismatch/logprob_gap": 0.021 - 0.002 * s, "mismatch/logprob_gap_max": 0.9 - 0.1 * s,
         "mismatch/k3_kl": 1e-4, "mismatch/routing_disagreement": 0.0,
         "actor/clip_frac": 0.02, "actor/approx_kl": 1e-3, "turns/mean": 3.0 + s,
         "turns/max": 6 + s, "length/mean": 900.0 + 50 * s, "length/max": 1800 + 100 * s,
         "perf/tokens_per_s": None if s == 0 else 1234.5}  # a NaN written as null
        for s in range(5)])
    trials = {
        "base": [_trial("base", "csv-convert", resolved=False, reward=1.0, passed=1, total=3,
                        category="data", model_text="I'll look around first.\n"
                        "<tool_call>{\"command\": \"ls /app\"}</tool_call>",
                        failure_mode="wrong_output"),
                 _trial("base", "log-rotate", resolved=False, reward=0.0, passed=0, total=2,
                        category="sysadmin", model_text="Let me check.",
                        failure_mode="gave_up")],
        "ppo": [_trial("ppo", "csv-convert", resolved=True, reward=3.0, passed=3, total=3,
                       category="data", model_text=f"Checking the file {EVIL} and </div> "
                       "<b>not bold</b> &amp; done.\n<tool_call>{\"command\": \"ls /app\"}"
                       "</tool_call>"),
                _trial("ppo", "log-rotate", resolved=False, reward=1.0, passed=1, total=2,
                       category="sysadmin", model_text="Rotating logs now.",
                       failure_mode="wrong_output")],
    }
    for label, rows in trials.items():
        done = len(rows)
        resolved = sum(r["resolved"] for r in rows) / done
        summary = {
            "label": label, "harness": "terminus-2", "tasks": done, "attempts": 1,
            "trials": done, "resolved_rate": resolved,
            "avg_reward": sum(r["reward"] for r in rows) / done, "pass_at_k": {"1": resolved},
            "goal_progress": 0.25 if label == "base" else 0.75,
            "by_category": {r["category"]: {"resolved_rate": float(r["resolved"]),
                                            "avg_reward": r["reward"], "trials": 1}
                            for r in rows},
            "by_difficulty": {"medium": {"resolved_rate": resolved, "avg_reward": 1.0,
                                         "trials": done}},
            "turns_mean": 2.0, "tool_calls_mean": 2.0, "tokens_mean": 812.0,
            "failure_modes": {m: 1 for m in (r["failure_mode"] for r in rows) if m},
            "skipped": [], "duration_s": 30.0}
        (root / "eval" / label).mkdir(parents=True, exist_ok=True)
        (root / "eval" / label / "summary.json").write_text(json.dumps(summary))
        _write_jsonl(root / "eval" / label / "trials.jsonl", rows)
    return root


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    root = make_run(tmp_path_factory.mktemp("run"))
    return root, report.write_report(root)


def test_plots_are_pngs(built):
    _, out = built
    names = {p.stem for p in (out / "plots").glob("*.png")}
    assert {"ppo_reward", "explained_variance", "logprob_gap", "routing_disagreement",
            "turns_length", "sft_loss", "eval"} <= names
    for path in (out / "plots").glob("*.png"):
        data = path.read_bytes()
        assert data[:8] == PNG_MAGIC, path
        assert 5_000 < len(data) < 300_000, (path, len(data))


def test_summary_has_the_numbers(built):
    _, out = built
    text = (out / "summary.md").read_text()
    assert "| base | 0.0% | 0.5 | 25.0% | @1 0.0% | 2 | 812 | 1 | 2 |" in text
    assert "| ppo | 50.0% | 2 | 75.0% | @1 50.0% | 2 | 812 | 1 | 2 |" in text
    assert "| data | 0.0% / 1 / 1 | 100.0% / 3 / 1 |" in text  # per category, base | ppo
    assert "| wrong_output | 1 | 1 |" in text and "| gave_up | 1 | 0 |" in text
    assert "| reward/mean | 1 | 3 | 1 | 3 |" in text  # first, last, min, max
    assert "| mismatch/logprob_gap | 0.021 | 0.013 |" in text
    assert "| sft/nll | 2 | 1.1 |" in text
    assert "](plots/ppo_reward.png)" in text and "trajectories.html" in text
    assert "no eval of `sft`" in text  # what is missing is said
    assert "## Wall time" not in text  # not a recipe run: no timings.jsonl


def test_summary_says_whether_the_critic_was_healthy(built, tmp_path):
    """The warm-up's DONE record (stopped healthy, or its cap reached) and the explained
    variance on PPO's first batch, the number Critic Warm-Up exists to make positive."""
    root, _ = built
    text = (root / "report" / "summary.md").read_text()
    assert "Critic explained variance at the start of PPO (step 1, before its update): 0.4\n" \
        in text and "Critic Warm-Up:" not in text  # no DONE record: nothing claimed
    marker = root / "warmup" / "DONE"
    for record, want in (({"steps": 30, "healthy": False, "ev_window_mean": -0.05},
                          "Critic Warm-Up: 30 steps, **reached its cap unhealthy** "
                          "(explained variance over its last steps: -0.05)"),
                         ({"steps": 7, "healthy": True, "ev_window_mean": 0.21},
                          "Critic Warm-Up: 7 steps, healthy (explained variance over its "
                          "last steps: 0.21)")):
        marker.write_text(json.dumps(record))
        try:
            out = report.write_report(root, tmp_path / str(record["steps"]))
        finally:
            marker.unlink()
        assert want in (out / "summary.md").read_text()


def test_summary_adds_the_recipe_phase_times(built, tmp_path):
    root, _ = built
    rows = [{"phase": "sft", "seconds": 600.0}, {"phase": "ppo", "seconds": 240.0},
            {"phase": "sft", "seconds": 60.0}]  # resumed: the remainder adds up
    _write_jsonl(root / "timings.jsonl", rows)
    try:
        text = (report.write_report(root, tmp_path / "r") / "summary.md").read_text()
    finally:
        (root / "timings.jsonl").unlink()
    assert "| sft | ppo | total |" in text and "| 11.0 min | 4.0 min | 15.0 min |" in text


def test_partial_run_still_reports(tmp_path):
    """A run killed mid-PPO: no evals, a torn last metrics line; an eval without summary.json."""
    _write_jsonl(tmp_path / "ppo" / "metrics.jsonl", [{"step": 0, "time": 1, "reward/mean": 0.5}])
    with open(tmp_path / "ppo" / "metrics.jsonl", "a") as f:
        f.write('{"step": 1, "time": 2, "rew')
    _write_jsonl(tmp_path / "eval" / "base" / "trials.jsonl",
                 [_trial("base", "t", resolved=True, reward=2.0, passed=2, total=2,
                         category="data", model_text="x")])
    (tmp_path / "eval" / "step_0002").mkdir()  # a periodic eval, summary only
    (tmp_path / "eval" / "step_0002" / "summary.json").write_text(json.dumps(
        {"label": "step_0002", "resolved_rate": 0.25, "avg_reward": 1.5, "by_category": None}))
    out = report.write_report(tmp_path)
    text = (out / "summary.md").read_text()
    assert "| step_0002 | 25.0% | 1.5 | – |" in text
    assert "`eval/step_0002/trials.jsonl` is missing or empty" in text
    assert (out / "plots" / "eval_progress.png").exists()
    assert "`sft/metrics.jsonl` does not exist" in text
    assert "`eval/base/summary.json` is missing" in text
    assert "| base (from trials.jsonl) | 100.0% | 2 |" in text
    assert (out / "plots" / "ppo_reward.png").exists()
    assert not (out / "plots" / "sft_loss.png").exists()
    assert 'data-task="t"' in (out / "trajectories.html").read_text()


def test_cli(built, tmp_path):
    root, _ = built
    proc = subprocess.run([sys.executable, "-m", "t1jax.report", str(root), "--out",
                           str(tmp_path / "r")], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "r" / "trajectories.html").exists()
    missing = subprocess.run([sys.executable, "-m", "t1jax.report", str(tmp_path / "nope")],
                             capture_output=True, text=True, timeout=120)
    assert missing.returncode == 1 and "does not exist" in missing.stderr


def test_viewer_escapes_model_text(built):
    _, out = built
    page = (out / "trajectories.html").read_text()
    assert EVIL not in page and "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    assert page.count("<script") == 1  # ours only
    assert "http://" not in page and "https://" not in page  # self-contained


# --- headless Chromium ------------------------------------------------------------------------

def _chromium() -> str:
    for name in ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable"):
        if path := shutil.which(name):
            return path
    reason = "no chromium binary (apt-get install chromium; scripts/setup.sh installs it)"
    if os.environ.get("T1JAX_REQUIRE_DOCKER") == "1":
        pytest.fail(reason)
    pytest.skip(reason)


def _run_chromium(binary: str, *args, timeout=120) -> subprocess.CompletedProcess:
    with tempfile.TemporaryDirectory() as profile:
        return subprocess.run(
            [binary, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
             "--no-first-run", "--disable-extensions", f"--user-data-dir={profile}",
             "--enable-logging=stderr", "--v=0", *args],
            capture_output=True, text=True, timeout=timeout)


def screenshot(page: Path, png: Path, binary: str | None = None, size=(1280, 1100),
               suffix: str = ""):
    binary = binary or _chromium()
    return _run_chromium(binary, f"--screenshot={png}", f"--window-size={size[0]},{size[1]}",
                         "--hide-scrollbars", page.resolve().as_uri() + suffix)


class _Text(html.parser.HTMLParser):
    """textContent of a DOM dump, plus the <script> elements in it."""

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.parts, self.scripts, self._in_script = [], 0, False

    def handle_starttag(self, tag, attrs):
        if tag == "script":
            self.scripts += 1
            self._in_script = True

    def handle_endtag(self, tag):
        if tag == "script":
            self._in_script = False

    def handle_data(self, data):
        if not self._in_script:
            self.parts.append(data)


@pytest.mark.slow  # three browser launches, ~20 s on 2 cores
def test_viewer_in_headless_chromium(built):
    binary = _chromium()
    _, out = built
    page = out / "trajectories.html"
    proc = _run_chromium(binary, "--dump-dom", page.resolve().as_uri())
    assert proc.returncode == 0, proc.stderr[-2000:]
    dom = proc.stdout
    assert "t1jax viewer ready: 4 trials" in proc.stderr  # console output is captured ...
    assert "Uncaught" not in proc.stderr, proc.stderr[-2000:]  # ... and holds no JS error
    assert 'data-viewer-ready="1"' in dom  # our script ran to the end
    assert "showing 4 of 4 trials" in dom
    parser = _Text()
    parser.feed(dom)
    text = "".join(parser.parts)
    assert parser.scripts == 1  # the model's <script> did not become an element
    assert EVIL in text and "</div> <b>not bold</b> &amp; done." in text
    assert "ValueError: bad row </div>" in text
    for task in ("csv-convert", "log-rotate"):
        assert text.count(task) >= 2
    assert dom.count('class="trial"') == 4
    assert dom.count('<tr class="pass">') == 1 + 0 + 3 + 1
    assert dom.count('<tr class="fail">') == 2 + 2 + 0 + 1
    assert "AssertionError: step 2 output differs" in text
    assert dom.count('class="seg trained"') == 8

    # The filters, preset from the query string (as a shared link would).
    query = page.resolve().as_uri() + "?label=ppo&outcome=resolved"
    filtered = _run_chromium(binary, "--dump-dom", query)
    assert "showing 1 of 4 trials" in filtered.stdout, filtered.stderr[-2000:]
    assert filtered.stdout.count('class="trial hidden"') == 3
    assert '<details class="trial" id="trial-2" data-label="ppo" data-task="csv-convert" ' \
        'data-outcome="resolved" open="">' in filtered.stdout  # the first one shown opens

    png = out / "viewer.png"
    shot = screenshot(page, png, binary)
    assert shot.returncode == 0 and png.exists(), shot.stderr[-2000:]
    assert "Uncaught" not in shot.stderr, shot.stderr[-2000:]
    from PIL import Image
    with Image.open(png) as image:
        assert image.format == "PNG" and image.size == (1280, 1100)
        colors = image.convert("RGB").getcolors(maxcolors=1 << 20)
    assert colors is not None and len(colors) > 50  # not blank: text, badges, highlights


if __name__ == "__main__":
    target = Path(sys.argv[1] if len(sys.argv) > 1 else "docs/trajectory_viewer.png")
    with tempfile.TemporaryDirectory() as tmp:
        out = report.write_report(make_run(Path(tmp) / "run"))
        # The PPO trial whose model text holds <script> and </div>, filtered as in a shared link.
        proc = screenshot(out / "trajectories.html", target, size=(1280, 1250),
                          suffix="?label=ppo&task=csv")
        print(proc.returncode, target, target.stat().st_size if target.exists() else "missing")


def test_paired_difference_by_task():
    """Each task's attempts averaged first, then the mean per-task difference, its standard
    error and a seeded bootstrap interval over tasks; skipped trials never count."""
    from t1jax.report.paired import paired_difference
    rng = np.random.RandomState(0)
    solved_before, solved_after = rng.rand(10, 3) < 0.3, rng.rand(10, 3) < 0.6

    def trials(solved):
        rows = [{"task_id": f"t{i}", "attempt": a, "status": "done", "resolved": bool(v),
                 "reward": 0.25 + 0.5 * float(v)} for i, row in enumerate(solved)
                for a, v in enumerate(row)]
        return rows + [{"task_id": "t0", "attempt": 9, "status": "skipped", "resolved": True}]

    got = paired_difference(trials(solved_before), trials(solved_after))
    diffs = solved_after.mean(1) - solved_before.mean(1)
    assert got["tasks"] == 10 and got["mean"] == pytest.approx(diffs.mean())
    assert got["se"] == pytest.approx(diffs.std(ddof=1) / np.sqrt(10))
    assert diffs.min() <= got["low"] < got["mean"] < got["high"] <= diffs.max()
    assert got == paired_difference(trials(solved_before), trials(solved_after))  # seeded
    reward = paired_difference(trials(solved_before), trials(solved_after), "reward")
    assert reward["mean"] == pytest.approx(0.5 * diffs.mean())
    same = paired_difference(trials(solved_before), trials(solved_before))
    assert same["mean"] == same["se"] == same["low"] == same["high"] == 0.0
    one = paired_difference(trials(solved_before)[:3], trials(solved_after)[:3])
    assert one["tasks"] == 1 and np.isnan(one["se"])


def test_summary_pairs_sft_with_base_and_ppo_with_sft(built, tmp_path):
    root, _ = built
    run = tmp_path / "run"
    shutil.copytree(root, run, ignore=shutil.ignore_patterns("report"))
    shutil.copytree(run / "eval" / "base", run / "eval" / "sft")  # SFT = base, trial by trial
    text = (report.write_report(run) / "summary.md").read_text()
    assert "### Differences, paired by task" in text
    assert "| sft − base | +0.0 pts (SE 0.0; +0.0 .. +0.0) | +0.000 (SE 0.000; +0.000 .. " \
           "+0.000) | 2 |" in text
    # csv-convert resolved by PPO only; rewards +2 and +1: two tasks, SE = sd / sqrt(2)
    assert "| ppo − sft | +50.0 pts (SE 50.0; +0.0 .. +100.0) | +1.500 (SE 0.500; +1.000 .. " \
           "+2.000) | 2 |" in text


def test_seed_sweep_reports_each_seed_and_the_pool(tmp_path):
    """experiments/probes/ppo_seed_sweep.py's table: per seed the paired PPO - SFT gain;
    pooled, each task's gain averaged over the seeds."""
    from experiments.probes import ppo_seed_sweep as sweep
    solved = {1: {"sft": [0, 0, 1], "ppo": [1, 0, 1]}, 2: {"sft": [0, 0, 1], "ppo": [1, 1, 1]}}
    workdirs = {}
    for seed, labels in solved.items():
        for label, outcomes in labels.items():
            _write_jsonl(tmp_path / f"s{seed}" / "eval" / label / "trials.jsonl", [
                {"task_id": f"t{i}", "attempt": 0, "status": "done", "resolved": bool(v),
                 "reward": float(v)} for i, v in enumerate(outcomes)])
        workdirs[seed] = tmp_path / f"s{seed}"
    got = sweep.gains(workdirs)
    assert got[1]["mean"] == pytest.approx(1 / 3) and got[2]["mean"] == pytest.approx(2 / 3)
    assert got["pooled"]["mean"] == pytest.approx(0.5) and got["pooled"]["tasks"] == 3
    # per-task pooled differences 1, 0.5, 0: SE = sd / sqrt(3)
    assert got["pooled"]["se"] == pytest.approx(np.std([1, 0.5, 0], ddof=1) / np.sqrt(3))
    text = sweep.table(got, "resolved")
    assert "| 1 | +33.3 pts |" in text and "| pooled | +50.0 pts | 28.9 pts |" in text
