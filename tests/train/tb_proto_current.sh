#!/usr/bin/env bash
# src/train/tb_event.pb-c.[ch] are protoc-c's output for src/train/tb_event.proto as it is
# now (they are checked in so that a build needs no protoc-c): regenerated into a
# temporary folder by scripts/gen-tb-proto and compared byte for byte.
# Exit 77 (skipped) without protoc-c (Debian: protobuf-c-compiler, which
# scripts/install-deps test installs).
set -u
src=${1:?usage: tb_proto_current.sh SOURCE_DIR}
command -v protoc-c >/dev/null || { echo "SKIP: protoc-c not found (Debian: protobuf-c-compiler)"; exit 77; }
tmp=$(mktemp -d /tmp/rt-tbproto-XXXXXX)
trap 'rm -rf "$tmp"' EXIT
"$src/scripts/gen-tb-proto" "$tmp" || { echo "FAIL: scripts/gen-tb-proto failed"; exit 1; }
bad=0
for f in tb_event.pb-c.c tb_event.pb-c.h; do
  cmp -s "$tmp/$f" "$src/src/train/$f" ||
    { echo "FAIL: src/train/$f is not protoc-c's output for tb_event.proto: run scripts/gen-tb-proto"; diff "$tmp/$f" "$src/src/train/$f" | head -10; bad=1; }
done
[ "$bad" = 0 ] && echo "ok: src/train/tb_event.pb-c.[ch] are protoc-c $(protoc-c --version | head -1 | cut -d' ' -f2)'s output for tb_event.proto"
exit $bad
