import collections
import hashlib
import os

LOG = "/app/app.log"
OUT = "/app/tracebacks"
LOG_SHA256 = "29c1830d1d55bc5f4608717acab134dcf8d86537958ae2bbf2b137a7f0ed9045"
HEADER = "Traceback (most recent call last):"


def _blocks():
    """Reference parser: list of (type, [lines]) in log order."""
    with open(LOG) as f:
        lines = f.read().split("\n")
    blocks, cur = [], None
    for line in lines:
        if cur is not None:
            cur.append(line)
            if not line.startswith(" "):
                blocks.append((line.split(":", 1)[0], cur))
                cur = None
        elif line == HEADER:
            cur = [line]
    return blocks


def _expected_files():
    by_type = collections.defaultdict(list)
    for t, lines in _blocks():
        by_type[t].append("\n".join(lines) + "\n")
    return {f"{t}.txt": "\n".join(bs) for t, bs in by_type.items()}


def _read(name):
    path = os.path.join(OUT, name)
    assert os.path.isfile(path), f"missing {path}"
    with open(path) as f:
        return f.read()


def test_one_file_per_exception_type():
    assert os.path.isdir(OUT), "missing /app/tracebacks/"
    expected = set(_expected_files()) | {"counts.txt"}
    assert set(os.listdir(OUT)) == expected


def test_block_contents_exact():
    for name, content in _expected_files().items():
        assert _read(name) == content, name


def test_dotted_and_bare_exception_types():
    files = _expected_files()
    assert "json.decoder.JSONDecodeError.txt" in files and "TimeoutError.txt" in files
    assert _read("json.decoder.JSONDecodeError.txt") == files["json.decoder.JSONDecodeError.txt"]
    assert _read("TimeoutError.txt") == files["TimeoutError.txt"]
    assert _read("app.errors.QuotaExceeded.txt") == files["app.errors.QuotaExceeded.txt"]


def test_chained_exceptions_and_info_continuations():
    text = "".join(_read(n) for n in _expected_files())
    assert "During handling of the above exception" not in text
    assert "max_workers" not in text and "just a config comment" not in text
    assert text.count(HEADER) == len(_blocks())


def test_counts_file():
    counts = collections.Counter(t for t, _ in _blocks())
    ranked = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0].encode()))
    expected = [f"{c} {t}" for t, c in ranked]
    assert _read("counts.txt").splitlines() == expected


def test_invariant_log_unchanged():
    with open(LOG, "rb") as f:
        assert hashlib.sha256(f.read()).hexdigest() == LOG_SHA256
