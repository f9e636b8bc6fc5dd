"""Reference for test_data_fashion_mnist: read IDX gzip files with Python's gzip module.

usage: fashion_mnist_bytes.py IMAGES.gz LABELS.gz OUT INDEX...
Writes to OUT, for each INDEX, the label byte followed by the image's rows*cols bytes,
after a header line "n rows cols\n" (counts taken from the files' own headers).
"""
import gzip
import struct
import sys

images_path, labels_path, out_path = sys.argv[1:4]
indices = [int(a) for a in sys.argv[4:]]
with gzip.open(images_path, "rb") as f:
    images = f.read()
with gzip.open(labels_path, "rb") as f:
    labels = f.read()
magic, n, rows, cols = struct.unpack(">IIII", images[:16])
assert magic == 0x803, hex(magic)
lmagic, ln = struct.unpack(">II", labels[:8])
assert lmagic == 0x801 and ln == n
size = rows * cols
with open(out_path, "wb") as out:
    out.write(b"%d %d %d\n" % (n, rows, cols))
    for i in indices:
        out.write(labels[8 + i : 9 + i])
        out.write(images[16 + i * size : 16 + (i + 1) * size])
