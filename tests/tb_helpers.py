"""TensorBoard event files read back without the package's own reader: TFRecord framing checked with tensorboardX's
CRC, each record parsed by tensorboardX's bundled protobuf `Event`, and TensorBoard's rules applied (files in name
order, a `SessionLog START` at step s drops what came before at s or later, the last value at a step shows)."""

import math
import struct
from pathlib import Path

import pytest

from sao_repro.runlog import add_derived


def tb_scalars(logdir) -> dict:
    "tag -> {step: value} of the event files in `logdir`, as TensorBoard shows them."
    event_pb2 = pytest.importorskip("tensorboardX.proto.event_pb2")
    from tensorboardX.record_writer import masked_crc32c

    files = sorted(Path(logdir).glob("events.out.tfevents.*"))
    assert files, f"no event files in {logdir}"
    out: dict = {}
    for p in files:
        b, i = p.read_bytes(), 0
        while i < len(b):
            (n,) = struct.unpack("<Q", b[i : i + 8])
            assert struct.unpack("<I", b[i + 8 : i + 12])[0] == masked_crc32c(b[i : i + 8]), f"{p}: bad length crc"
            data = b[i + 12 : i + 12 + n]
            assert struct.unpack("<I", b[i + 12 + n : i + 16 + n])[0] == masked_crc32c(data), f"{p}: bad data crc"
            i += 16 + n
            ev = event_pb2.Event()
            ev.ParseFromString(data)
            if ev.HasField("session_log") and ev.session_log.status == event_pb2.SessionLog.START:
                for series in out.values():
                    for s in [s for s in series if s >= ev.step]:
                        del series[s]
            if ev.HasField("summary"):
                for v in ev.summary.value:
                    out.setdefault(v.tag, {})[ev.step] = v.simple_value
    return out


def expected_scalars(rows) -> dict:
    "tag -> {step: value} a run's metrics.jsonl rows call for: every finite number but `step`, and what readers derive."
    want: dict = {}
    for r in rows:
        for k, v in add_derived(dict(r)).items():
            if k != "step" and not isinstance(v, bool) and isinstance(v, (int, float)) and math.isfinite(v):
                want.setdefault(k, {})[r["step"]] = v
    return want


def assert_tb_matches(logdir, rows, tags=()):
    "The event files in `logdir` hold exactly the scalars of metrics.jsonl's `rows` (float32), `tags` among them."
    got, want = tb_scalars(logdir), expected_scalars(rows)
    assert sorted(got) == sorted(want), set(got) ^ set(want)
    for tag, series in want.items():
        assert sorted(got[tag]) == sorted(series), tag
        assert got[tag] == pytest.approx(series, rel=1e-6, abs=1e-30), tag
    missing = [t for t in tags if t not in got]
    assert not missing, missing
    return got
