"""Reference for test_data_augment_torch: torchvision's crop-with-padding, flip and
normalisation applied with given parameters.

usage: torch_augment.py DIR
Reads DIR/meta.txt ("n c h w pad" then the c means, then the c stds), DIR/images.u8
(n, c, h, w) and DIR/params.i32 (n, 3: dy, dx, flip); writes DIR/torch.f32 (n, c, h, w):
T.functional.pad(img, pad, fill=0) -> crop(top=pad+dy, left=pad+dx, h, w) -> hflip if
flip -> /255 -> Normalize(mean, std). (RandomCrop draws top, left in 0..2*pad; these are
the draws ringtrain made.)
"""
import sys

import numpy as np
import torch
import torchvision.transforms.functional as F

d = sys.argv[1]
meta = open(d + "/meta.txt").read().split()
n, c, h, w, pad = (int(x) for x in meta[:5])
mean = [float(x) for x in meta[5 : 5 + c]]
std = [float(x) for x in meta[5 + c : 5 + 2 * c]]
images = torch.from_numpy(np.fromfile(d + "/images.u8", dtype=np.uint8).reshape(n, c, h, w).copy())
params = np.fromfile(d + "/params.i32", dtype=np.int32).reshape(n, 3)
out = torch.empty(n, c, h, w, dtype=torch.float32)
for i in range(n):
    dy, dx, flip = (int(v) for v in params[i])
    x = F.pad(images[i], [pad, pad, pad, pad], fill=0)
    x = F.crop(x, pad + dy, pad + dx, h, w)
    if flip:
        x = F.hflip(x)
    x = F.convert_image_dtype(x, torch.float32)
    out[i] = F.normalize(x, mean, std)
out.numpy().tofile(d + "/torch.f32")
