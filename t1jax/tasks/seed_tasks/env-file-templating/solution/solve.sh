#!/bin/bash
# A bash wrapper around an embedded Python renderer (regex scan, env file parsed by hand).
set -euo pipefail
cat > /app/render.sh <<'SH'
#!/bin/bash
# render.sh ENV_FILE TEMPLATE [OUTPUT]
if [ $# -lt 2 ] || [ $# -gt 3 ]; then
  echo "usage: render.sh ENV_FILE TEMPLATE [OUTPUT]" >&2
  exit 1
fi
for f in "$1" "$2"; do
  [ -f "$f" ] && [ -r "$f" ] || { echo "render: cannot read $f" >&2; exit 1; }
done
exec python3 - "$@" <<'PY'
import re
import sys

env_file, template = sys.argv[1], sys.argv[2]
output = sys.argv[3] if len(sys.argv) > 3 else None
env = {}
with open(env_file, "rb") as f:
    for raw in f.read().decode("utf-8", "surrogateescape").split("\n"):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        m = re.match(r"(?:export +)?([A-Za-z_][A-Za-z0-9_]*)=(.*)\Z", raw.lstrip(), re.S)
        if not m:
            continue
        key, value = m.group(1), m.group(2)
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "\"'":
            value = value[1:-1]
        env[key] = value
with open(template, "rb") as f:
    text = f.read().decode("utf-8", "surrogateescape")
missing = []


def sub(m):
    if m.group(0) == "\\${":
        return "${"
    name, default = m.group(1), m.group(2)
    if default is not None:
        return env.get(name) or default
    if name not in env:
        if name not in missing:
            missing.append(name)
        return ""
    return env[name]


out = re.sub(r"\\\$\{|\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}", sub, text)
if missing:
    for name in missing:
        print(f"render: missing variable {name}", file=sys.stderr)
    sys.exit(2)
data = out.encode("utf-8", "surrogateescape")
if output:
    with open(output, "wb") as f:
        f.write(data)
else:
    sys.stdout.buffer.write(data)
PY
SH
chmod +x /app/render.sh
mkdir -p /app/rendered
for t in /app/templates/*.tmpl; do
  name=$(basename "$t" .tmpl)
  /app/render.sh /app/config/prod.env "$t" "/app/rendered/$name"
done
cat /app/rendered/*
