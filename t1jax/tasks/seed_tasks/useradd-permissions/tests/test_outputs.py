import grp
import hashlib
import os
import pwd
import stat
import subprocess

import pytest

USERS = {
    "alice": (3101, 3000, "/home/alice", "/bin/bash", "Alice Admin"),
    "bob": (3102, 3000, "/home/bob", "/bin/bash", "Bob Builder"),
    "deploy": (3200, 3001, "/srv/deploy", "/usr/sbin/nologin", "Deploy Bot"),
}
LEGACY_SHA256 = {
    "README": "78a4889abe09ed6feb616dbbeaaedb2d1a5275bdd34abed36f140f48120e3267",
    "data/values.csv": "c15097c46e6dbfe67d8106c18b850ff4312898c146771669ae50324f910ed93c",
    "reports/2023/q4.txt": "4c694ad7a5ea27610e73d5dca732d67b51100682543877a8a882584667371a9d",
    "reports/summary.md": "264f1497580860d4381e24d976a63c1dd8965bc48eb729864cd484e9aa0eecc0",
    "scripts/cleanup.sh": "057dd767f91e20e18f67101f492ebbe03d500fc2a2466167e33301178518dfeb",
    "scripts/sync.sh": "62a7eaa165e5026c06f6687d1ed9a4c9f0460a635f6b6ea05da1b5ddce42bf30",
}


def as_user(name, code):
    """Run python code as `name` with its real primary and supplementary groups."""
    pw = pwd.getpwnam(name)
    groups = os.getgrouplist(name, pw.pw_gid)
    return subprocess.run(["python3", "-c", code], user=pw.pw_uid, group=pw.pw_gid,
                          extra_groups=groups, cwd="/", capture_output=True, text=True, timeout=30)


def mode_owner(path):
    st = os.lstat(path)
    return (stat.S_IMODE(st.st_mode), pwd.getpwuid(st.st_uid).pw_name, grp.getgrgid(st.st_gid).gr_name)


def test_groups():
    assert grp.getgrnam("devs").gr_gid == 3000
    assert grp.getgrnam("ops").gr_gid == 3001
    assert "alice" in grp.getgrnam("ops").gr_mem
    for name in ("alice", "bob", "deploy"):
        with pytest.raises(KeyError):
            grp.getgrnam(name)


def test_users_passwd_entries():
    for name, (uid, gid, home, shell, gecos) in USERS.items():
        pw = pwd.getpwnam(name)
        assert (pw.pw_uid, pw.pw_gid, pw.pw_dir, pw.pw_shell) == (uid, gid, home, shell), name
        assert pw.pw_gecos.split(",")[0] == gecos, name


def test_supplementary_groups():
    assert set(os.getgrouplist("alice", 3000)) == {3000, 3001}
    assert set(os.getgrouplist("bob", 3000)) == {3000}
    assert set(os.getgrouplist("deploy", 3001)) == {3001}


def test_home_directories():
    for name, (uid, gid, home, _, _) in USERS.items():
        st = os.stat(home)
        assert stat.S_ISDIR(st.st_mode), home
        assert (st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode)) == (uid, gid, 0o750), home


def test_deploy_locked():
    with open("/etc/shadow") as f:
        entries = {l.split(":")[0]: l.split(":")[1] for l in f if l.strip()}
    assert entries["deploy"].startswith("!")


def test_project_tree_modes():
    expected = {
        "/srv/project": (0o2775, "root", "devs"),
        "/srv/project/shared": (0o2770, "root", "devs"),
        "/srv/project/drop": (0o3770, "root", "devs"),
        "/srv/project/releases": (0o2755, "deploy", "ops"),
        "/srv/project/secrets.env": (0o640, "deploy", "ops"),
    }
    for path, want in expected.items():
        assert mode_owner(path) == want, path


def test_shared_dir_group_inheritance():
    res = as_user("alice", "import os; open('/srv/project/shared/a.txt', 'w').write('x'); "
                           "os.mkdir('/srv/project/shared/sub')")
    assert res.returncode == 0, res.stderr
    st = os.stat("/srv/project/shared/a.txt")
    assert grp.getgrgid(st.st_gid).gr_name == "devs"
    assert pwd.getpwuid(st.st_uid).pw_name == "alice"
    sub = os.stat("/srv/project/shared/sub")
    assert grp.getgrgid(sub.st_gid).gr_name == "devs" and sub.st_mode & stat.S_ISGID
    res = as_user("deploy", "open('/srv/project/shared/d.txt', 'w')")
    assert res.returncode != 0, "deploy (not in devs) must not write to shared/"


def test_drop_dir_sticky():
    assert as_user("alice", "open('/srv/project/drop/alice.txt', 'w').write('a')").returncode == 0
    assert as_user("bob", "open('/srv/project/drop/bob.txt', 'w').write('b')").returncode == 0
    res = as_user("bob", "import os; os.remove('/srv/project/drop/alice.txt')")
    assert res.returncode != 0 and "PermissionError" in res.stderr
    assert os.path.exists("/srv/project/drop/alice.txt")
    assert as_user("alice", "import os; os.remove('/srv/project/drop/alice.txt')").returncode == 0


def test_secrets_and_releases_access():
    read = "print(open('/srv/project/secrets.env').read())"
    assert "API_KEY" in as_user("alice", read).stdout
    assert "API_KEY" in as_user("deploy", read).stdout
    res = as_user("bob", read)
    assert res.returncode != 0 and "PermissionError" in res.stderr
    assert as_user("deploy", "open('/srv/project/releases/v1.txt', 'w')").returncode == 0
    assert as_user("alice", "open('/srv/project/releases/v2.txt', 'w')").returncode != 0
    assert as_user("bob", "import os; print(os.listdir('/srv/project/releases'))").returncode == 0


def test_legacy_tree_ownership_and_modes():
    seen = 0
    for d, dirs, files in os.walk("/srv/legacy"):
        assert mode_owner(d) == (0o2770, "bob", "devs"), d
        for f in files:
            p = os.path.join(d, f)
            want = 0o770 if f.endswith(".sh") else 0o660
            assert mode_owner(p) == (want, "bob", "devs"), p
            seen += 1
    assert seen == len(LEGACY_SHA256)


def test_invariant_legacy_contents():
    for rel, digest in LEGACY_SHA256.items():
        with open(os.path.join("/srv/legacy", rel), "rb") as f:
            assert hashlib.sha256(f.read()).hexdigest() == digest, rel
