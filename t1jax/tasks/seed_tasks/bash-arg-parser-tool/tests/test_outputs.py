import os
import subprocess

import pytest

TOOL = "/app/txtool"
USAGE = "Usage: txtool [-u|-l] [-t] [-s] [-n] [-w WIDTH] [-p PREFIX] [-o OUTFILE] [--] FILE..."


def run(*args, stdin="", cwd=None):
    assert os.path.isfile(TOOL) and os.access(TOOL, os.X_OK), "/app/txtool missing or not executable"
    return subprocess.run([TOOL, *args], input=stdin, capture_output=True, text=True, timeout=30, cwd=cwd)


@pytest.fixture
def files(tmp_path):
    a = tmp_path / "a.txt"
    a.write_text("  Hello World  \n\n\t Tabbed Line\t\nMiXeD case 123\n   \nlast")
    b = tmp_path / "b.txt"
    b.write_text("second file\n")
    return a, b


def test_help():
    with open(TOOL) as f:
        assert f.readline().rstrip("\n") == "#!/bin/bash"
    for args in (["--help"], ["-h"], ["-u", "-h", "/nonexistent"]):
        res = run(*args)
        assert res.returncode == 0, (args, res.stderr)
        assert res.stdout.splitlines()[0] == USAGE
        for opt in ("-u", "-l", "-t", "-s", "-n", "-w", "-p", "-o", "-h"):
            assert opt in res.stdout, opt


def test_plain_passthrough_and_stdin(files):
    a, b = files
    res = run(str(a), "-", str(b), stdin="from stdin\nno newline")
    assert res.returncode == 0, res.stderr
    assert res.stdout == ("  Hello World  \n\n\t Tabbed Line\t\nMiXeD case 123\n   \nlast\n"
                          "from stdin\nno newline\nsecond file\n")


def test_trim_skip_and_case(files):
    a, b = files
    res = run("-t", "-s", "-u", str(a), str(b))
    assert res.returncode == 0, res.stderr
    assert res.stdout == "HELLO WORLD\nTABBED LINE\nMIXED CASE 123\nLAST\nSECOND FILE\n"
    res = run("-l", "-s", str(a))
    assert res.returncode == 0, res.stderr
    assert res.stdout == "  hello world  \n\t tabbed line\t\nmixed case 123\nlast\n"


def test_processing_order_width_prefix_number(files):
    a, b = files
    res = run("-n", "-p", "> ", "-w", "3", "-s", str(a), str(b))
    assert res.returncode == 0, res.stderr
    assert res.stdout == "1: >   H\n2: > \t T\n3: > MiX\n4: > las\n5: > sec\n"
    res = run("-n", str(b), str(b))
    assert res.stdout == "1: second file\n2: second file\n"


def test_grouped_flags_attached_values_and_repeats(files):
    a, _ = files
    res = run("-tsn", "-w10", "-p# %s \\n", "-w", "4", "-p", "[", str(a))
    assert res.returncode == 0, res.stderr
    assert res.stdout == "1: [Hell\n2: [Tabb\n3: [MiXe\n4: [last\n"
    res = run("-tsp%d\\t", str(a))
    assert res.returncode == 0, res.stderr
    assert res.stdout.splitlines()[0] == "%d\\tHello World"


def test_output_file(files, tmp_path):
    a, _ = files
    out = tmp_path / "out.txt"
    out.write_text("old\nstuff\nto be replaced\n")
    res = run("-t", "-s", "-o", str(out), str(a))
    assert res.returncode == 0, res.stderr
    assert res.stdout == ""
    assert out.read_text() == "Hello World\nTabbed Line\nMiXeD case 123\nlast\n"


def test_double_dash_and_dash_named_file(tmp_path):
    (tmp_path / "-odd.txt").write_text("odd\n")
    res = run("-u", "--", "-odd.txt", cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    assert res.stdout == "ODD\n"


@pytest.mark.parametrize("args,message", [
    (["-x", "F"], "txtool: unknown option: -x"),
    (["-t", "-Q", "F"], "txtool: unknown option: -Q"),
    (["F", "-w"], None),
    (["-w"], "txtool: option requires an argument: -w"),
    (["-s", "-p"], "txtool: option requires an argument: -p"),
    ([], "txtool: no input files"),
    (["-t", "-n"], "txtool: no input files"),
    (["-u", "-l", "F"], "txtool: -u and -l are mutually exclusive"),
    (["-w", "0", "F"], "txtool: invalid width: 0"),
    (["-w", "abc", "F"], "txtool: invalid width: abc"),
    (["-w", "-3", "F"], "txtool: invalid width: -3"),
    (["-w", "007", "F"], "txtool: invalid width: 007"),
])
def test_usage_errors_exit_2(tmp_path, args, message):
    (tmp_path / "F").write_text("data\n")
    res = run(*args, "-o", "out.txt", cwd=tmp_path) if message is None else run(*args, cwd=tmp_path)
    if message is None:  # options after a file are files: "-w" and "-o" are then unreadable files
        assert res.returncode == 3 and res.stdout == ""
        assert "txtool: cannot read: -w" in res.stderr
        return
    assert res.returncode == 2, res.stderr
    assert res.stdout == ""
    assert message in res.stderr


def test_unreadable_file_exit_3(files, tmp_path):
    a, _ = files
    out = tmp_path / "never.txt"
    missing = str(tmp_path / "missing file.txt")
    res = run("-o", str(out), str(a), missing)
    assert res.returncode == 3
    assert f"txtool: cannot read: {missing}" in res.stderr
    assert not out.exists(), "no OUTFILE may be created on errors"
    res = run(str(a), missing)
    assert res.returncode == 3 and res.stdout == "", "no output before all files are checked"
