/* `ringtrain bench model`: training-step throughput of a model (images/s). */
#include "cli.h"

#include <stdio.h>

int rt_cmd_bench_model(int argc, char **argv) {
    (void)argc;
    (void)argv;
    fprintf(stderr, "ringtrain bench model: not implemented yet\n");
    return 2;
}
