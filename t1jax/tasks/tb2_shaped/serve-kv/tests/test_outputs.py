import urllib.error
import urllib.request
from pathlib import Path

URL = "http://127.0.0.1:8765"


def _call(method, key, body=None):
    request = urllib.request.Request(f"{URL}/{key}", data=body, method=method)
    try:
        with urllib.request.urlopen(request, timeout=5) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as err:
        return err.code, b""


def test_program_written():
    """The service's program is where the instruction says."""
    assert Path("/app/kv.py").is_file()


def test_put_then_get():
    """A stored value comes back (the service is still running when the tests run)."""
    assert _call("PUT", "colour", b"teal")[0] == 200
    assert _call("GET", "colour") == (200, b"teal")


def test_unknown_key_is_404():
    """A key never stored is not found."""
    assert _call("GET", "never-stored")[0] == 404
