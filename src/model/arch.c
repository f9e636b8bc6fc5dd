/* The table of architectures: one row (rt_model_arch_ops) per rt_model_arch, their
 * names and the default config.
 *
 * Adding an architecture: write src/model/<name>.c defining its row (build, prepare,
 * forward, backward, release, and init_param / loss / check / seed_dropout where it
 * differs from the defaults), add its enum member before RT_ARCH_COUNT_ in model.h and
 * its row here. Nothing else in src/model changes. */
#include "model/internal/model_impl.h"
#include "core/names.h"

/* resnet.c */
extern const rt_model_arch_ops rt_arch_resnet18, rt_arch_resnet34;
/* net.c */
extern const rt_model_arch_ops rt_arch_net;

static const rt_model_arch_ops *const k_archs[RT_ARCH_COUNT_] = {
    [RT_ARCH_RESNET18] = &rt_arch_resnet18,
    [RT_ARCH_RESNET34] = &rt_arch_resnet34,
    [RT_ARCH_NET] = &rt_arch_net,
};

const rt_model_arch_ops *rt_model_arch_ops_of(rt_model_arch arch) {
    return (unsigned)arch < RT_ARCH_COUNT_ ? k_archs[arch] : NULL;
}

/* Defaults: resnet34, 1x28x28, 10 classes, imagenet stem, width 64, max_batch 64. */
void rt_model_config_default(rt_model_config *cfg) {
    *cfg = (rt_model_config){.arch = RT_ARCH_RESNET34,
                             .in_channels = 1,
                             .in_h = 28,
                             .in_w = 28,
                             .num_classes = 10,
                             .stem = RT_STEM_IMAGENET,
                             .width = 64,
                             .max_batch = 64,
                             .dropout = -1.0};
}

static const char *arch_name(int i) { return k_archs[i] ? k_archs[i]->name : NULL; }
const rt_names rt_model_arch_names = {"model arch", RT_ARCH_COUNT_, NULL, arch_name, NULL};

rt_status rt_model_arch_parse(const char *text, rt_model_arch *out) {
    int i = 0;
    rt_status st = rt_names_parse(&rt_model_arch_names, text, &i);
    if (st != RT_OK) return st; /* the message is complete: no trace line */
    *out = (rt_model_arch)i;
    return RT_OK;
}

const char *rt_model_arch_name(rt_model_arch a) {
    const char *name = rt_names_name(&rt_model_arch_names, (int)a);
    return name ? name : "?";
}
