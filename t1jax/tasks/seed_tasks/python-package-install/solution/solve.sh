#!/bin/bash
# Add pyproject.toml (with package data + console script), fix the import, install into a venv.
set -euo pipefail
cd /app/src
cat > pyproject.toml <<'TOML'
[build-system]
requires = ["setuptools>=61", "wheel"]
build-backend = "setuptools.build_meta"

[project]
name = "textkit"
version = "1.4.0"
description = "Tiny text statistics"
readme = "README.md"
requires-python = ">=3.9"

[project.scripts]
textkit-count = "textkit.cli:main"

[tool.setuptools]
packages = ["textkit"]

[tool.setuptools.package-data]
textkit = ["data/*.txt"]
TOML
sed -i 's/^from core import count_text, load_stopwords$/from .core import count_text, load_stopwords/' textkit/cli.py
grep -n "^from .core import" textkit/cli.py
python3 -m venv --system-site-packages /app/venv
/app/venv/bin/pip install --no-build-isolation --no-index /app/src
rm -rf /app/src/build /app/src/*.egg-info
cd /
printf 'The cat and the hat.\nIt is on a mat\n' > /tmp/sample.txt
/app/venv/bin/textkit-count /tmp/sample.txt
/app/venv/bin/textkit-count --ignore-stopwords /tmp/sample.txt
/app/venv/bin/textkit-count --version
rm -f /tmp/sample.txt
