#!/bin/bash
# Deep-merge /app/config/*.json in name order; write merged.json and provenance.txt.
set -euo pipefail
mkdir -p /app/out
python3 - <<'PY'
import json, os

CONF = "/app/config"
layers = sorted(n for n in os.listdir(CONF)
                if n.endswith(".json") and os.path.isfile(os.path.join(CONF, n)))

def strip(v):
    """Drop '#' keys recursively (objects only; arrays are opaque leaves)."""
    if isinstance(v, dict):
        return {k: strip(x) for k, x in v.items() if not k.startswith("#")}
    return v

def leaves(v, path, src, prov):
    if isinstance(v, dict):
        for k, x in v.items():
            leaves(x, path + [k], src, prov)
    else:
        prov[".".join(path)] = src

def drop_prov(prov, path):
    prefix = ".".join(path)
    for p in [p for p in prov if p == prefix or p.startswith(prefix + ".")]:
        del prov[p]

def merge(cur, new, path, src, prov):
    for k, v in new.items():
        p = path + [k]
        if v is None:
            cur.pop(k, None)
            drop_prov(prov, p)
        elif isinstance(v, dict) and isinstance(cur.get(k), dict):
            merge(cur[k], v, p, src, prov)
        else:
            drop_prov(prov, p)
            if isinstance(v, dict):
                cur[k] = {}
                merge(cur[k], v, p, src, prov)   # also removes nulls inside the new object
            else:
                cur[k] = v
                prov[".".join(p)] = src

result, prov = {}, {}
for name in layers:
    with open(os.path.join(CONF, name)) as f:
        merge(result, strip(json.load(f)), [], name, prov)

with open("/app/out/merged.json", "w") as f:
    json.dump(result, f, indent=2, sort_keys=True)
    f.write("\n")
with open("/app/out/provenance.txt", "w") as f:
    for p in sorted(prov, key=lambda s: s.encode()):
        f.write(f"{p} {prov[p]}\n")
PY
cat /app/out/merged.json /app/out/provenance.txt
