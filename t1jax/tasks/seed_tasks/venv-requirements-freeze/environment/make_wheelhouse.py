"""Write the sources of a few tiny packages, then build them into /app/wheels (offline)."""
import os
import subprocess
import textwrap

ROOT = "/tmp/pkgsrc"
OUT = "/app/wheels"
os.makedirs(OUT, exist_ok=True)

PACKAGES = [
    # (dist name, version, module source, install_requires, kind)
    ("tinyfmt", "0.2.0", 'def box(s):\n    return "[" + s + "]"\n', [], "wheel"),
    ("tinyfmt", "0.3.1", 'def box(s, left="[", right="]"):\n    return left + s + right\n', [], "wheel"),
    ("tinyfmt", "0.4.0", 'def box(s, left="<", right=">"):\n    return left + s + right\n', [], "wheel"),
    ("colorlite", "0.9.0", 'def paint(s, color):\n    return color + ":" + s\n', ["tinyfmt"], "wheel"),
    ("colorlite", "1.0.2",
     'import tinyfmt\n\nCODES = {"red": 31, "green": 32, "blue": 34}\n\n\n'
     'def paint(s, color):\n    return "\\x1b[%dm%s\\x1b[0m" % (CODES[color], tinyfmt.box(s, "(", ")"))\n',
     ["tinyfmt>=0.3,<0.4"], "wheel"),
    ("slugify_lite", "2.1.0",
     'import re\n\n\ndef slugify(s):\n    return re.sub(r"[^a-z0-9]+", "-", s.lower()).strip("-")\n', [], "sdist"),
    ("slugify_lite", "2.2.0b1", 'def slugify(s):\n    raise NotImplementedError("beta")\n', [], "wheel"),
]

for name, version, code, requires, kind in PACKAGES:
    src = os.path.join(ROOT, f"{name}-{version}")
    module = name
    os.makedirs(os.path.join(src, module), exist_ok=True)
    with open(os.path.join(src, module, "__init__.py"), "w") as f:
        f.write(f'__version__ = "{version}"\n\n' + code)
    with open(os.path.join(src, "setup.py"), "w") as f:
        f.write(textwrap.dedent(f"""\
            from setuptools import setup
            setup(name={name!r}, version={version!r}, packages=[{module!r}],
                  install_requires={requires!r}, python_requires=">=3.8")
            """))
    if kind == "wheel":
        subprocess.run(["python3", "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
                        "--no-index", "-q", "-w", OUT, src], check=True)
    else:
        subprocess.run(["python3", "setup.py", "-q", "sdist", "-d", OUT], cwd=src, check=True)
