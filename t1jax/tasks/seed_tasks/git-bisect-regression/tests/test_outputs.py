import os
import subprocess

import pytest

REPO = "/app/repo"
BRANCH = "fix/revert-regression"
MAIN_TIP = "c4fe9e96951024aef8e34183a8162c3fb76ead97"
BAD_SUBJECT = "Simplify tokenizer pattern"
ANSWER = "/app/first_bad_commit.txt"


def git(*args, cwd=REPO):
    res = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True)
    assert res.returncode == 0, f"git {' '.join(args)} failed: {res.stderr}"
    return res.stdout


def bad_commit():
    for line in git("log", "--format=%H %s", MAIN_TIP).splitlines():
        sha, subject = line.split(" ", 1)
        if subject == BAD_SUBJECT:
            return sha
    raise AssertionError("bad commit not found")


def run_test(tmp_path, rev, test="tests/test_textstats.py::test_word_frequencies"):
    """Check out `rev` into a private clone and run pytest there (never touches /app/repo)."""
    clone = tmp_path / f"clone-{rev.replace('/', '_')}"
    if not clone.exists():
        subprocess.run(["git", "clone", "-q", "--no-checkout", REPO, str(clone)], check=True)
    git("checkout", "-q", "-f", rev, cwd=clone)
    return subprocess.run(["python3", "-m", "pytest", "-q", "-p", "no:cacheprovider", *test.split()],
                          cwd=clone, capture_output=True, text=True, timeout=60)


def test_first_bad_commit_file(tmp_path):
    assert os.path.isfile(ANSWER), f"missing {ANSWER}"
    with open(ANSWER) as f:
        got = f.read().strip()
    bad = bad_commit()
    assert got == bad
    # sanity: the test fails at the bad commit and passes at its parent
    assert run_test(tmp_path, bad).returncode != 0
    assert run_test(tmp_path, bad + "^").returncode == 0


def test_revert_branch_single_commit():
    tip = git("rev-parse", "--verify", f"refs/heads/{BRANCH}").strip()
    assert git("rev-parse", f"{tip}^").strip() == MAIN_TIP
    assert git("rev-list", "--count", f"{MAIN_TIP}..{tip}").strip() == "1"
    assert git("log", "-1", "--format=%s", tip).strip() == f'Revert "{BAD_SUBJECT}"'
    assert git("log", "-1", "--format=%an <%ae>", tip).strip() == "Release Bot <bot@example.com>"


def test_revert_content_is_inverse_of_bad_commit(tmp_path):
    tip = git("rev-parse", "--verify", f"refs/heads/{BRANCH}").strip()
    clone = tmp_path / "expected"
    subprocess.run(["git", "clone", "-q", REPO, str(clone)], check=True)
    git("checkout", "-q", "-f", MAIN_TIP, cwd=clone)
    git("-c", "user.name=T", "-c", "user.email=t@example.com", "revert", "--no-edit", bad_commit(), cwd=clone)
    assert git("rev-parse", "HEAD^{tree}", cwd=clone).strip() == git("rev-parse", f"{tip}^{{tree}}").strip()


def test_word_frequencies_passes_on_branch(tmp_path):
    git("rev-parse", "--verify", f"refs/heads/{BRANCH}")
    res = run_test(tmp_path, BRANCH)
    assert res.returncode == 0, res.stdout
    res = run_test(tmp_path, BRANCH, "tests --deselect tests/test_textstats.py::test_sentence_count")
    assert res.returncode == 0, res.stdout


def test_final_repository_state():
    assert git("symbolic-ref", "--short", "HEAD").strip() == BRANCH
    assert git("status", "--porcelain").strip() == ""
    assert not os.path.exists(os.path.join(REPO, ".git", "BISECT_LOG")), "a bisect is still in progress"
    assert not os.path.exists(os.path.join(REPO, ".git", "BISECT_START"))


def test_invariant_main_and_tags_unchanged():
    assert git("rev-parse", "refs/heads/main").strip() == MAIN_TIP
    assert git("rev-list", "--count", "v0.1").strip() == "1"
