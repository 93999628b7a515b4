import hashlib
import os
import shutil
import subprocess
import time

SITE = "/app/site"
INPUTS_SHA256 = "624982b5884d1e46cbf6b92432072b7957b38cf74e07f93ab7411774199153db"


def _names(site=SITE):
    return sorted(f[:-3] for f in os.listdir(os.path.join(site, "data")) if f.endswith(".md"))


def copy_site(tmp_path):
    assert os.path.isfile(os.path.join(SITE, "Makefile")), "missing /app/site/Makefile"
    dst = tmp_path / "site"
    shutil.copytree(SITE, dst, symlinks=True)
    return dst


def make(site, *args, log=None):
    env = dict(os.environ)
    env.pop("MAKEFLAGS", None)
    if log is not None:
        env["MD2HTML_LOG"] = str(log)
        if log.exists():
            log.unlink()
    res = subprocess.run(["make", *args], cwd=site, env=env, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stdout + res.stderr
    return sorted(os.path.basename(l) for l in log.read_text().split()) if log is not None and log.exists() else []


def settle(site):
    """Make every file's timestamp clearly ordered: inputs old, outputs newer, both in the past."""
    now = time.time()
    for sub in ("data", "templates", "tools"):
        for f in os.listdir(site / sub):
            os.utime(site / sub / f, (now - 20, now - 20))
    if (site / "out").is_dir():
        for f in os.listdir(site / "out"):
            os.utime(site / "out" / f, (now - 10, now - 10))


def touch(path):
    os.utime(path, None)


def expected_outputs(site, tmp_path):
    """Run the tools directly to get the expected pages and index."""
    exp = tmp_path / "expected"
    exp.mkdir(exist_ok=True)
    pages = []
    for n in _names(site):
        subprocess.run(["python3", "tools/md2html.py", f"data/{n}.md", str(exp / f"{n}.html"),
                        "--template", "templates/page.html"], cwd=site, check=True)
        pages.append(str(exp / f"{n}.html"))
    subprocess.run(["python3", "tools/mkindex.py", str(exp / "index.html"), *pages], cwd=site, check=True)
    return {f: (exp / f).read_text() for f in os.listdir(exp)}


def built(site):
    return {f: (site / "out" / f).read_text() for f in os.listdir(site / "out")}


def test_site_built_in_place(tmp_path):
    from pathlib import Path
    site = Path(SITE)
    assert (site / "out").is_dir(), "missing /app/site/out"
    assert built(site) == expected_outputs(site, tmp_path)
    res = subprocess.run(["make", "-q", "all"], cwd=SITE, capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, "/app/site/out is not up to date"


def test_pattern_rule_and_full_build(tmp_path):
    site = copy_site(tmp_path)
    with open(site / "Makefile") as f:
        assert any(l.startswith("out/%.html:") for l in f.read().splitlines()), "no out/%.html: pattern rule"
    make(site, "clean")
    assert not (site / "out").exists()
    ran = make(site, log=tmp_path / "build.log")
    assert ran == sorted([f"{n}.md" for n in _names(site)] + ["INDEX"])
    assert built(site) == expected_outputs(site, tmp_path)


def test_noop_when_up_to_date(tmp_path):
    site = copy_site(tmp_path)
    make(site, "clean")
    make(site)
    settle(site)
    assert make(site, log=tmp_path / "again.log") == []
    assert make(site, "all", log=tmp_path / "again2.log") == []


def test_one_source_changed(tmp_path):
    site = copy_site(tmp_path)
    make(site, "clean")
    make(site)
    settle(site)
    with open(site / "data" / "faq.md", "a") as f:
        f.write("\n## New question\n\nNew answer.\n")
    assert make(site, log=tmp_path / "one.log") == ["INDEX", "faq.md"]
    assert "New answer." in (site / "out" / "faq.html").read_text()


def test_template_and_tool_dependencies(tmp_path):
    site = copy_site(tmp_path)
    make(site, "clean")
    make(site)
    settle(site)
    touch(site / "templates" / "page.html")
    assert make(site, log=tmp_path / "t.log") == sorted([f"{n}.md" for n in _names(site)] + ["INDEX"])
    settle(site)
    touch(site / "tools" / "md2html.py")
    assert make(site, log=tmp_path / "m.log") == sorted([f"{n}.md" for n in _names(site)] + ["INDEX"])
    settle(site)
    touch(site / "tools" / "mkindex.py")
    assert make(site, log=tmp_path / "i.log") == ["INDEX"]


def test_new_page_picked_up(tmp_path):
    site = copy_site(tmp_path)
    make(site, "clean")
    make(site)
    settle(site)
    (site / "data" / "zebra.md").write_text("# Zebra page\n\nStripes.\n")
    assert make(site, log=tmp_path / "new.log") == ["INDEX", "zebra.md"]
    assert 'href="zebra.html">Zebra page<' in (site / "out" / "index.html").read_text()


def test_parallel_build(tmp_path):
    site = copy_site(tmp_path)
    make(site, "clean")
    for extra in ("a", "b", "c", "d"):
        (site / "data" / f"extra-{extra}.md").write_text(f"# Extra {extra}\n\nText.\n")
    make(site, "-j4")
    assert built(site) == expected_outputs(site, tmp_path)


def test_clean(tmp_path):
    site = copy_site(tmp_path)
    make(site)
    assert (site / "out").is_dir()
    make(site, "clean")
    assert not (site / "out").exists()
    make(site, "clean")
    assert sorted(os.listdir(site / "data")) == [f"{n}.md" for n in _names(site)]


def _digest():
    h = hashlib.sha256()
    for sub in ("data", "templates", "tools"):
        for name in sorted(os.listdir(os.path.join(SITE, sub))):
            with open(os.path.join(SITE, sub, name), "rb") as f:
                h.update(f"{sub}/{name}".encode() + b"\0" + f.read())
    return h.hexdigest()


def test_invariant_inputs_unchanged():
    assert _digest() == INPUTS_SHA256
