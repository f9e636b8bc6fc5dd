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
} rt_augment;

typedef struct rt_augment_params {
    int dy, dx; /* source offset of the crop window, in -pad..pad */
    bool flip;
} rt_augment_params;

rt_augment_params rt_augment_params_at(const rt_augment *a, int64_t epoch, int64_t index);

/* lut (C, 256): normalised value of each byte per channel. */
void rt_normalize_lut(const float *mean, const float *std, int c, float *lut);

/* Normalise src (C, H, W) into dst (C, H, W) with the given crop/flip (NULL: none). */
void rt_augment_image(const uint8_t *src, int c, int h, int w, const float *lut, const rt_augment_params *p,
                      float *dst);

#ifdef __cplusplus
}
#endif

#endif
