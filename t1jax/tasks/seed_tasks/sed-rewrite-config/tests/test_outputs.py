import os

CONF = "/app/conf/server.ini"
ORIG = "/app/conf/server.ini.orig"
ORIGINAL = (
    "; Main server configuration\n; Managed by ops -- edit with care\n\n"
    "[server]\nhost = 0.0.0.0\nport = 8080\n# port = 80 (old value, keep this comment)\n"
    "workers = 4  \ndebug = true\n\n"
    "[database]\nhost = localhost\nport = 5432\nname = appdb\nuser = app\ndebug=false\n\n"
    "[cache]\nhost = localhost\nport = 6379\nttl = 300\n\n"
    "[logging]\nlevel = info\nfile = /var/log/app.log\n  debug = yes\ndebug_sql = false\ndebugger = off\n"
)
EXPECTED = (
    "; Main server configuration\n; Managed by ops -- edit with care\n\n"
    "[server]\nhost = 0.0.0.0\nport = 8443\n# port = 80 (old value, keep this comment)\n"
    "workers = 4  \n; debug = true\n\n"
    "[database]\nhost = db.internal\nport = 5432\nname = appdb\nuser = app\n; debug=false\n\n"
    "[cache]\nhost = localhost\nport = 6379\nttl = 300\n\n"
    "[logging]\nlevel = info\nfile = /var/log/app.log\n;   debug = yes\ndebug_sql = false\ndebugger = off\n"
    "\n[tls]\ncert = /etc/ssl/server.pem\nkey = /etc/ssl/server.key\n"
)


def text():
    with open(CONF, "rb") as f:
        return f.read().decode()


def section(name):
    out, cur = [], None
    for line in text().split("\n"):
        if line.startswith("["):
            cur = line
            continue
        if cur == f"[{name}]":
            out.append(line)
    return out


def test_backup_is_original():
    assert os.path.isfile(ORIG), "missing " + ORIG
    with open(ORIG, "rb") as f:
        assert f.read().decode() == ORIGINAL


def test_server_port_changed():
    lines = section("server")
    assert "port = 8443" in lines and "port = 8080" not in lines
    assert "# port = 80 (old value, keep this comment)" in lines
    assert "port = 5432" in section("database") and "port = 6379" in section("cache")


def test_database_host_only():
    assert "host = db.internal" in section("database")
    assert "host = localhost" in section("cache")
    assert "host = 0.0.0.0" in section("server")


def test_debug_keys_commented():
    lines = text().split("\n")
    assert "; debug = true" in lines and "; debug=false" in lines and ";   debug = yes" in lines
    assert "debug_sql = false" in lines and "debugger = off" in lines
    assert not [l for l in lines if l.strip().replace(" ", "").startswith("debug=")]


def test_tls_section_appended():
    assert text().endswith("\n\n[tls]\ncert = /etc/ssl/server.pem\nkey = /etc/ssl/server.key\n")


def test_whole_file_exact():
    assert text() == EXPECTED
