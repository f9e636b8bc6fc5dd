/* `ringtrain bench comm`: placeholder replaced below. */
#include "cli.h"
#include <stdio.h>
int rt_cmd_bench_comm(int argc, char **argv) {
    (void)argc;
    (void)argv;
    fprintf(stderr, "ringtrain bench comm: not yet implemented\n");
    return 2;
}
