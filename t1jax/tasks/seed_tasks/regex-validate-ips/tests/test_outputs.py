import hashlib
import ipaddress
import os
import random
import re
import subprocess

SCRIPT = "/app/classify_ips.sh"
INPUT = "/app/input/addresses.txt"
OUT = "/app/out"
INPUT_SHA256 = "47423769afdb69a77d48e4df32777293afb2ac229158fd2ba96f424cff30f3d1"


def classify(s):
    if re.fullmatch(r"[0-9.]+", s):
        try:
            ipaddress.IPv4Address(s)
            return "ipv4"
        except ValueError:
            return "invalid"
    if re.fullmatch(r"[0-9A-Fa-f:]+", s):
        try:
            ipaddress.IPv6Address(s)
            return "ipv6"
        except ValueError:
            return "invalid"
    return "invalid"


def expected(path):
    with open(path, "rb") as f:
        lines = f.read().decode().split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    res = {"ipv4": [], "ipv6": [], "invalid": []}
    for l in lines:
        if l != "":
            res[classify(l)].append(l)
    return res


def read_out(d, name):
    with open(os.path.join(d, name), "rb") as f:
        data = f.read().decode()
    assert data == "" or data.endswith("\n"), name
    return data.split("\n")[:-1] if data else []


def check_dir(inp, outdir):
    exp = expected(inp)
    for cls in ("ipv4", "ipv6", "invalid"):
        assert read_out(outdir, f"{cls}.txt") == exp[cls], cls
    with open(os.path.join(outdir, "summary.txt")) as f:
        assert f.read().strip() == (f"ipv4={len(exp['ipv4'])} ipv6={len(exp['ipv6'])} "
                                    f"invalid={len(exp['invalid'])}")


def test_provided_ipv4():
    exp = expected(INPUT)
    assert read_out(OUT, "ipv4.txt") == exp["ipv4"]
    assert "0.0.0.0" in exp["ipv4"] and "01.2.3.4" not in exp["ipv4"]


def test_provided_ipv6():
    exp = expected(INPUT)
    assert read_out(OUT, "ipv6.txt") == exp["ipv6"]
    assert "1:2:3:4:5:6:7::" in exp["ipv6"] and "1:2:3:4:5:6:7::8" not in exp["ipv6"]


def test_provided_invalid_and_summary():
    exp = expected(INPUT)
    assert read_out(OUT, "invalid.txt") == exp["invalid"]
    assert "1.2.3.4\r" in exp["invalid"] and " 10.0.0.1" in exp["invalid"]
    check_dir(INPUT, OUT)


def test_script_on_fresh_input(tmp_path):
    rng = random.Random(2024)
    cands = ["::", "0:0:0:0:0:0:0:0", "1::", "::ffff:10.0.0.1", "a:b:c:d:e:f:0:1", "A:B::C:D",
             "1:2:3:4:5:6::7", "1:2:3:4:5:6:7:8:9", "fe80::1%1", "255.255.255.256", "7.7.7.07",
             "10.10.10.10", "", "1.1.1.1", "1.1.1.1", "\t1.1.1.1", "abcde::", "::1:2:3:4:5:6:7",
             "1:2::3::4", "2001:DB8:0:0:8:800:200C:417A", "100.0.0.0 ", "0.0.0.0.0"]
    for _ in range(300):
        r = rng.random()
        if r < 0.4:
            cands.append(".".join(rng.choice(["0", "00", "7", "25", "255", "256", "199", "249", "250", "099", "1000"])
                                  for _ in range(rng.choice([3, 4, 4, 4, 5]))))
        else:
            n = rng.choice([2, 5, 7, 8, 8, 9])
            groups = [rng.choice(["0", "ff", "FFFF", "12345", "abc", "g1", "00ab"]) for _ in range(n)]
            if rng.random() < 0.5:
                i = rng.randint(0, n)
                groups.insert(i, "")
                if i in (0, n):
                    groups.insert(i, "")
            cands.append(":".join(groups))
    inp = tmp_path / "input.txt"
    inp.write_bytes(("\n".join(cands) + "\n").encode())
    outdir = tmp_path / "new" / "out"
    res = subprocess.run([SCRIPT, str(inp), str(outdir)], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    check_dir(str(inp), str(outdir))


def test_script_empty_classes(tmp_path):
    inp = tmp_path / "only4.txt"
    inp.write_text("1.2.3.4\n\n5.6.7.8\n")
    res = subprocess.run([SCRIPT, str(inp), str(tmp_path / "o")], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    assert read_out(str(tmp_path / "o"), "ipv4.txt") == ["1.2.3.4", "5.6.7.8"]
    assert read_out(str(tmp_path / "o"), "ipv6.txt") == []
    assert read_out(str(tmp_path / "o"), "invalid.txt") == []
    assert (tmp_path / "o" / "summary.txt").read_text().strip() == "ipv4=2 ipv6=0 invalid=0"


def test_invariant_input_unchanged():
    with open(INPUT, "rb") as f:
        assert hashlib.sha256(f.read()).hexdigest() == INPUT_SHA256
