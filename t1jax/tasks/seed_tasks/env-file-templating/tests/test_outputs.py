import hashlib
import os
import re
import subprocess

import pytest

SCRIPT = "/app/render.sh"
INPUTS_SHA256 = "1ed1440137a68c23bbe38eb71d7de68a99d3b5e20e5ccc7e00a0bdcbfd51d2c4"


def ref_render(env_text, template):
    """Reference implementation of the instruction's rules; returns (text, missing names)."""
    env = {}
    for raw in env_text.split("\n"):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        m = re.match(r"(?:export +)?([A-Za-z_][A-Za-z0-9_]*)=(.*)\Z", raw.lstrip(), re.S)
        key, value = m.group(1), m.group(2)
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "\"'":
            value = value[1:-1]
        env[key] = value
    missing = []

    def sub(m):
        if m.group(0) == "\\${":
            return "${"
        name, default = m.group(1), m.group(2)
        if default is not None:
            return env.get(name) or default
        if name not in env:
            missing.append(name)
            return ""
        return env[name]

    out = re.sub(r"\\\$\{|\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}", sub, template)
    return out, missing


def run(tmp_path, env_text, template, *extra, use_output=False, environ=None):
    (tmp_path / "t.env").write_text(env_text)
    (tmp_path / "t.tmpl").write_text(template)
    args = [SCRIPT, str(tmp_path / "t.env"), str(tmp_path / "t.tmpl"), *extra]
    if use_output:
        args.append(str(tmp_path / "out.txt"))
    env = dict(os.environ, **(environ or {}))
    return subprocess.run(args, capture_output=True, text=True, timeout=30, env=env, cwd=tmp_path)


def _digest():
    h = hashlib.sha256()
    for d in ("/app/config", "/app/templates"):
        for name in sorted(os.listdir(d)):
            with open(os.path.join(d, name), "rb") as f:
                h.update(name.encode() + b"\0" + f.read())
    return h.hexdigest()


def test_rendered_production_files():
    with open("/app/config/prod.env") as f:
        env_text = f.read()
    for name in ("nginx.conf", "app.ini"):
        path = f"/app/rendered/{name}"
        assert os.path.isfile(path), f"missing {path}"
        with open(f"/app/templates/{name}.tmpl") as f:
            expected, missing = ref_render(env_text, f.read())
        assert not missing
        with open(path) as f:
            assert f.read() == expected, name


def test_basic_substitution_stdout_and_output_file(tmp_path):
    assert os.access(SCRIPT, os.X_OK), "/app/render.sh must be executable"
    env_text = "A=1\nB=two words\n"
    tmpl = "a=${A}; b=${B}; again ${A}${A}\nno newline at end"
    res = run(tmp_path, env_text, tmpl)
    assert res.returncode == 0, res.stderr
    assert res.stdout == "a=1; b=two words; again 11\nno newline at end"
    res = run(tmp_path, env_text, tmpl, use_output=True)
    assert res.returncode == 0 and res.stdout == ""
    assert (tmp_path / "out.txt").read_text() == "a=1; b=two words; again 11\nno newline at end"


def test_env_file_syntax(tmp_path):
    env_text = ("# comment\n\n   \n  # indented comment\nexport   X=exported\nQ1=\"double quoted\"\n"
                "Q2='single quoted'\nQ3=\"mismatched'\nHASH=a#b # c\nDUP=first\nDUP=second\n"
                "EQ=a=b=c\nEMPTY=\nREF=${X}\n")
    tmpl = "${X}|${Q1}|${Q2}|${Q3}|${HASH}|${DUP}|${EQ}|[${EMPTY}]|${REF}\n"
    res = run(tmp_path, env_text, tmpl)
    assert res.returncode == 0, res.stderr
    assert res.stdout == ("exported|double quoted|single quoted|\"mismatched'|a#b # c|second|a=b=c|[]|${X}\n")
    assert res.stdout == ref_render(env_text, tmpl)[0]


def test_defaults_and_escapes(tmp_path):
    env_text = "SET=yes\nEMPTY=\n"
    tmpl = ("${SET:-no} ${UNSET:-fallback value} ${EMPTY:-was empty} [${UNSET:-}] "
            "\\${SET} \\${UNSET} $SET $ ${1BAD} ${ SET } \\n \\\\${SET}\n")
    res = run(tmp_path, env_text, tmpl)
    assert res.returncode == 0, res.stderr
    assert res.stdout == ("yes fallback value was empty [] ${SET} ${UNSET} $SET $ ${1BAD} ${ SET } "
                          "\\n \\${SET}\n")


def test_special_characters_in_values(tmp_path):
    env_text = "V=a&b/c\\d|e$f*g.h[i]\\1 ${NOPE} %s\n"
    res = run(tmp_path, env_text, "<${V}>\n")
    assert res.returncode == 0, res.stderr
    assert res.stdout == "<a&b/c\\d|e$f*g.h[i]\\1 ${NOPE} %s>\n"


def test_missing_variable_exit_2(tmp_path):
    (tmp_path / "out.txt").write_text("old content\n")
    res = run(tmp_path, "A=1\n", "${A} ${MISSING_ONE} ${A:-x} ${MISSING_TWO} ${MISSING_ONE}\n",
              use_output=True)
    assert res.returncode == 2
    assert res.stdout == ""
    assert "render: missing variable MISSING_ONE" in res.stderr
    assert "render: missing variable MISSING_TWO" in res.stderr
    assert (tmp_path / "out.txt").read_text() == "old content\n"
    res = run(tmp_path, "A=1\n", "${A} ${MISSING_ONE}\n", "out2.txt")
    assert res.returncode == 2 and not (tmp_path / "out2.txt").exists()


def test_process_environment_ignored(tmp_path):
    res = run(tmp_path, "A=1\n", "${A} ${HOME} ${FROM_CALLER}\n", environ={"FROM_CALLER": "leak"})
    assert res.returncode == 2, "variables of the calling environment must not be used"
    assert "render: missing variable HOME" in res.stderr
    assert "render: missing variable FROM_CALLER" in res.stderr and res.stdout == ""


def test_usage_errors_exit_1(tmp_path):
    assert os.access(SCRIPT, os.X_OK), "/app/render.sh must be executable"
    res = subprocess.run([SCRIPT], capture_output=True, text=True, timeout=30)
    assert res.returncode == 1
    res = subprocess.run([SCRIPT, str(tmp_path / "nope.env"), str(tmp_path / "nope.tmpl")],
                         capture_output=True, text=True, timeout=30)
    assert res.returncode == 1 and res.stderr.strip()


def test_invariant_inputs_unchanged():
    assert _digest() == INPUTS_SHA256
