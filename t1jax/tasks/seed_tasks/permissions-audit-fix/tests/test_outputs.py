import hashlib
import os
import stat

AUDIT = "/app/audit.txt"
EXPECTED_AUDIT = [
    "SETUID 4755 /app/srv/bin/backup",
    "SETGID 6777 /app/srv/bin/both",
    "SETUID 6777 /app/srv/bin/both",
    "WORLD_WRITABLE 6777 /app/srv/bin/both",
    "SETGID 2711 /app/srv/bin/mailer",
    "SETUID 4755 /app/srv/bin/ping-helper",
    "SETGID 2755 /app/srv/bin/report",
    "WORLD_WRITABLE 0757 /app/srv/logs",
    "WORLD_WRITABLE 0622 /app/srv/logs/app.log",
    "WORLD_WRITABLE 1777 /app/srv/shared",
    "WORLD_WRITABLE 0777 /app/srv/shared/drop.sh",
    "WORLD_WRITABLE 0777 /app/srv/www/cache",
    "WORLD_WRITABLE 0646 /app/srv/www/cache/page1.html",
    "WORLD_WRITABLE 0666 /app/srv/www/upload.php",
]
# entries the policy changes: path -> mode afterwards
FIXED = {
    "/app/srv/www/upload.php": 0o664, "/app/srv/www/cache/page1.html": 0o644,
    "/app/srv/shared/drop.sh": 0o775, "/app/srv/logs/app.log": 0o620,
    "/app/srv/www/cache": 0o775, "/app/srv/logs": 0o755,
    "/app/srv/bin/backup": 0o755, "/app/srv/bin/report": 0o755, "/app/srv/bin/both": 0o775,
}
# everything else keeps its original mode
UNCHANGED = {
    "/app/srv/bin": 0o755, "/app/srv/bin/mailer": 0o2711, "/app/srv/bin/ping-helper": 0o4755,
    "/app/srv/bin/sticky-tool": 0o1755, "/app/srv/bin/tool": 0o755, "/app/srv/etc": 0o755,
    "/app/srv/etc/allowed_setuid.txt": 0o644, "/app/srv/etc/app.conf": 0o600,
    "/app/srv/logs/error.log": 0o640, "/app/srv/projects": 0o2775, "/app/srv/projects/alpha": 0o755,
    "/app/srv/projects/alpha/plan.md": 0o664, "/app/srv/shared": 0o1777,
    "/app/srv/shared/notes.txt": 0o664, "/app/srv/www": 0o755,
    "/app/srv/www/cache/page2.html": 0o644, "/app/srv/www/index.html": 0o644,
}
LINKS = {"/app/srv/bin/drop": "../shared/drop.sh", "/app/srv/etc/passwd-link": "/etc/passwd"}
CONTENT_SHA256 = "8bc16958475789a1a6ab3ec3b0981b1d09fb4f313b8072f692e074549b333d90"


def _mode(path):
    return stat.S_IMODE(os.lstat(path).st_mode)


def _content_digest():
    h = hashlib.sha256()
    for dirpath, dirnames, filenames in os.walk("/app/srv"):
        dirnames.sort()
        for name in sorted(filenames):
            p = os.path.join(dirpath, name)
            h.update(p.encode() + b"\0")
            if os.path.islink(p):
                h.update(b"L" + os.readlink(p).encode())
            else:
                with open(p, "rb") as f:
                    h.update(hashlib.sha256(f.read()).digest())
    return h.hexdigest()


def test_audit_report():
    assert os.path.isfile(AUDIT), "missing /app/audit.txt"
    with open(AUDIT) as f:
        lines = [l.rstrip() for l in f.read().splitlines() if l.strip()]
    assert lines == EXPECTED_AUDIT


def test_world_writable_files_fixed():
    for p in ["/app/srv/www/upload.php", "/app/srv/www/cache/page1.html",
              "/app/srv/shared/drop.sh", "/app/srv/logs/app.log"]:
        assert _mode(p) == FIXED[p], f"{p}: {_mode(p):04o}"


def test_world_writable_dirs_fixed_sticky_kept():
    for p in ["/app/srv/www/cache", "/app/srv/logs"]:
        assert _mode(p) == FIXED[p], f"{p}: {_mode(p):04o}"
    assert _mode("/app/srv/shared") == 0o1777, "sticky world-writable dir must be left as is"


def test_setid_bits_removed_except_allowlisted():
    for p in ["/app/srv/bin/backup", "/app/srv/bin/report", "/app/srv/bin/both"]:
        assert _mode(p) == FIXED[p], f"{p}: {_mode(p):04o}"
    assert _mode("/app/srv/bin/ping-helper") == 0o4755
    assert _mode("/app/srv/bin/mailer") == 0o2711


def test_no_world_writable_left():
    for dirpath, dirnames, filenames in os.walk("/app/srv"):
        for name in dirnames + filenames:
            p = os.path.join(dirpath, name)
            if os.path.islink(p):
                continue
            m = os.lstat(p).st_mode
            if stat.S_ISDIR(m) and m & stat.S_ISVTX:
                continue
            assert not m & stat.S_IWOTH, p
    assert _mode("/app/srv/bin/both") & 0o6002 == 0


def test_invariant_other_entries_untouched():
    for p, mode in UNCHANGED.items():
        assert _mode(p) == mode, f"{p}: {_mode(p):04o}"
    for p, target in LINKS.items():
        assert os.path.islink(p) and os.readlink(p) == target, p
    assert _content_digest() == CONTENT_SHA256
