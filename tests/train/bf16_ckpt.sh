#!/usr/bin/env bash
# train.precision bf16 and checkpoints (issue 22, item 2): a ResNet18 trained a few
# steps in bf16 writes fp32 weights that load into torchvision.models.resnet18 with
# strict=True (conv1 replaced by the 1-channel stem) and score, under PyTorch's own CPU
# autocast, the accuracy ringtrain's bf16 evaluation printed (within 2 points of 500
# images: the two bf16 forwards round at different places, docs/model.md); the same
# checkpoint then resumes in an fp32 run, which continues from its step.
#   tests/train/bf16_ckpt.sh RINGTRAIN
# Exit 77 (skipped) without Debian's Fashion-MNIST or torch.
set -u
bin=$1
data=/usr/share/datasets/fashion-mnist
[ -r "$data" ] || { echo "SKIP: $data missing"; exit 77; }
/usr/bin/python3 -c 'import torch, torchvision' 2>/dev/null || { echo "SKIP: no torch at /usr/bin/python3"; exit 77; }
tmp=$(mktemp -d /tmp/rt-bf16ck-XXXXXX)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*"; for f in "$tmp"/*.out; do [ -f "$f" ] && { echo "--- $f"; tail -20 "$f"; }; done; exit 1; }
printf 'model:\n  arch: resnet18\n' > "$tmp/c.yaml"
args=(data.train_subset=512 data.test_subset=500 data.batch_size=32 train.threads=2 optim.lr=0.05 log.progress=off
      dist.nproc=1 "log.dir=$tmp/run")
"$bin" train "$tmp/c.yaml" "${args[@]}" train.precision=bf16 train.max_steps=8 >"$tmp/bf16.out" 2>&1 || fail "bf16 run"
acc=$(sed -n 's/^test accuracy \([0-9.]*\)%.*/\1/p' "$tmp/bf16.out" | tail -1)
[ -n "$acc" ] || fail "the bf16 run printed no test accuracy"
ck=$(ls -d "$tmp"/run/checkpoints/ckpt-* | tail -1)
/usr/bin/python3 - "$ck/model.safetensors" "$data" "$acc" <<'PY' || fail "torchvision disagrees"
import gzip, json, struct, sys
import torch, torch.nn as nn, torchvision
path, data, acc = sys.argv[1], sys.argv[2], float(sys.argv[3])
b = open(path, "rb").read(); n = struct.unpack("<Q", b[:8])[0]; h = json.loads(b[8:8 + n]); d = b[8 + n:]
kinds = {v["dtype"] for k, v in h.items() if k != "__metadata__"}
assert kinds == {"F32", "I64"}, kinds  # fp32 weights (and the I64 num_batches_tracked), no bf16
dt = {"F32": torch.float32, "I64": torch.int64}
sd = {k: torch.frombuffer(bytearray(d[v["data_offsets"][0]:v["data_offsets"][1]]), dtype=dt[v["dtype"]]).reshape(v["shape"])
      for k, v in h.items() if k != "__metadata__"}
m = torchvision.models.resnet18(num_classes=10)
m.conv1 = nn.Conv2d(1, 64, kernel_size=7, stride=2, padding=3, bias=False)
m.load_state_dict(sd, strict=True)
m.eval()
with gzip.open(data + "/t10k-images-idx3-ubyte.gz") as f:
    f.read(16); x = f.read(500 * 784)
with gzip.open(data + "/t10k-labels-idx1-ubyte.gz") as f:
    f.read(8); y = torch.tensor(list(f.read(500)))
x = (torch.frombuffer(bytearray(x), dtype=torch.uint8).float().view(500, 1, 28, 28) / 255 - 0.2860) / 0.3530
with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
    got = 100.0 * (m(x).argmax(1) == y).float().mean().item()
print("torchvision resnet18 (autocast bf16) %.2f%%, ringtrain bf16 %.2f%%" % (got, acc))
assert abs(got - acc) <= 2.0, (got, acc)
PY
"$bin" train "$tmp/c.yaml" "${args[@]}" train.precision=fp32 train.max_steps=12 >"$tmp/fp32.out" 2>&1 || fail "fp32 resume"
grep -q "resuming from .*$(basename "$ck")" "$tmp/fp32.out" || fail "the fp32 run did not resume from $(basename "$ck")"
[ -d "$tmp/run/checkpoints/ckpt-000000012" ] || fail "the fp32 run wrote no ckpt-12"
echo "ok: a bf16 checkpoint loads into torchvision (strict) and resumes in fp32"
