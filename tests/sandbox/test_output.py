"""Bounded head+tail capture and output cleaning (no sandbox needed)."""

from t1jax.sandbox.output import HeadTailBuffer, clean_output


def test_small_output_is_kept_whole():
    buf = HeadTailBuffer(100)
    buf.write(b"hello ")
    buf.write(b"world")
    assert buf.getvalue() == b"hello world" and not buf.truncated and buf.total == 11


def test_large_output_keeps_head_and_tail_in_bounded_memory():
    buf = HeadTailBuffer(1000)
    data = b"".join(b"%08d\n" % i for i in range(200_000))
    for i in range(0, len(data), 4096):
        buf.write(data[i:i + 4096])
        assert len(buf._tail) <= 2 * 500 + 4096  # memory stays bounded while streaming
    out = buf.getvalue()
    assert buf.truncated and buf.total == len(data)
    assert out.startswith(data[:500]) and out.endswith(data[-500:])
    omitted = len(data) - 1000
    assert f"[... output truncated: {omitted} bytes omitted ...]".encode() in out


def test_exact_cap_is_not_truncated():
    buf = HeadTailBuffer(10)
    buf.write(b"0123456789")
    assert not buf.truncated and buf.getvalue() == b"0123456789"


def test_clean_output_is_consistent():
    assert clean_output(b"\x1b[1;31mred\x1b[0m plain") == "red plain"
    assert clean_output(b"a\r\nb\r\n") == "a\nb\n"
    assert clean_output(b"10%\r50%\r100%\ndone\n") == "100%\ndone\n"
    assert clean_output(b"partial\r") == "partial"
    assert clean_output(b"\xff\xfeok") == "\ufffd\ufffdok"
    assert clean_output(b"\x1b]0;title\x07text") == "text"
