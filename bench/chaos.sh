#!/usr/bin/env bash
# A chaos run, as evidence that restarts and stops lose nothing (issue 38, item 6): the
# tutorial Net on Fashion-MNIST, 2 ranks, a few hundred steps (checkpoints every 5 steps),
# trained once without interruption and once under --max-restarts while rank deaths and a
# stop hit it at random points:
#  - KILLS (20) random (rank, step) pairs: that rank SIGKILLs itself right after that step
#    (the test hook RINGTRAIN_TEST_KILL_PLAN: an exact point, no polling race); the launcher
#    restarts the job from the newest checkpoint each time;
#  - once, at a random step between two kills, SIGTERM to the launcher (RINGTRAIN_TEST_SIGNAL_AT):
#    a clean stop with a checkpoint (exit 143), and the same command is run again; the rerun
#    is a new job, its attempts count from 0 again, so the kills after the stop form its plan.
# The points are drawn by a seeded RNG (SEED, printed and recorded) at strictly increasing
# steps at least 2 apart, so no two deaths repeat at the same step (which would stop the
# restarts: docs/train.md) and the stop lies between two kills.
# Checks: the final model.safetensors equals the uninterrupted run's byte for byte (and the
# newest checkpoints' tensors, optimizer state included); metrics.jsonl has every step
# 1..STEPS exactly once, each evaluation and the end line once; 20 restarts were seen, each
# kill happened, the stop exited 143 and the rerun resumed from the stop checkpoint.
# Writes bench/results/chaos-<YYYYMMDD>.json with `ringtrain info --json` and exits non-zero
# when a check fails. Without Fashion-MNIST it prints "skipped" and exits 0 (no JSON).
#
#   bench/chaos.sh   (BUILD=build; SEED=<random>, KILLS=20, SUBSET=4800 (300 steps: 2 epochs of
#                     150 at global batch 32), MAX_RESTARTS=25)
set -euo pipefail
cd "$(dirname "$0")/.."
bin=${RINGTRAIN:-${BUILD:-build}/ringtrain}
seed=${SEED:-$(( (RANDOM << 15) | RANDOM ))}
kills=${KILLS:-20}
subset=${SUBSET:-4800}
max_restarts=${MAX_RESTARTS:-25}
data=/usr/share/datasets/fashion-mnist
[ -x "$bin" ] || { echo "chaos.sh: $bin not found (make build)" >&2; exit 1; }
[ -r "$data" ] || { echo "chaos.sh: $data missing (Debian's fashion-mnist package): skipped"; exit 0; }
mkdir -p bench/results
out=bench/results/chaos-$(date -u +%Y%m%d).json
tmp=$(mktemp -d /tmp/rt-bench-chaos-XXXXXX)
trap 'rm -rf "$tmp"' EXIT
# the test-only hooks act only with this switch (docs/testing.md)
export RINGTRAIN_TEST_HOOKS=1
printf 'model:\n  arch: net\n' > "$tmp/c.yaml"
batch=32
epochs=2
per_epoch=$((subset / batch))
steps=$((per_epoch * epochs))
args=(model.arch=net "data.train_subset=$subset" data.test_subset=1000 "data.batch_size=$batch" "train.epochs=$epochs"
      train.threads=1 dist.nproc=2 optim.momentum=0.9 optim.lr=0.01 log.progress=off
      checkpoint.every_steps=5 checkpoint.keep_last=3 dist.timeout_s=60)

