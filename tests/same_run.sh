# Sourced by the resume tests (tests/train/resume.sh, recipes.sh); needs fail() defined.
#   same_run RUN_A RUN_B WHAT   the two run directories' newest checkpoints have the same
#                               step and bitwise-identical tensors, and so do the runs'
#                               model.safetensors (an exact resume)
same_run() {
  local a b
  a=$(ls -d "$1"/checkpoints/ckpt-* | tail -1); b=$(ls -d "$2"/checkpoints/ckpt-* | tail -1)
  [ "$(basename "$a")" = "$(basename "$b")" ] || fail "final checkpoints differ: $a vs $b"
  /usr/bin/python3 - "$a" "$b" <<'PY' || fail "$3: the resumed run differs from the uninterrupted one"
import json, struct, sys
def tensors(p):
    b = open(p, "rb").read(); n = struct.unpack("<Q", b[:8])[0]; h = json.loads(b[8:8 + n]); d = b[8 + n:]
    return {k: d[v["data_offsets"][0]:v["data_offsets"][1]] for k, v in h.items() if k != "__metadata__"}
for f in ("model.safetensors", "train.safetensors"):
    x, y = tensors(sys.argv[1] + "/" + f), tensors(sys.argv[2] + "/" + f)
    assert x.keys() == y.keys(), f
    bad = [k for k in x if x[k] != y[k]]
    assert not bad, "%s: %d tensors differ, e.g. %s" % (f, len(bad), bad[:3])
PY
  cmp -s "$1/model.safetensors" "$2/model.safetensors" || fail "$3: model.safetensors differ"
}
