/* Normalisation, random crop with padding, horizontal flip and random erasing; see augment.h. */
#include "data/internal/augment.h"

#include "core/philox.h"

#include <math.h>

/* torchvision RandomErasing.get_params with our draws (augment.h) */
static void erase_params_at(const rt_augment *a, int64_t epoch, int64_t index, rt_augment_params *p) {
    uint64_t key = a->seed ^ RT_ERASE_KEY, base = (uint64_t)index * 16u;
    rt_u32x4 b = rt_philox_block(key, (uint64_t)epoch, base);
    if (!((double)rt_u32_to_uniform(b.v[0]) < a->erase_p)) return; /* torch.rand(1) < p */
    double area = (double)a->h * a->w, lr0 = log(a->erase_ratio[0]), lr1 = log(a->erase_ratio[1]);
    for (int t = 1; t <= 10; t++) {
        rt_u32x4 d = rt_philox_block(key, (uint64_t)epoch, base + (uint64_t)t);
        double s = a->erase_scale[0] + (a->erase_scale[1] - a->erase_scale[0]) * rt_u32_to_uniform(d.v[0]);
        double r = exp(lr0 + (lr1 - lr0) * rt_u32_to_uniform(d.v[1]));
        double ea = area * s;
        int h = (int)nearbyint(sqrt(ea * r)), w = (int)nearbyint(sqrt(ea / r)); /* round half to even */
        if (!(h < a->h && w < a->w)) continue;
        p->erase = true;
        p->eh = h;
        p->ew = w;
        p->ey = (int)(rt_u32_to_uniform(d.v[2]) * (float)(a->h - h + 1)); /* randint(0, H - h + 1) */
        p->ex = (int)(rt_u32_to_uniform(d.v[3]) * (float)(a->w - w + 1));
        if (p->ey > a->h - h) p->ey = a->h - h;
        if (p->ex > a->w - w) p->ex = a->w - w;
        p->erase_random = a->erase_random;
        p->erase_value = a->erase_value;
        p->noise_key = a->seed ^ RT_ERASE_NOISE;
        p->noise_epoch = (uint64_t)epoch;
        p->noise_first = (uint64_t)index * (uint64_t)a->c * (uint64_t)a->h * (uint64_t)a->w;
        return;
    }
}

rt_augment_params rt_augment_params_at(const rt_augment *a, int64_t epoch, int64_t index) {
    rt_augment_params p = {0};
    if (a->erase_p > 0) erase_params_at(a, epoch, index, &p);
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
    if (p && p->erase) { /* img[..., i:i+h, j:j+w] = v, after the normalisation */
        for (int ch = 0; ch < c; ch++)
            for (int y = 0; y < p->eh; y++) {
                float *row = dst + ((size_t)ch * h + (size_t)(p->ey + y)) * w + p->ex;
                for (int x = 0; x < p->ew; x++)
                    row[x] = p->erase_random
                                 ? rt_philox_normal_at(p->noise_key, p->noise_epoch,
                                                       p->noise_first + ((uint64_t)ch * p->eh + (uint64_t)y) * p->ew +
                                                           (uint64_t)x)
                                 : p->erase_value;
            }
    }
}
