"""t1jax.metrics_log: the JSONL rows, TensorBoard events read back from the event files,
truncation on resume (one row per step after a kill and resume), and non-finite values."""

import json
import math
import struct

import jax.numpy as jnp
import numpy as np
import pytest
from tensorboardX.proto import event_pb2

from t1jax.metrics_log import MetricWriter, read_metrics


def read_events(workdir) -> list:
    """Every Event in workdir/tensorboard/*, in file then record order. Parses the TFRecord
    framing (u64 length, u32 crc, payload, u32 crc) so no TensorFlow/tensorboard is needed."""
    events = []
    for path in sorted((workdir / "tensorboard").glob("events.out.tfevents.*")):
        data = path.read_bytes()
        offset = 0
        while offset < len(data):
            (length,) = struct.unpack_from("<Q", data, offset)
            payload = data[offset + 12: offset + 12 + length]
            assert len(payload) == length, f"{path}: truncated record at {offset}"
            event = event_pb2.Event()
            event.ParseFromString(payload)
            events.append(event)
            offset += 12 + length + 4
    return events


def tb_scalars(workdir) -> dict:
    """{tag: [(step, value), ...]} of all scalar summaries."""
    out = {}
    for event in read_events(workdir):
        for value in event.summary.value:
            out.setdefault(value.tag, []).append((event.step, value.simple_value))
    return out


def test_rows_are_json_with_step_time_and_python_numbers(tmp_path):
    with MetricWriter(tmp_path) as writer:
        writer.write(0, {"loss": np.float32(0.5), "reward": jnp.asarray(0.25),
                         "tokens": np.int64(1024), "kl": 1e-3})
        writer.write(1, {"loss": 0.4, "reward": jnp.asarray([0.75])})
    lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
    assert len(lines) == 2
    first = json.loads(lines[0])
    assert first["step"] == 0 and first["loss"] == 0.5 and first["reward"] == 0.25
    assert first["tokens"] == 1024 and first["kl"] == 1e-3
    assert isinstance(first["time"], float) and abs(first["time"] - 1.7e9) < 1e9
    assert read_metrics(tmp_path) == [first, json.loads(lines[1])]
    assert read_metrics(tmp_path)[1]["reward"] == 0.75


def test_tensorboard_events_hold_the_scalars(tmp_path):
    with MetricWriter(tmp_path) as writer:
        for step in range(3):
            writer.write(step, {"loss": 1.0 / (step + 1), "reward": step * 0.5})
    scalars = tb_scalars(tmp_path)
    assert [s for s, _ in scalars["loss"]] == [0, 1, 2]
    np.testing.assert_allclose([v for _, v in scalars["loss"]], [1.0, 0.5, 1 / 3], rtol=1e-6)
    np.testing.assert_allclose([v for _, v in scalars["reward"]], [0.0, 0.5, 1.0])


def test_resume_drops_rows_from_the_resumed_step_on(tmp_path):
    with MetricWriter(tmp_path) as writer:
        for step in range(6):  # killed after logging step 5; the checkpoint is at step 3
            writer.write(step, {"loss": float(step)})
    with MetricWriter(tmp_path, resume_step=3) as writer:
        assert [r["step"] for r in read_metrics(tmp_path)] == [0, 1, 2]
        for step in range(3, 8):
            writer.write(step, {"loss": 10.0 + step})
    rows = read_metrics(tmp_path)
    assert [r["step"] for r in rows] == list(range(8))  # one row per step
    assert [r["loss"] for r in rows] == [0.0, 1.0, 2.0, 13.0, 14.0, 15.0, 16.0, 17.0]
    # TensorBoard is told to purge its old events from step 3 on
    purges = [e.step for e in read_events(tmp_path)
              if e.session_log.status == event_pb2.SessionLog.START]
    assert purges == [3]


def test_resume_without_a_file_and_a_torn_last_line(tmp_path):
    with MetricWriter(tmp_path / "fresh", resume_step=5) as writer:
        writer.write(5, {"loss": 1.0})
    assert [r["step"] for r in read_metrics(tmp_path / "fresh")] == [5]

    with MetricWriter(tmp_path) as writer:
        writer.write(0, {"loss": 1.0})
    with open(tmp_path / "metrics.jsonl", "a") as f:
        f.write('{"step": 1, "lo')  # killed mid-write
    assert [r["step"] for r in read_metrics(tmp_path)] == [0]
    with MetricWriter(tmp_path, resume_step=1) as writer:
        writer.write(1, {"loss": 2.0})
    assert [r["step"] for r in read_metrics(tmp_path)] == [0, 1]

    (tmp_path / "metrics.jsonl").write_text('{"step": 0}\nnot json\n{"step": 1}\n')
    with pytest.raises(ValueError, match="metrics.jsonl:2"):
        read_metrics(tmp_path)


def test_non_finite_values_are_null_in_json_and_kept_in_tensorboard(tmp_path):
    with MetricWriter(tmp_path) as writer:
        writer.write(0, {"loss": float("nan"), "grad_norm": np.float32("inf"),
                         "kl": -math.inf, "ok": 1.5})
    text = (tmp_path / "metrics.jsonl").read_text()
    assert "NaN" not in text and "Infinity" not in text
    (row,) = read_metrics(tmp_path)
    assert row["loss"] is None and row["grad_norm"] is None and row["kl"] is None
    assert row["ok"] == 1.5
    scalars = tb_scalars(tmp_path)
    assert math.isnan(scalars["loss"][0][1]) and scalars["grad_norm"][0][1] == math.inf


def test_bad_input_is_rejected_by_name(tmp_path):
    with MetricWriter(tmp_path, tensorboard=False) as writer:
        with pytest.raises(TypeError, match="'hist'"):
            writer.write(0, {"hist": np.zeros(3)})
        with pytest.raises(ValueError, match="'step'"):
            writer.write(0, {"step": 1.0})
        with pytest.raises(ValueError, match="step must be"):
            writer.write(-1, {"loss": 1.0})
    assert not (tmp_path / "tensorboard").exists()
    with pytest.raises(ValueError, match="closed"):
        writer.write(0, {"loss": 1.0})