# the plan: KILLS+1 steps in [5, steps-5], strictly increasing, at least 2 apart; one of
# them (not the first or the last) is the stop, the others are kills of a random rank
plan=$(/usr/bin/python3 - "$seed" "$kills" "$steps" <<'PY'
import random, sys
seed, kills, steps = map(int, sys.argv[1:])
rng = random.Random(seed)
while True:
    pts = sorted(rng.sample(range(5, steps - 4), kills + 1))
    if all(b - a >= 2 for a, b in zip(pts, pts[1:])):
        break
t = rng.randrange(1, kills)  # index of the stop among the points
ranks = [rng.randrange(2) for _ in range(kills)]
before = [(r, s) for r, s in zip(ranks, pts[:t])]
after = [(r, s) for r, s in zip(ranks[t:], pts[t + 1:])]
print(pts[t])
print(",".join("%d:%d:%d" % (a, r, s) for a, (r, s) in enumerate(before)))
print(",".join("%d:%d:%d" % (a, r, s) for a, (r, s) in enumerate(after)))
PY
)
term_step=$(sed -n 1p <<<"$plan")
plan1=$(sed -n 2p <<<"$plan")
plan2=$(sed -n 3p <<<"$plan")
echo "chaos.sh: seed $seed, $steps steps; kills (attempt:rank:step) $plan1; SIGTERM to the launcher at step $term_step; then $plan2"

# the uninterrupted run
t0=$(date +%s.%N)
"$bin" train "$tmp/c.yaml" "${args[@]}" "log.dir=$tmp/ref" >"$tmp/ref.out" 2>"$tmp/ref.err" ||
  { tail -20 "$tmp/ref.err" >&2; echo "chaos.sh: the uninterrupted run failed" >&2; exit 1; }
t1=$(date +%s.%N)
# the chaos run: invocation 1 (kills, then the stop), invocation 2 (the same command again)
rc1=0
RINGTRAIN_TEST_KILL_PLAN=$plan1 RINGTRAIN_TEST_SIGNAL_AT=step:$term_step:launcher:0:TERM \
  "$bin" train "$tmp/c.yaml" "${args[@]}" "log.dir=$tmp/chaos" --max-restarts "$max_restarts" \
  >"$tmp/chaos1.out" 2>"$tmp/chaos1.err" || rc1=$?
rc2=0
RINGTRAIN_TEST_KILL_PLAN=$plan2 \
  "$bin" train "$tmp/c.yaml" "${args[@]}" "log.dir=$tmp/chaos" --max-restarts "$max_restarts" \
  >"$tmp/chaos2.out" 2>"$tmp/chaos2.err" || rc2=$?
t2=$(date +%s.%N)

/usr/bin/python3 - "$tmp" "$out" "$seed" "$steps" "$kills" "$term_step" "$plan1" "$plan2" "$rc1" "$rc2" \
  "$t0" "$t1" "$t2" "$max_restarts" "$bin" "${args[*]}" <<'PY'
import glob, json, os, re, subprocess, struct, sys
tmp, out, seed, steps, kills, term, plan1, plan2, rc1, rc2, t0, t1, t2, maxr, binary, config = sys.argv[1:]
steps, kills, term, rc1, rc2 = int(steps), int(kills), int(term), int(rc1), int(rc2)
read = lambda f: open(os.path.join(tmp, f)).read()
checks = {}

def tensors(p):
    b = open(p, "rb").read(); n = struct.unpack("<Q", b[:8])[0]; h = json.loads(b[8:8 + n]); d = b[8 + n:]
    return {k: d[v["data_offsets"][0]:v["data_offsets"][1]] for k, v in h.items() if k != "__metadata__"}

