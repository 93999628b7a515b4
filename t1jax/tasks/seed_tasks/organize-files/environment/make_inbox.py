"""Create /app/inbox with a fixed set of files."""
import os

files = {
    "report.TXT": "Quarterly report\n" * 3,
    "notes.txt": "remember the milk\n",
    "meeting notes.txt": "agenda:\n- budget\n- hiring\n",
    "photo.JPG": "\xff\xd8 fake jpeg bytes " * 10,
    "diagram.png": "\x89PNG fake png",
    "data.csv": "a,b\n1,2\n3,4\n",
    "budget.2024.csv": "item,cost\nchairs,300\n",
    "archive.tar.gz": "not really gzip",
    "Makefile": "all:\n\techo hi\n",
    "LICENSE": "MIT License\n",
    "run.sh": "#!/bin/sh\necho run\n",
    "empty.log": "",
}
os.makedirs("/app/inbox", exist_ok=True)
for name, text in files.items():
    with open(os.path.join("/app/inbox", name), "w", encoding="latin-1") as f:
        f.write(text)
