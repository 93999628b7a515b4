import hashlib
import math
import os
import random
import shutil
import stat
import subprocess
import time

import pytest

PROJECT = "/app/project"
SOURCES_SHA256 = {
    "src/main.c": "46855ca9951a91f56ac04f581008d48bebe6654a596ad849daf9f9281d79ad49",
    "src/parse.c": "c04db340a6328c42f475178fb6af7aef5d80df60c7fb9039051f4fb839f44f69",
    "src/parse.h": "8712a87e10163cc1a6436173da65f772ab56fec66923a3adce4f31183d5bebe8",
    "src/stats.c": "4380e7c0d96c4cba4cab9d1fa7f5040ef34eab69ce355c61be12942630ef3659",
    "src/stats.h": "8f2b19fe0813db003aedbd61c3e951aa18a3ffd152585627d91ccadb5fbd9b11",
    "src/version.h": "48c3f661b4ee25aa67d874d29633de70ff7873ad68ae353e929d8807bf4ecc48",
    "tests/test_stats.c": "43a07146766154d7a67b2064f589041fb25268af516dbef573bbc8746970da52",
}


@pytest.fixture
def proj(tmp_path):
    dst = tmp_path / "proj"
    shutil.copytree(PROJECT, dst, ignore=shutil.ignore_patterns("bin", "build", "*.o", "*.d"))
    return dst


def make(proj, *args, timeout=120):
    return subprocess.run(["make", "-C", str(proj), *args], capture_output=True, text=True,
                          timeout=timeout)


def build(proj, *args):
    res = make(proj, *args)
    assert res.returncode == 0, res.stdout + res.stderr
    return res


def age_tree(proj):
    """Sources far in the past, build outputs a bit later: a consistent, settled tree."""
    now = time.time()
    for d, _, files in os.walk(proj):
        for f in files:
            p = os.path.join(d, f)
            rel = os.path.relpath(p, proj)
            t = now - 100 if rel.startswith(("bin", "build")) else now - 200
            os.utime(p, (t, t))


def mtime(p):
    return os.stat(p).st_mtime_ns


def test_make_builds_app(proj):
    build(proj)
    app = proj / "bin" / "app"
    assert app.is_file() and os.access(app, os.X_OK)
    for name in ("main", "parse", "stats"):
        assert (proj / "build" / f"{name}.o").is_file(), name
    rng = random.Random(5)
    xs = [round(rng.uniform(-50, 50), 2) for _ in range(7)]
    out = subprocess.run([str(app), *map(str, xs)], capture_output=True, text=True).stdout.strip()
    n = len(xs)
    assert out == (f"n={n} sum={sum(xs):.3f} mean={sum(xs) / n:.3f} "
                   f"rms={math.sqrt(sum(x * x for x in xs) / n):.3f}")
    ver = subprocess.run([str(app), "--version"], capture_output=True, text=True).stdout.strip()
    assert ver == "app 1.2.0"


def test_up_to_date_after_build(proj):
    build(proj)
    age_tree(proj)
    before = {p: mtime(proj / p) for p in ("bin/app", "build/main.o", "build/parse.o", "build/stats.o")}
    assert make(proj, "-q", "all").returncode == 0
    build(proj)
    assert {p: mtime(proj / p) for p in before} == before


def test_header_dependencies(proj):
    build(proj)
    age_tree(proj)
    old = {n: mtime(proj / "build" / f"{n}.o") for n in ("main", "parse", "stats")}
    text = (proj / "src" / "version.h").read_text().replace('"1.2.0"', '"9.9.9"')
    (proj / "src" / "version.h").write_text(text)
    assert make(proj, "-q", "all").returncode != 0
    build(proj)
    assert mtime(proj / "build" / "main.o") != old["main"]
    assert mtime(proj / "build" / "parse.o") == old["parse"]
    assert mtime(proj / "build" / "stats.o") == old["stats"]
    ver = subprocess.run([str(proj / "bin" / "app"), "--version"], capture_output=True, text=True)
    assert ver.stdout.strip() == "app 9.9.9"
    # stats.h is included by main.c and stats.c, not by parse.c
    age_tree(proj)
    old = {n: mtime(proj / "build" / f"{n}.o") for n in ("main", "parse", "stats")}
    os.utime(proj / "src" / "stats.h")
    build(proj)
    assert mtime(proj / "build" / "main.o") != old["main"]
    assert mtime(proj / "build" / "stats.o") != old["stats"]
    assert mtime(proj / "build" / "parse.o") == old["parse"]


def test_make_test_passes(proj):
    res = build(proj, "test")
    assert "ALL TESTS PASSED" in res.stdout
    assert (proj / "bin" / "test_stats").is_file()


def test_make_test_fails_on_broken_code(proj):
    src = (proj / "src" / "stats.c").read_text()
    (proj / "src" / "stats.c").write_text(src.replace("return n ? stats_sum(xs, n) / (double)n : 0.0;",
                                                      "return n ? stats_sum(xs, n) / (double)(n + 1) : 0.0;"))
    res = make(proj, "test")
    assert res.returncode != 0
    assert "FAIL" in res.stdout


def test_clean(proj):
    before = sorted(os.path.relpath(os.path.join(d, f), proj) for d, _, fs in os.walk(proj) for f in fs)
    build(proj)
    build(proj, "test")
    assert (proj / "bin").is_dir() and (proj / "build").is_dir()
    build(proj, "clean")
    assert not (proj / "bin").exists() and not (proj / "build").exists()
    after = sorted(os.path.relpath(os.path.join(d, f), proj) for d, _, fs in os.walk(proj) for f in fs)
    assert after == before


def test_install_with_prefix(proj, tmp_path):
    stage = tmp_path / "stage"
    res = make(proj, "install", f"PREFIX={stage}")
    assert res.returncode == 0, res.stdout + res.stderr
    inst = stage / "bin" / "app"
    assert inst.is_file()
    assert stat.S_IMODE(os.stat(inst).st_mode) == 0o755
    out = subprocess.run([str(inst), "1", "2"], capture_output=True, text=True).stdout.strip()
    assert out == "n=2 sum=3.000 mean=1.500 rms=1.581"


def test_parallel_build(proj):
    for _ in range(2):
        build(proj, "clean")
        build(proj, "-j8", "all")
        assert (proj / "bin" / "app").is_file()
        build(proj, "clean")
        res = build(proj, "-j8", "test")
        assert "ALL TESTS PASSED" in res.stdout


def test_invariant_sources_unchanged():
    for rel, digest in SOURCES_SHA256.items():
        with open(os.path.join(PROJECT, rel), "rb") as f:
            assert hashlib.sha256(f.read()).hexdigest() == digest, rel
