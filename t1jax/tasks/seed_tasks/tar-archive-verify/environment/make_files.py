"""Deterministically create /app/project and /app/incoming (fixed seed)."""
import gzip
import hashlib
import io
import os
import random
import tarfile

rnd = random.Random(8086)


def write(path, data):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        f.write(data if isinstance(data, bytes) else data.encode())


P = "/app/project"
write(f"{P}/README.md", "# project\n\nA small demo project.\n")
write(f"{P}/src/main.py", "print('hello')\n")
write(f"{P}/src/util/strings.py", "def up(s):\n    return s.upper()\n")
write(f"{P}/src/build.txt", "not a build directory: keep me\n")
write(f"{P}/src/logs/keep.txt", "a directory named logs is fine\n")
write(f"{P}/src/changelog.log.md", "ends in .md, keep\n")
write(f"{P}/docs/guide with spaces.md", "Guide.\n")
write(f"{P}/docs/img/logo.bin", bytes(rnd.randrange(256) for _ in range(3000)))
write(f"{P}/data/sample.csv", "a,b\n1,2\n")
write(f"{P}/.env.example", "TOKEN=changeme\n")
# excluded
write(f"{P}/build/output.o", b"\x7fELF" + bytes(200))
write(f"{P}/src/util/build/tmp.o", "object\n")
write(f"{P}/node_modules/left-pad/index.js", "module.exports = 1;\n")
write(f"{P}/docs/node_modules/x.js", "x\n")
write(f"{P}/.git/HEAD", "ref: refs/heads/main\n")
write(f"{P}/.git/objects/ab/cdef", "blob\n")
write(f"{P}/app.log", "log line\n")
write(f"{P}/src/debug.log", "debug\n")
write(f"{P}/data/old/import.log", "import\n")

# incoming releases: release-3 does not match its published checksum
I = "/app/incoming"
os.makedirs(I, exist_ok=True)
sums = []
for n in (1, 2, 3):
    buf = io.BytesIO()
    # gzip's header holds a timestamp: fix it, or every image build gets different archives
    with gzip.GzipFile(fileobj=buf, mode="wb", mtime=0) as gz, \
            tarfile.open(fileobj=gz, mode="w", format=tarfile.GNU_FORMAT) as tar:
        for name, text in [(f"release/VERSION", f"{n}.0.0\n"),
                           (f"release/config/app.conf", f"# release {n}\nport = {8000 + n}\nworkers = {n * 2}\n"),
                           (f"release/config/other.conf", "x = 1\n"),
                           (f"release/bin/run.sh", "#!/bin/sh\necho run\n")]:
            data = text.encode()
            info = tarfile.TarInfo(name)
            info.size, info.mtime, info.mode = len(data), 1700000000 + n, 0o644
            tar.addfile(info, io.BytesIO(data))
    blob = buf.getvalue()
    write(f"{I}/release-{n}.tar.gz", blob)
    digest = hashlib.sha256(blob).hexdigest()
    if n == 3:
        digest = hashlib.sha256(blob + b"published-before-repack").hexdigest()
    sums.append(f"{digest}  release-{n}.tar.gz\n")
write(f"{I}/SHA256SUMS", "".join(sums))
