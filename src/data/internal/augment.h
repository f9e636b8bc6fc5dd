/* Normalisation and training augmentation of one image, as a pure function.
 *
 * The random choices for sample `index` in epoch `epoch` are the Philox block
 * (key seed, subsequence epoch, counter index): word 0 picks the crop's top offset,
 * word 1 its left offset, word 2 the horizontal flip (equal to rt_philox_uniform_at(seed,
 * epoch, 4*index + k)). Nothing depends on the order in which samples are processed,
 * the rank, or the thread, so a resumed or re-sharded run augments identically.
 *
 * The crop is torchvision's RandomCrop(size, padding=pad) with zero fill followed by
 * RandomHorizontalFlip: out[y][x] = padded[y + top][x' + left] with x' = W-1-x when
 * flipped. Pixels become (v/255 - mean[c]) / std[c] through a 256-entry table.
 *
 * Random erasing is torchvision's RandomErasing(p, scale, ratio, value) applied after
 * Normalize, as in the usual pipeline (ToTensor, Normalize, RandomErasing): with
 * probability p, up to 10 attempts each draw an area A = H*W*U(scale) and an aspect
 * ratio r = exp(U(log ratio)), h = round(sqrt(A*r)), w = round(sqrt(A/r)) (Python's
 * round: half to even); the first with h < H and w < W places the rectangle at a
 * uniform top-left (i in 0..H-h, j in 0..W-w) and writes `value` into every channel of
 * it (or, for value "random", a standard normal per pixel and channel); if none fits
 * the image is unchanged. Its draws come from a Philox stream of their own (key
 * seed ^ "erasing!", subsequence epoch): block 16*index word 0 decides p, block
 * 16*index + t (t = 1..10) gives attempt t's scale, ratio, top and left; the normals are
 * element index*C*H*W + (c*h + y)*w + x of the normal stream (key seed ^ "erasnorm",
 * subsequence epoch). Like the crop and flip they depend on (seed, epoch, sample) only.
 */
#ifndef RT_DATA_AUGMENT_H
#define RT_DATA_AUGMENT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct rt_augment {
    uint64_t seed;
    int crop_pad; /* 0: no crop */
    bool hflip;
    /* random erasing: probability (0: off), area fraction and aspect ratio ranges */
    double erase_p;
    double erase_scale[2], erase_ratio[2];
    bool erase_random; /* value "random": N(0, 1) per pixel; else erase_value */
    float erase_value;
    int c, h, w; /* the image size (erasing draws depend on it) */
} rt_augment;

typedef struct rt_augment_params {
    int dy, dx; /* source offset of the crop window, in -pad..pad */
    bool flip;
    /* random erasing: the rectangle rows [ey, ey+eh), columns [ex, ex+ew) */
    bool erase;
    int ey, ex, eh, ew;
    bool erase_random;
    float erase_value;
    uint64_t noise_key, noise_epoch, noise_first; /* "random": element noise_first + (c*eh + y)*ew + x */
} rt_augment_params;

/* the erasing streams' keys (see above) */
#define RT_ERASE_KEY 0x65726173696e6721ull   /* "erasing!" */
#define RT_ERASE_NOISE 0x657261736e6f726dull /* "erasnorm" */

rt_augment_params rt_augment_params_at(const rt_augment *a, int64_t epoch, int64_t index);

/* lut (C, 256): normalised value of each byte per channel. */
void rt_normalize_lut(const float *mean, const float *std, int c, float *lut);

/* Normalise src (C, H, W) into dst (C, H, W) with the given crop/flip and erasing
 * (NULL: none). */
void rt_augment_image(const uint8_t *src, int c, int h, int w, const float *lut, const rt_augment_params *p,
                      float *dst);

#ifdef __cplusplus
}
#endif

#endif
