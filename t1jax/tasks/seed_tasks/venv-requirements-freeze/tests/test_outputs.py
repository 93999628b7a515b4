import hashlib
import json
import os
import re
import subprocess

VENV = "/app/venv"
LOCK = "/app/requirements.lock"
WHEELS = "/app/wheels"
EXPECTED = {"colorlite": "1.0.2", "slugify-lite": "2.1.0", "tinyfmt": "0.3.1"}
FILES = {"colorlite": "colorlite-1.0.2-py3-none-any.whl",
         "slugify-lite": "slugify_lite-2.1.0.tar.gz",
         "tinyfmt": "tinyfmt-0.3.1-py3-none-any.whl"}
LINE = re.compile(r"^([a-z0-9-]+)==(\S+) --hash=sha256:([0-9a-f]{64})$")


def norm(name):
    return re.sub(r"[-_.]+", "-", name).lower()


def local_packages(venv):
    res = subprocess.run([os.path.join(venv, "bin", "python"), "-m", "pip", "list", "--local",
                          "--format=json"], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    return {norm(p["name"]): p["version"] for p in json.loads(res.stdout)
            if norm(p["name"]) not in ("pip", "setuptools", "wheel")}


def sha(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def lock_lines():
    assert os.path.isfile(LOCK), "missing " + LOCK
    with open(LOCK) as f:
        return [l.rstrip("\n") for l in f if l.strip()]


def test_venv_with_system_site_packages():
    with open(os.path.join(VENV, "pyvenv.cfg")) as f:
        assert re.search(r"^include-system-site-packages\s*=\s*true\s*$", f.read(), re.M)
    code = ("import colorlite, tinyfmt, slugify_lite; "
            "print(colorlite.__version__, tinyfmt.__version__, slugify_lite.__version__); "
            "print(slugify_lite.slugify('Hello, World!')); print(colorlite.paint('x', 'red') == '\\x1b[31m(x)\\x1b[0m')")
    res = subprocess.run([os.path.join(VENV, "bin", "python"), "-c", code], capture_output=True,
                         text=True, cwd="/", timeout=60)
    assert res.returncode == 0, res.stderr
    assert res.stdout.split("\n")[:3] == ["1.0.2 0.3.1 2.1.0", "hello-world", "True"]


def test_venv_contains_exactly_resolved_packages():
    assert local_packages(VENV) == EXPECTED


def test_lock_names_versions_sorted():
    lines = lock_lines()
    parsed = [LINE.match(l) for l in lines]
    assert all(parsed), lines
    assert [(m.group(1), m.group(2)) for m in parsed] == sorted(EXPECTED.items())
    assert {m.group(1): m.group(2) for m in parsed} == local_packages(VENV)


def test_lock_hashes_match_wheelhouse():
    got = {LINE.match(l).group(1): LINE.match(l).group(3) for l in lock_lines() if LINE.match(l)}
    assert got == {n: sha(os.path.join(WHEELS, f)) for n, f in FILES.items()}


def test_lock_installs_with_require_hashes(tmp_path):
    lock_lines()
    venv = str(tmp_path / "fresh")
    subprocess.run(["python3", "-m", "venv", "--system-site-packages", venv], check=True, timeout=120)
    res = subprocess.run([os.path.join(venv, "bin", "pip"), "install", "--require-hashes", "--no-index",
                          "--find-links", WHEELS, "--no-build-isolation", "-r", LOCK],
                         capture_output=True, text=True, timeout=300, cwd=str(tmp_path))
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    assert local_packages(venv) == EXPECTED
