#!/usr/bin/env bash
# Two "hosts" on one machine: two network namespaces joined by a veth pair
# (10.99.X.1 and 10.99.X.2, addresses that exist only inside namespaces this script
# creates), two ranks in each, rendezvous env:// at host A, transport auto (which must
# pick tcp: the namespaces count as different hosts). Exit 77 (skipped) only when
# namespaces cannot be created (not root, no CAP_SYS_ADMIN); they are always removed.
#
#   tests/dist/netns.sh /path/to/dist_worker
set -u
worker=$1
tag=$(( $$ % 200 + 20 ))
nsa=rt-dist-$$-a
nsb=rt-dist-$$-b
va=rtva$$
vb=rtvb$$
cleanup() {
  ip netns del "$nsa" 2>/dev/null
  ip netns del "$nsb" 2>/dev/null
  ip link del "$va" 2>/dev/null
  true
}
trap cleanup EXIT
if ! ip netns add "$nsa" 2>/dev/null; then
  echo "SKIP: cannot create network namespaces here"
  exit 77
fi
set -e
ip netns add "$nsb"
ip link add "$va" type veth peer name "$vb"
ip link set "$va" netns "$nsa"
ip link set "$vb" netns "$nsb"
ip -n "$nsa" addr add "10.99.$tag.1/24" dev "$va"
ip -n "$nsb" addr add "10.99.$tag.2/24" dev "$vb"
for ns in "$nsa" "$nsb"; do ip -n "$ns" link set lo up; done
ip -n "$nsa" link set "$va" up
ip -n "$nsb" link set "$vb" up
set +e
export MASTER_ADDR=10.99.$tag.1 MASTER_PORT=29500 WORLD_SIZE=4 RT_EXPECT_TRANSPORT=tcp RINGTRAIN_JOB_TOKEN=netns-$$
pids=()
for rank in 0 1 2 3; do
  ns=$nsa; [ "$rank" -ge 2 ] && ns=$nsb
  RANK=$rank LOCAL_RANK=$((rank % 2)) timeout 120 ip netns exec "$ns" "$worker" &
  pids+=($!)
done
rc=0
for p in "${pids[@]}"; do wait "$p" || rc=1; done
[ "$rc" = 0 ] && echo "netns: 2 hosts x 2 ranks over tcp: ok"
exit $rc
