import os
import subprocess
import tarfile
import io

import pytest

REPO = "/app/repo"
BRANCH = "feature/search"
MAIN_TIP = "5cd04b4ac6c1cfb4347dd60dff18078d25fd641b"
OLD_TIP = "9516aac345246337d487435d9db704a6fe1705eb"
MESSAGES = ["Add search module", "Add search CLI flag", "Add search tests"]
FILES = [["app/search.py"], ["app/cli.py"], ["tests/test_search.py"]]
AUTHOR_DATES = ["2024-02-03T10:00:00+00:00", "2024-02-05T10:00:00+00:00", "2024-02-08T10:00:00+00:00"]
SEARCH_PY = ('def search(items, query):\n    """Return the items containing query, ignoring case."""\n'
             '    q = query.lower()\n    return [item for item in items if q in item.lower()]\n')


def git(*args):
    res = subprocess.run(["git", "-C", REPO, *args], capture_output=True, text=True)
    assert res.returncode == 0, f"git {' '.join(args)} failed: {res.stderr}"
    return res.stdout


def commits():
    return git("rev-list", "--reverse", f"{MAIN_TIP}..{BRANCH}").split()


@pytest.fixture
def export(tmp_path):
    data = subprocess.run(["git", "-C", REPO, "archive", "--format=tar", BRANCH],
                          capture_output=True, check=True).stdout
    with tarfile.open(fileobj=io.BytesIO(data)) as tf:
        tf.extractall(tmp_path)
    return tmp_path


def test_rebased_branch_checked_out_and_clean():
    assert git("symbolic-ref", "--short", "HEAD").strip() == BRANCH
    ancestor = subprocess.run(["git", "-C", REPO, "merge-base", "--is-ancestor", MAIN_TIP, "HEAD"])
    assert ancestor.returncode == 0, "the checked-out branch is not based on the tip of main"
    assert git("status", "--porcelain", "--untracked-files=all").strip() == ""
    git_dir = os.path.join(REPO, ".git")
    assert not os.path.exists(os.path.join(git_dir, "rebase-merge"))
    assert not os.path.exists(os.path.join(git_dir, "rebase-apply"))


def test_linear_three_commits_on_main():
    cs = commits()
    assert len(cs) == 3
    assert git("rev-parse", f"{cs[0]}^").strip() == MAIN_TIP
    assert git("rev-list", "--merges", f"{MAIN_TIP}..{BRANCH}").strip() == ""
    assert git("merge-base", BRANCH, "main").strip() == MAIN_TIP


def test_commit_messages():
    assert [git("log", "-1", "--format=%B", c).strip() for c in commits()] == MESSAGES


def test_each_commit_touches_one_file():
    cs = commits()
    assert len(cs) == 3
    for c, files in zip(cs, FILES):
        assert git("diff-tree", "--no-commit-id", "--name-only", "-r", c).split() == files, c


def test_fixups_squashed_and_wip_dropped():
    cs = commits()
    assert len(cs) == 3
    assert git("show", f"{cs[0]}:app/search.py") == SEARCH_PY
    assert git("show", f"{BRANCH}:app/search.py") == SEARCH_PY
    for c in cs:
        assert "debug_notes.txt" not in git("ls-tree", "-r", "--name-only", c).split()
    assert '"Durian cake"' in git("show", f"{cs[1]}:app/cli.py")


def test_cli_conflict_resolved(export):
    src = (export / "app" / "cli.py").read_text()
    assert "<<<<<<<" not in src and ">>>>>>>" not in src and "=======" not in src
    opts = [l.strip() for l in src.splitlines() if "parser.add_argument(" in l]
    assert opts == ['parser.add_argument("--name", default="world")',
                    'parser.add_argument("--verbose", action="store_true", help="print more")',
                    'parser.add_argument("--query", help="text to search for")']
    env = dict(os.environ, PYTHONPATH=str(export))
    res = subprocess.run(["python3", "-m", "app.cli", "--query", "an"], cwd=export, env=env,
                         capture_output=True, text=True)
    assert res.stdout.splitlines() == ["banana split", "Durian cake"], res.stderr
    res = subprocess.run(["python3", "-m", "app.cli", "--verbose", "--name", "x"], cwd=export, env=env,
                         capture_output=True, text=True)
    assert res.stdout.strip() == "hello x", res.stderr
    assert (export / "VERSION").read_text().strip() == "1.1.0"
    res = subprocess.run(["python3", "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests"], cwd=export,
                         env=dict(env, PYTHONDONTWRITEBYTECODE="1"), capture_output=True, text=True)
    assert res.returncode == 0, res.stdout + res.stderr


def test_authorship_preserved():
    cs = commits()
    assert len(cs) == 3
    for c, date in zip(cs, AUTHOR_DATES):
        assert git("log", "-1", "--format=%an <%ae> %aI", c).strip() == f"Bob Feature <bob@example.com> {date}"


def test_backup_tag():
    assert git("rev-parse", "search-before-rebase^{commit}").strip() == OLD_TIP


def test_invariant_main_unchanged():
    assert git("rev-parse", "main").strip() == MAIN_TIP
