#!/usr/bin/env python3
"""Edit the __metadata__ of a checkpoint's train.safetensors as someone handing out a
crafted file could: the tensor bytes are copied untouched (so the crc32s of the tensor
data still match), the header is rewritten with its new length (padded to 8 bytes).

  ckpt_meta_edit.py FILE [--seal] [KEY=VALUE | -KEY | KEY:OLD=>NEW ...]

KEY=VALUE sets a field, -KEY removes it, KEY:OLD=>NEW replaces the text OLD (once, and it
must be there; backslash escapes such as \\n decoded) by NEW inside the field KEY (say,
'config'). --seal recomputes crc32.metadata as ringtrain writes it (by key in byte order,
each as key NUL value NUL), as the author of a crafted file can; without it the field is
left as it was, which is what corruption looks like."""
import json
import struct
import sys
import zlib


def meta_crc(meta):
    c = 0
    for k in sorted(meta, key=lambda s: s.encode()):
        if k == "crc32.metadata":
            continue
        c = zlib.crc32(k.encode() + b"\0" + meta[k].encode() + b"\0", c)
    return "%08x" % c


def main(argv):
    path, args = argv[1], argv[2:]
    raw = open(path, "rb").read()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8 : 8 + n])
    data = raw[8 + n :]
    meta = header.setdefault("__metadata__", {})
    seal = False
    for a in args:
        if a == "--seal":
            seal = True
        elif a.startswith("-"):
            meta.pop(a[1:], None)
        elif "=>" in a:
            key, rest = a.split(":", 1)
            old, new = rest.split("=>", 1)
            old, new = old.encode().decode("unicode_escape"), new.encode().decode("unicode_escape")
            if meta[key].count(old) != 1:
                sys.exit("%s: '%s' is in '%s' %d times, expected once" % (path, old, key, meta[key].count(old)))
            meta[key] = meta[key].replace(old, new)
        else:
            key, value = a.split("=", 1)
            meta[key] = value
    if seal and "crc32.metadata" in meta:
        meta["crc32.metadata"] = meta_crc(meta)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    open(path, "wb").write(struct.pack("<Q", len(h)) + h + data)


if __name__ == "__main__":
    main(sys.argv)
