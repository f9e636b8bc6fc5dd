"""Read a run's TensorBoard event file with TensorBoard's own reader and check it against
the run's metrics.jsonl (log.tensorboard; run by tests/train/tensorboard.sh in the
virtual environment of scripts/tb-venv).

  tb_read.py check RUN_DIR      every scalar of metrics.jsonl's step and eval lines is in
                                the event file at its step, once, and nothing else is
  tb_read.py truncate RUN_DIR   copies of the event file cut inside its last record's
                                header, data and CRC: the reader still reads every record
                                before it (what a kill -9 mid-write leaves)
  tb_read.py tear RUN_DIR       append the first half of the last record again (a write
                                torn by a kill: the run that resumes must drop it)

Values: metrics.jsonl prints 6 significant digits, the event file holds float32, so a
pair agrees when |a - b| <= 1e-5 * max(|b|, 1e-3) (6 digits round to at most 5e-6
relatively, float32 to 6e-8); a JSON null (NaN or infinite) must be non-finite there.
"""
import glob
import json
import math
import os
import shutil
import struct
import sys
import tempfile

from tensorboard.backend.event_processing import event_accumulator
from tensorboard.compat.proto import event_pb2

STAGES = ["data", "h2d", "forward", "backward", "comm", "optim", "step"]
STEP_TAGS = {"loss": "train/loss", "lr": "train/lr", "images_per_s": "train/images_per_s",
             "grad_norm": "train/grad_norm", "comm_busy_ms": "time/comm_busy_ms"}
STEP_TAGS.update({s + "_ms": "time/%s_ms" % s for s in STAGES})
EVAL_TAGS = {"loss": "test/loss", "accuracy": "test/accuracy", "val_loss": "val/loss",
             "val_accuracy": "val/accuracy"}


def fail(msg):
    print("FAIL: tb_read: " + msg)
    sys.exit(1)


def event_file(run_dir):
    files = sorted(glob.glob(os.path.join(run_dir, "events.out.tfevents.*")))
    if len(files) != 1:
        fail("%s: expected one event file, found %s" % (run_dir, files))
    return files[0]


def read_scalars(path):
    """{(tag, step): [values]} as TensorBoard's EventAccumulator reads them (orphaned data
    not purged: a step written twice shows as two values)."""
    ea = event_accumulator.EventAccumulator(path, size_guidance={event_accumulator.SCALARS: 0},
                                            purge_orphaned_data=False)
    ea.Reload()
    if ea.file_version != 2.0:  # "brain.Event:2", as the accumulator parses it
        fail("%s: file version %r, expected 2.0 (brain.Event:2)" % (path, ea.file_version))
    got = {}
    for tag in ea.Tags()["scalars"]:
        for ev in ea.Scalars(tag):
            got.setdefault((tag, ev.step), []).append(ev.value)
    return got


def expected_scalars(run_dir):
    """{(tag, step): value} from metrics.jsonl's step and eval lines (None: JSON null)"""
    want = {}
    for line in open(os.path.join(run_dir, "metrics.jsonl")):
        o = json.loads(line)
        tags = STEP_TAGS if o["kind"] == "step" else EVAL_TAGS if o["kind"] == "eval" else {}
        for key, tag in tags.items():
            if key not in o or (key == "grad_norm" and o[key] is None):  # not computed: not logged
                continue
            if (tag, o["step"]) in want:
                fail("metrics.jsonl: %s twice at step %d" % (tag, o["step"]))
            want[(tag, o["step"])] = o[key]
    return want


def agree(a, b):
    if b is None:
        return not math.isfinite(a)
    return abs(a - b) <= 1e-5 * max(abs(b), 1e-3)


def check(run_dir):
    path = event_file(run_dir)
    first = event_pb2.Event.FromString(records(path)[0][1])
    if first.file_version != "brain.Event:2" or first.step != 0:
        fail("%s: the first record is %r, expected file_version 'brain.Event:2' at step 0" % (path, first))
    got = read_scalars(path)
    want = expected_scalars(run_dir)
    twice = sorted(k for k, v in got.items() if len(v) > 1)
    if twice:
        fail("%s: %d (tag, step) pairs more than once, e.g. %s" % (path, len(twice), twice[:5]))
    missing = sorted(set(want) - set(got))
    extra = sorted(set(got) - set(want))
    if missing or extra:
        fail("%s: %d scalars of metrics.jsonl missing (e.g. %s), %d not in it (e.g. %s)" %
             (path, len(missing), missing[:5], len(extra), extra[:5]))
    bad = [(k, got[k][0], want[k]) for k in sorted(want) if not agree(got[k][0], want[k])]
    if bad:
        fail("%s: %d values differ from metrics.jsonl, e.g. %s" % (path, len(bad), bad[:5]))
    steps = sorted(s for (t, s) in want if t == "train/loss")
    evals = sorted(s for (t, s) in want if t == "test/loss")
    print("ok: %s: %d scalars (%d steps, %d evaluations) read back by TensorBoard %s equal metrics.jsonl, "
          "each once" % (os.path.basename(path), len(want), len(steps), len(evals), tb_version()))
    return steps, evals


def tb_version():
    import tensorboard
    return tensorboard.__version__


def records(path):
    """(offset, data) of each record, by walking the lengths"""
    blob = open(path, "rb").read()
    out, at = [], 0
    while at + 12 <= len(blob):
        (n,) = struct.unpack("<Q", blob[at:at + 8])
        out.append((at, blob[at + 12:at + 12 + n]))
        at += 12 + n + 4
    if at != len(blob):
        fail("%s: %d bytes after the last whole record" % (path, len(blob) - at))
    return out


def truncate(run_dir):
    path = event_file(run_dir)
    full = read_scalars(path)
    recs = records(path)
    last_at, last = recs[-1]
    ev = event_pb2.Event.FromString(last)
    in_last = {(v.tag, ev.step) for v in ev.summary.value}
    if not in_last:
        fail("%s: the last record holds no scalar" % path)
    want = {k: v for k, v in full.items() if k not in in_last}
    size = os.path.getsize(path)
    cuts = {"in its length": last_at + 5, "in its length's crc": last_at + 10,
            "in its data": last_at + 12 + len(last) // 2, "in its data's crc": size - 2}
    tmp = tempfile.mkdtemp()
    try:
        for where, at in cuts.items():
            cut = os.path.join(tmp, os.path.basename(path))
            shutil.copyfile(path, cut)
            os.truncate(cut, at)
            got = read_scalars(cut)
            if got != want:
                fail("cut %s (at byte %d of %d): read %d scalars, expected the %d before the last record" %
                     (where, at, size, len(got), len(want)))
            print("ok: cut inside the last record (%s, at byte %d of %d): the %d scalars of the %d records "
                  "before it read back" % (where, at, size, len(want), len(recs) - 1))
    finally:
        shutil.rmtree(tmp)


def tear(run_dir):
    path = event_file(run_dir)
    at, last = records(path)[-1]
    with open(path, "rb") as f:
        f.seek(at)
        torn = f.read(12 + len(last) // 2)
    with open(path, "ab") as f:
        f.write(torn)
    print("ok: appended %d of the %d bytes of a record to %s" % (len(torn), 16 + len(last), os.path.basename(path)))


if __name__ == "__main__":
    modes = {"check": check, "truncate": truncate, "tear": tear}
    if len(sys.argv) != 3 or sys.argv[1] not in modes:
        sys.exit("usage: tb_read.py check|truncate|tear RUN_DIR")
    modes[sys.argv[1]](sys.argv[2])
