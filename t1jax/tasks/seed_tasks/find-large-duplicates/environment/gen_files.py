"""Deterministic tree under /app/data with duplicate files (fixed seed)."""
import os
import random

rng = random.Random(1234)
root = "/app/data"
dirs = ["photos/2023", "photos/2024/summer", "docs", "docs/old copies", "backup/photos",
        "backup/docs", "music", "tmp"]
for d in dirs:
    os.makedirs(os.path.join(root, d), exist_ok=True)


def blob(size):
    return bytes(rng.getrandbits(8) for _ in range(size))


def put(rel, data):
    with open(os.path.join(root, rel), "wb") as f:
        f.write(data)


# unique files
for i in range(30):
    put(f"{rng.choice(dirs)}/file_{i:02d}.bin", blob(rng.randint(1024, 6000)))
# duplicate groups (>= 1024 bytes)
groups = [
    (blob(4096), ["photos/2023/beach.jpg", "backup/photos/beach.jpg", "tmp/beach (copy).jpg"]),
    (blob(4096), ["photos/2024/summer/lake.jpg", "backup/photos/lake.jpg"]),   # same size as above
    (blob(1024), ["docs/report.pdf", "docs/old copies/report-final.pdf", "backup/docs/report.pdf",
                  "tmp/report.pdf"]),
    (b"# notes\n" * 300, ["docs/notes.md", "backup/docs/notes.md"]),
    (blob(7777), ["music/track01.ogg", "backup/track01.ogg"]),
]
for data, paths in groups:
    for p in paths:
        put(p, data)
# same size, different content: not duplicates
a = blob(5000)
put("docs/draft-a.txt", a)
put("docs/draft-b.txt", a[:-1] + bytes([a[-1] ^ 1]))
# small duplicates (< 1024 bytes): ignored
small = blob(1023)
put("docs/small1.dat", small)
put("tmp/small2.dat", small)
put("music/empty1", b"")
put("tmp/empty2", b"")
# a symlink to a duplicate: ignored, must stay a symlink
os.symlink("../photos/2023/beach.jpg", os.path.join(root, "tmp/beach-link.jpg"))
