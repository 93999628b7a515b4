import os
import shutil
import string
import subprocess
import tomllib

import pytest

SRC = "/app/src"
VENV = "/app/venv"
STOPWORDS = {"a", "an", "and", "are", "as", "at", "be", "by", "for", "from", "in", "is", "it",
             "of", "on", "or", "that", "the", "this", "to", "was", "with"}
SAMPLE = ("The quick brown fox jumps over the lazy dog.\n"
          "It was the best of times, it was the worst of times\n"
          "Ünïcode — words: Straße, café; AND (the) end.\n\n  trailing   spaces  ")


def expected_line(path, text, ignore=False):
    tokens = text.split()
    if ignore:
        tokens = [t for t in tokens if t.strip(string.punctuation).lower() not in STOPWORDS]
    return f"{path}: lines={text.count(chr(10))} words={len(tokens)} chars={len(text)}"


def run(exe, *args, cwd="/"):
    return subprocess.run([exe, *args], capture_output=True, text=True, cwd=cwd, timeout=60)


@pytest.fixture
def sample(tmp_path):
    p = tmp_path / "sample.txt"
    p.write_text(SAMPLE, encoding="utf-8")
    (tmp_path / "other.txt").write_text("one two three\nfour\n", encoding="utf-8")
    return p


def test_pyproject_metadata():
    with open(os.path.join(SRC, "pyproject.toml"), "rb") as f:
        data = tomllib.load(f)
    assert data["build-system"]["build-backend"] == "setuptools.build_meta"
    project = data["project"]
    assert project["name"] == "textkit"
    assert project["version"] == "1.4.0"
    assert project["requires-python"].replace(" ", "") == ">=3.9"
    assert project["scripts"]["textkit-count"] == "textkit.cli:main"


def test_venv_console_script_counts(sample):
    exe = os.path.join(VENV, "bin", "textkit-count")
    assert os.access(exe, os.X_OK), "missing /app/venv/bin/textkit-count"
    res = run(exe, str(sample), str(sample.parent / "other.txt"))
    assert res.returncode == 0, res.stderr
    assert res.stdout.splitlines() == [expected_line(str(sample), SAMPLE),
                                       expected_line(str(sample.parent / "other.txt"), "one two three\nfour\n")]


def test_venv_console_script_stopwords(sample):
    res = run(os.path.join(VENV, "bin", "textkit-count"), "--ignore-stopwords", "sample.txt",
              cwd=str(sample.parent))
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == expected_line("sample.txt", SAMPLE, ignore=True)


def test_venv_version():
    res = run(os.path.join(VENV, "bin", "textkit-count"), "--version")
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "textkit-count 1.4.0"
    with open(os.path.join(VENV, "pyvenv.cfg")) as f:
        assert "include-system-site-packages = true" in f.read()


def test_fresh_install_from_copy(tmp_path, sample):
    copy = tmp_path / "srccopy"
    shutil.copytree(SRC, copy, ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__"))
    venv = tmp_path / "venv"
    subprocess.run(["python3", "-m", "venv", "--system-site-packages", str(venv)], check=True, timeout=120)
    res = subprocess.run([str(venv / "bin" / "pip"), "install", "--no-build-isolation", "--no-index", str(copy)],
                         capture_output=True, text=True, timeout=300, cwd=str(tmp_path))
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    shutil.rmtree(copy)
    exe = str(venv / "bin" / "textkit-count")
    res = run(exe, "--ignore-stopwords", str(sample))
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == expected_line(str(sample), SAMPLE, ignore=True)
    assert run(exe, "--version").stdout.strip() == "textkit-count 1.4.0"
    site = subprocess.run([str(venv / "bin" / "python"), "-c",
                           "import textkit, os; print(os.path.dirname(textkit.__file__))"],
                          capture_output=True, text=True, cwd="/").stdout.strip()
    assert site.startswith(str(venv)), site
    assert os.path.isfile(os.path.join(site, "data", "stopwords.txt"))