ref, run = os.path.join(tmp, "ref"), os.path.join(tmp, "chaos")
# the runs' exits: the stop 143, the rerun 0
checks["stop_exit_143"] = rc1 == 143
checks["rerun_exit_0"] = rc2 == 0
o1, e1, o2, e2 = read("chaos1.out"), read("chaos1.err"), read("chaos2.out"), read("chaos2.err")
checks["stopped_at_term_step"] = bool(re.search(r"^stopped by SIGTERM after step %d;" % term, o1, re.M))
ck_term = os.path.join(run, "checkpoints", "ckpt-%09d" % term)
checks["rerun_resumed_from_stop_checkpoint"] = ("ringtrain: resuming from %s " % ck_term) in o2
# every kill happened once, and each was followed by a restart (none after the stop)
plan = [(1, p) for p in plan1.split(",") if p] + [(2, p) for p in plan2.split(",") if p]
killed = re.findall(r"^RINGTRAIN_TEST_KILL_PLAN: rank (\d+) kills itself after step (\d+) \(attempt (\d+)\)$", e1, re.M)
killed2 = re.findall(r"^RINGTRAIN_TEST_KILL_PLAN: rank (\d+) kills itself after step (\d+) \(attempt (\d+)\)$", e2, re.M)
want = lambda ps: sorted(tuple(map(int, p.split(":"))) for p in ps.split(",") if p)
got = lambda ks: sorted((int(a), int(r), int(s)) for r, s, a in ks)
checks["every_kill_happened_once"] = got(killed) == want(plan1) and got(killed2) == want(plan2)
restarts = len(re.findall(r"restarting \(\d+/%s\)" % maxr, e1)) + len(re.findall(r"restarting \(\d+/%s\)" % maxr, e2))
checks["restarts_seen_equal_kills"] = restarts == kills
# bit for bit: the final model file, and the newest checkpoints' tensors (optimizer state too)
checks["model_safetensors_bitwise_equal"] = open(ref + "/model.safetensors", "rb").read() == open(run + "/model.safetensors", "rb").read()
ca, cb = sorted(glob.glob(ref + "/checkpoints/ckpt-*"))[-1], sorted(glob.glob(run + "/checkpoints/ckpt-*"))[-1]
checks["newest_checkpoint_same_step"] = os.path.basename(ca) == os.path.basename(cb)
checks["newest_checkpoint_tensors_bitwise_equal"] = all(tensors(ca + "/" + f) == tensors(cb + "/" + f)
                                                        for f in ("model.safetensors", "train.safetensors"))
# metrics.jsonl: every step exactly once, each evaluation and the end once
rows = [json.loads(l) for l in open(run + "/metrics.jsonl")]
of = lambda k: [r.get("step") for r in rows if r["kind"] == k]
checks["metrics_every_step_once"] = of("step") == list(range(1, steps + 1))
refrows = [json.loads(l) for l in open(ref + "/metrics.jsonl")]
checks["metrics_evals_once"] = of("eval") == [r.get("step") for r in refrows if r["kind"] == "eval"]
checks["metrics_one_end"] = len(of("end")) == 1
starts = [(r.get("resumed_from_step"), r.get("restart_count")) for r in rows if r["kind"] == "start"]
# the losses logged equal the uninterrupted run's, step for step
loss = lambda rs: [r.get("loss") for r in rs if r["kind"] == "step"]
checks["metrics_losses_equal"] = loss(rows) == loss(refrows)
info = json.loads(subprocess.run([binary, "info", "--json"], capture_output=True, text=True, check=True).stdout)
head = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], capture_output=True, text=True).stdout != ""
res = {
    "benchmark": "chaos", "commit": head, "dirty": dirty, "binary": binary, "info": info,
    "config": "Fashion-MNIST; data.batch_size is the global batch; " + config,
    "steps": steps, "seed": int(seed), "max_restarts": int(maxr),
    "kill_plan_before_stop": plan1, "sigterm_launcher_at_step": term, "kill_plan_after_stop": plan2,
    "exit_codes": [rc1, rc2], "restarts_seen": restarts, "start_lines": starts,
    "wall_s": {"uninterrupted": float(t1) - float(t0), "chaos": float(t2) - float(t1)},
    "checks": checks, "ok": all(checks.values()),
}
json.dump(res, open(out, "w"), indent=1)
print("%-42s %s" % ("check", "result"))
for k, v in checks.items():
    print("%-42s %s" % (k, "ok" if v else "FAILED"))
print("%-42s %d kills + 1 SIGTERM (seed %s), %d restarts" % ("chaos", kills, seed, restarts))
print("%-42s %.1f s uninterrupted, %.1f s with chaos" % ("wall time", float(t1) - float(t0), float(t2) - float(t1)))
print("wrote %s" % out)
sys.exit(0 if res["ok"] else 1)
PY
