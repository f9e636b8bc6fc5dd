/* Normalisation, random crop with padding and horizontal flip; see augment.h. */
#include "data/internal/augment.h"

#include "core/philox.h"

rt_augment_params rt_augment_params_at(const rt_augment *a, int64_t epoch, int64_t index) {
    rt_augment_params p = {0, 0, false};
    if (a->crop_pad <= 0 && !a->hflip) return p;
    rt_u32x4 b = rt_philox_block(a->seed, (uint64_t)epoch, (uint64_t)index);
    if (a->crop_pad > 0) {
        int span = 2 * a->crop_pad + 1;
        p.dy = (int)(rt_u32_to_uniform(b.v[0]) * (float)span) - a->crop_pad;
        p.dx = (int)(rt_u32_to_uniform(b.v[1]) * (float)span) - a->crop_pad;
    }
    if (a->hflip) p.flip = rt_u32_to_uniform(b.v[2]) < 0.5f;
    return p;
}

void rt_normalize_lut(const float *mean, const float *std, int c, float *lut) {
    for (int ch = 0; ch < c; ch++) {
        float inv = 1.0f / std[ch];
        for (int v = 0; v < 256; v++) lut[ch * 256 + v] = ((float)v / 255.0f - mean[ch]) * inv;
    }
}

void rt_augment_image(const uint8_t *src, int c, int h, int w, const float *lut, const rt_augment_params *p,
                      float *dst) {
    int dy = p ? p->dy : 0, dx = p ? p->dx : 0;
    bool flip = p && p->flip;
    for (int ch = 0; ch < c; ch++) {
        const float *t = lut + ch * 256;
        const float zero = t[0]; /* the padding is pixel value 0 */
        const uint8_t *plane = src + (size_t)ch * h * w;
        float *out = dst + (size_t)ch * h * w;
        /* x (output) reads column x + dx (before the flip); valid for x in [x0, x1) */
        int x0 = dx < 0 ? -dx : 0, x1 = dx > 0 ? w - dx : w;
        if (x1 < x0) x1 = x0;
        for (int y = 0; y < h; y++, out += w) {
            int sy = y + dy;
            if (sy < 0 || sy >= h) {
                for (int x = 0; x < w; x++) out[x] = zero;
                continue;
            }
            const uint8_t *row = plane + (size_t)sy * w;
            if (!flip) {
                for (int x = 0; x < x0; x++) out[x] = zero;
                for (int x = x0; x < x1; x++) out[x] = t[row[x + dx]];
                for (int x = x1; x < w; x++) out[x] = zero;
            } else {
                /* out[w-1-x] = cropped[x] */
                for (int x = 0; x < x0; x++) out[w - 1 - x] = zero;
                for (int x = x0; x < x1; x++) out[w - 1 - x] = t[row[x + dx]];
                for (int x = x1; x < w; x++) out[w - 1 - x] = zero;
            }
        }
    }
}
