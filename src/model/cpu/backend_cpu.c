/* CPU backend table (filled in by the kernels in this folder). */
#include "model/backend.h"

const rt_model_backend rt_model_backend_cpu = {
    .name = "cpu",
};
