import gzip
import hashlib
import os
import stat
import subprocess

import pytest

SCRIPT = "/app/rotate.sh"
LOGS = "/app/logs"
# sha256 of the (decompressed) content each generation must have after one rotation with KEEP=5
EXPECTED_GENERATIONS = {
    "app.log.1": "d1c04ea7365864689e37305926cd7c9c5df30efc201e2840c25024ad14e8e862",
    "app.log.2.gz": "d210caa75c9c4036810efcdaa828c477ea22674aa3812fe25eade4b02fb429d0",
    "app.log.3.gz": "c482fdc9fc8b6b58cfef7d786a90cc73768a53d7089d23bf40285f12b3f4c674",
    "app.log.4.gz": "a9ae40498aa4c3d1f1dacd12d546314d0fcbec43806bca57e4d587073110322f",
}
OTHER = {
    "other.log": "a075ca18f543bea5475a3d6e87dd1cd5bfdff5f3d94e8c28497f3590a3de5784",
    "other.log.1": "e432cee5dc1ab85ebaba18419d0add2038b085dd62afd3874187913e1d061f21",
}


def content(path):
    with open(path, "rb") as f:
        data = f.read()
    return gzip.decompress(data) if path.endswith(".gz") else data


def run(*args):
    return subprocess.run([SCRIPT, *map(str, args)], capture_output=True, text=True, timeout=30)


@pytest.fixture
def logdir(tmp_path):
    d = tmp_path / "var log"
    d.mkdir()
    (d / "svc.log").write_bytes(b"current line 1\ncurrent line 2\n")
    (d / "svc.log.1").write_bytes(b"gen1\n")
    for n in (2, 3, 4):
        (d / f"svc.log.{n}.gz").write_bytes(gzip.compress(f"gen{n}\n".encode()))
    (d / "svc.log.old").write_bytes(b"not a generation\n")
    (d / "svc.log").chmod(0o600)
    return d


def test_app_logs_rotated_file_set():
    assert sorted(os.listdir(LOGS)) == sorted(list(EXPECTED_GENERATIONS) + ["app.log"] + list(OTHER))
    st = os.stat(os.path.join(LOGS, "app.log"))
    assert st.st_size == 0
    assert stat.S_IMODE(st.st_mode) == 0o640


def test_app_logs_generation_contents():
    for name, digest in EXPECTED_GENERATIONS.items():
        assert hashlib.sha256(content(os.path.join(LOGS, name))).hexdigest() == digest, name
    with open(os.path.join(LOGS, "app.log.2.gz"), "rb") as f:
        assert f.read(2) == b"\x1f\x8b", "app.log.2.gz is not gzip-compressed"


def test_script_shifts_and_compresses(logdir):
    res = run(logdir / "svc.log", 10)
    assert res.returncode == 0, res.stderr
    got = {p: content(str(logdir / p)) for p in os.listdir(logdir)}
    assert got == {"svc.log": b"", "svc.log.1": b"current line 1\ncurrent line 2\n",
                   "svc.log.2.gz": b"gen1\n", "svc.log.3.gz": b"gen2\n", "svc.log.4.gz": b"gen3\n",
                   "svc.log.5.gz": b"gen4\n", "svc.log.old": b"not a generation\n"}
    assert stat.S_IMODE(os.stat(logdir / "svc.log").st_mode) == 0o600
    # a second rotation keeps shifting
    (logdir / "svc.log").write_bytes(b"next\n")
    assert run(logdir / "svc.log", 10).returncode == 0
    assert content(str(logdir / "svc.log.1")) == b"next\n"
    assert content(str(logdir / "svc.log.2.gz")) == b"current line 1\ncurrent line 2\n"
    assert content(str(logdir / "svc.log.6.gz")) == b"gen4\n"


def test_script_keep_limit_and_gaps(logdir):
    (logdir / "svc.log.3.gz").unlink()
    (logdir / "svc.log.9.gz").write_bytes(gzip.compress(b"ancient\n"))
    res = run(logdir / "svc.log", 4)
    assert res.returncode == 0, res.stderr
    names = sorted(os.listdir(logdir))
    assert names == ["svc.log", "svc.log.1", "svc.log.2.gz", "svc.log.3.gz", "svc.log.old"]
    assert content(str(logdir / "svc.log.3.gz")) == b"gen2\n"
    (logdir / "svc.log").write_bytes(b"last\n")
    assert run(logdir / "svc.log", 1).returncode == 0
    assert sorted(os.listdir(logdir)) == ["svc.log", "svc.log.1", "svc.log.old"]
    assert content(str(logdir / "svc.log.1")) == b"last\n"


def test_script_empty_log_is_noop(logdir):
    (logdir / "svc.log").write_bytes(b"")
    before = {p: content(str(logdir / p)) for p in os.listdir(logdir)}
    res = run(logdir / "svc.log", 3)
    assert res.returncode == 0, res.stderr
    assert {p: content(str(logdir / p)) for p in os.listdir(logdir)} == before


def test_script_errors(logdir):
    res = run(logdir / "missing.log", 3)
    assert res.returncode == 1 and res.stderr.strip()
    assert run(logdir / "svc.log").returncode == 2
    assert run(logdir / "svc.log", 3, "x").returncode == 2
    assert run(logdir / "svc.log", 0).returncode == 2
    assert run(logdir / "svc.log", "two").returncode == 2
    assert content(str(logdir / "svc.log.1")) == b"gen1\n"


def test_invariant_other_logs_untouched():
    for name, digest in OTHER.items():
        with open(os.path.join(LOGS, name), "rb") as f:
            assert hashlib.sha256(f.read()).hexdigest() == digest, name
