import os
import shutil
import subprocess

REPO = "/app/repo"
HOOK = "/app/repo/.git/hooks/pre-commit"
HEAD = "b3748a8ef40116f6496d303fce399db23e0f5154"
LIMIT = 102400


def git(repo, *args, check=True):
    res = subprocess.run(["git", "-c", "user.name=Tester", "-c", "user.email=t@example.com", *args],
                         cwd=repo, capture_output=True, text=True, timeout=60)
    if check:
        assert res.returncode == 0, f"git {' '.join(args)}: {res.stderr}"
    return res


def copy_repo(tmp_path):
    """A private copy of /app/repo (hooks included) to commit in."""
    assert os.path.isfile(HOOK) and os.access(HOOK, os.X_OK), "hook missing or not executable"
    dst = tmp_path / "repo"
    shutil.copytree(REPO, dst, symlinks=True)
    return dst


def head(repo):
    return git(repo, "rev-parse", "HEAD").stdout.strip()


def commit(repo, files, binary=False):
    for name, data in files.items():
        path = repo / name
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(data, bytes):
            path.write_bytes(data)
        else:
            path.write_text(data)
        git(repo, "add", "--", name)
    before = head(repo)
    res = git(repo, "commit", "-q", "-m", "test commit", check=False)
    return res, head(repo) != before


def test_clean_commit_accepted(tmp_path):
    repo = copy_repo(tmp_path)
    res, made = commit(repo, {"src/new.py": "def f():\n    return 1  # fine\n", "notes.md": "todo list: none\n"})
    assert made and res.returncode == 0, res.stderr


def test_todo_marker_rejected(tmp_path):
    repo = copy_repo(tmp_path)
    res, made = commit(repo, {"src/stock.py": "def stock(item):\n    # TODO: real lookup\n    return 0\n"})
    assert not made and res.returncode != 0
    assert "pre-commit: src/stock.py contains a TODO/FIXME marker" in res.stderr


def test_fixme_and_word_boundaries(tmp_path):
    repo = copy_repo(tmp_path)
    res, made = commit(repo, {"a.txt": "value = 1  (FIXME)\n"})
    assert not made and "pre-commit: a.txt contains a TODO/FIXME marker" in res.stderr
    git(repo, "reset", "-q")
    os.remove(repo / "a.txt")
    res, made = commit(repo, {"b.txt": "TODOS are fine, MASTODON too, todo lowercase, _TODO and FIXMEs\n"})
    assert made, res.stderr


def test_size_limit(tmp_path):
    repo = copy_repo(tmp_path)
    res, made = commit(repo, {"data/exact.bin": b"x" * LIMIT})
    assert made, res.stderr
    res, made = commit(repo, {"data/big.bin": b"y" * (LIMIT + 1)})
    assert not made
    assert "pre-commit: data/big.bin is larger than 102400 bytes" in res.stderr


def test_staged_content_not_worktree(tmp_path):
    repo = copy_repo(tmp_path)
    (repo / "src" / "report.py").write_text('def report():\n    return "ok!"\n')
    git(repo, "add", "src/report.py")
    (repo / "src" / "report.py").write_text('def report():\n    return "ok!"  # TODO unstaged\n')
    res = git(repo, "commit", "-q", "-m", "staged version is clean", check=False)
    assert res.returncode == 0, res.stderr
    (repo / "src" / "stock.py").write_text("# FIXME staged\n")
    git(repo, "add", "src/stock.py")
    (repo / "src" / "stock.py").write_text("# clean in the working tree\n")
    before = head(repo)
    res = git(repo, "commit", "-q", "-m", "staged version has a marker", check=False)
    assert res.returncode != 0 and head(repo) == before
    assert "pre-commit: src/stock.py contains a TODO/FIXME marker" in res.stderr


def test_paths_with_spaces_and_all_problems_reported(tmp_path):
    repo = copy_repo(tmp_path)
    res, made = commit(repo, {"my notes.txt": "TODO: write notes\n", "big file.dat": b"z" * (LIMIT + 10),
                              "ok file.txt": "fine\n"})
    assert not made
    assert "pre-commit: my notes.txt contains a TODO/FIXME marker" in res.stderr
    assert "pre-commit: big file.dat is larger than 102400 bytes" in res.stderr
    assert "ok file.txt" not in res.stderr


def test_deleted_and_binary_files_ignored(tmp_path):
    repo = copy_repo(tmp_path)
    git(repo, "rm", "-q", "docs/legacy.md")
    res, made = commit(repo, {"img/blob.bin": b"\x00\x01TODO FIXME\x00" * 10})
    assert made, res.stderr
    res, made = commit(repo, {"img/big-binary.bin": b"\x00" * (LIMIT + 1)})
    assert not made and "pre-commit: img/big-binary.bin is larger than 102400 bytes" in res.stderr


def test_invariant_repository_unchanged():
    res = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True)
    assert res.stdout.strip() == HEAD
    res = subprocess.run(["git", "status", "--porcelain"], cwd=REPO, capture_output=True, text=True)
    assert res.stdout.strip() == ""
