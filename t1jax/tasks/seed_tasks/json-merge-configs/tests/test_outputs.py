import hashlib
import json
import os

CONF = "/app/config"
MERGED = "/app/out/merged.json"
PROV = "/app/out/provenance.txt"
CONFIG_SHA256 = {
    "00-base.json": "807fafa1f3f865976b1f41c933107f7924512b4bb2c41ca5b099a0e5586a883e",
    "10-region.json": "212982694ab135fad5dfbcaa200a8af9f32ab17f0dbe7f3e3fad51b905f36c41",
    "20-production.json": "7c52638d43afeb8059e9acbad61b655eadad6e9887fb6c99ee1c1040e307270e",
    "99-local.json": "85574dcd236608b31e14db79b4efca4502d135692f19060a48fab7bf0f6bf90b",
    "50-experimental.json.disabled": "b489be6d71eb4af32b843f5e581849b8db73ad3ca07cc28a0f48c2f6a458c400",
    "README.md": "97497f4a5d7f5ac8d45f0e333d514d44f57f7ddfc389f7cfc3cf04ffb3e9a781",
    "archive/30-old.json": "96dd6a94adac3b9187ac539d4c560b0602f0dab6f18e5532405778388ad1fc71",
}


def _layers():
    names = sorted(n for n in os.listdir(CONF)
                   if n.endswith(".json") and os.path.isfile(os.path.join(CONF, n)))
    out = []
    for n in names:
        with open(os.path.join(CONF, n)) as f:
            out.append((n, json.load(f)))
    return out


def _clean(v):
    if isinstance(v, dict):
        return {k: _clean(x) for k, x in v.items() if not k.startswith("#")}
    return v


def _merge(cur, new):
    for k, v in new.items():
        if v is None:
            cur.pop(k, None)
        elif isinstance(v, dict):
            if not isinstance(cur.get(k), dict):
                cur[k] = {}
            _merge(cur[k], v)
        else:
            cur[k] = v
    return cur


def _expected():
    result = {}
    for _, data in _layers():
        _merge(result, _clean(data))
    return result


def _leaf_paths(v, path=()):
    if isinstance(v, dict):
        for k, x in v.items():
            yield from _leaf_paths(x, path + (k,))
    else:
        yield path


def _get(doc, path):
    for k in path:
        if not isinstance(doc, dict) or k not in doc:
            return None
        doc = doc[k]
    return doc


def _expected_provenance():
    layers = [(n, _clean(d)) for n, d in _layers()]
    prov = {}
    for path in _leaf_paths(_expected()):
        setters = [n for n, d in layers
                   if _get(d, path) is not None and not isinstance(_get(d, path), dict)]
        prov[".".join(path)] = setters[-1]
    return prov


def _merged():
    assert os.path.isfile(MERGED), "missing /app/out/merged.json"
    with open(MERGED) as f:
        return json.load(f)


def _walk_keys(v):
    if isinstance(v, dict):
        for k, x in v.items():
            yield k
            yield from _walk_keys(x)
    elif isinstance(v, list):
        for x in v:
            yield from _walk_keys(x)


def test_merged_document():
    got = _merged()
    assert got == _expected()
    # spot checks of precedence
    assert got["server"]["port"] == 443 and got["server"]["workers"] == 8
    assert got["server"]["timeouts"] == {"read": 45, "write": 15}
    assert got["database"]["pool"] == {"min": 1, "max": 20}
    assert got["app"]["features"] == ["search", "export", "audit"]


def test_null_deletes_keys():
    got = _merged()
    assert "format" not in got["logging"]
    assert "idle" not in got["server"]["timeouts"]
    assert "connect_timeout" not in got["database"]["options"]
    assert "legacy_endpoint" not in got["metrics"]
    assert "null" not in open(MERGED).read()


def test_comment_keys_dropped():
    got = _merged()
    keys = list(_walk_keys(got))
    assert keys and not [k for k in keys if k.startswith("#")]
    assert got["feature_flags"] == {"new_ui": True, "beta_reports": False}


def test_ignored_files_not_applied():
    got = _merged()
    assert "experimental" not in got and "legacy" not in got
    assert got["database"]["host"] == "db.eu-west.internal"
    assert got["region"] == {"name": "eu-west", "zones": ["a", "b", "c"]}


def test_formatting_sorted_and_indented():
    text = open(MERGED).read()
    assert text.endswith("\n")

    def check_sorted(pairs):
        keys = [k for k, _ in pairs]
        assert keys == sorted(keys), f"keys not sorted: {keys}"
        return dict(pairs)

    json.loads(text, object_pairs_hook=check_sorted)
    lines = text.splitlines()
    assert lines[0] == "{" and lines[-1] == "}"
    assert lines[1].startswith('  "') and not lines[1].startswith('   ')
    nested = [l for l in lines if l.startswith('      "read": 45')]
    assert nested, "expected 2-space indentation per nesting level"


def test_provenance():
    assert os.path.isfile(PROV), "missing /app/out/provenance.txt"
    lines = [l for l in open(PROV).read().splitlines() if l.strip()]
    expected = _expected_provenance()
    got = {}
    for l in lines:
        path, _, src = l.partition(" ")
        got[path] = src.strip()
    assert got == expected
    paths = [l.split(" ")[0] for l in lines]
    assert paths == sorted(paths, key=lambda s: s.encode())
    assert got["server.timeouts.write"] == "99-local.json"
    assert got["region.name"] == "10-region.json"


def test_invariant_config_unchanged():
    for rel, digest in CONFIG_SHA256.items():
        with open(os.path.join(CONF, rel), "rb") as f:
            assert hashlib.sha256(f.read()).hexdigest() == digest, rel
