/* `ringtrain bench p2p`: the copy benchmark of src/dist (dist/p2p_bench.h) as a command.
 * On GPUs (--device cuda) one process times every GPU pair and each GPU with the host;
 * on CPU ranks (--device cpu) ranks are started as `bench comm` starts them (the launcher,
 * --nproc N; 0: from the environment) and time every rank pair over --transport. Rank 0
 * prints the topology, the matrices and the reading (docs/bench.md explains them);
 * --json writes the same. Exit codes: 0 ok, 1 failure, 2 usage error. */
#include "cli/args.h"
#include "cli/cli.h"
#include "core/settings.h"
#include "dist/dist.h"
#include "dist/launch.h"
#include "dist/p2p_bench.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

typedef enum { DEV_AUTO, DEV_CUDA, DEV_CPU } device_choice;

typedef struct opts {
    device_choice device;
    int nproc;
    rt_transport transport;
    rt_p2p_options bench;
    const char *json;
    const char *init;
    double timeout_s;
} opts;

static const char *const k_prog = "ringtrain bench p2p";

static void usage(FILE *f) {
    fprintf(f, "usage: ringtrain bench p2p [options]\n\n"
               "Copy bandwidth and latency between every ordered pair of GPUs (peer access off and on) and\n"
               "between the host and each GPU (pinned and pageable), one at a time and all at once, with the\n"
               "topology beside it and a reading of why entries differ; on CPU ranks the same over shm or tcp.\n\n"
               "  --device D     cuda | cpu | auto (default auto: cuda where a GPU is, else cpu)\n"
               "  --size S       bytes per copy, e.g. 1M, 64M (default 32M; at least 8)\n"
               "  --iters N      copies timed per entry (default 5; latency: at least 20)\n"
               "  --warmup N     untimed copies first (default 1)\n"
               "  --json FILE    write the topology, every matrix and the reading to FILE\n"
               "CPU ranks:\n"
               "  --nproc N      start N local ranks (default 2, at most 16); 0: ranks from the environment\n"
               "  --transport T  auto | tcp | shm (default shm)\n"
               "  --init METHOD  rendezvous without --nproc (default env://)\n"
               "  --timeout S    dist timeout (default: RINGTRAIN_DIST_TIMEOUT, else 120)\n"
               "\nEvery option takes its value as --opt VALUE or --opt=VALUE.\n");
}

/* ---- output ---- */

static void print_value(FILE *f, double v) {
    if (isfinite(v))
        fprintf(f, " %11.3f", v);
    else
        fprintf(f, " %11s", "-");
}

static void print_topology(const rt_p2p_report *r) {
    const char *who = r->gpu ? "GPU" : "rank";
    printf("\ntopology (%s; link, and the CUDA performance rank where peer access is supported)\n",
           r->gpu ? (r->nvml ? "CUDA runtime and NVML" : "CUDA runtime, no NVML") : r->transport);
    printf("%5s %-14s %5s", who, r->gpu ? "PCI bus id" : "CPU", "NUMA");
    for (int j = 0; j < r->n; j++) printf(" %14d", j);
    printf("\n");
    for (int i = 0; i < r->n; i++) {
        char numa[16] = "?";
        if (r->numa[i] >= 0) snprintf(numa, sizeof numa, "%d", r->numa[i]);
        printf("%5d %-14s %5s", i, r->bus_id[i], numa);
        for (int j = 0; j < r->n; j++) {
            char cell[32];
            if (i == j)
                snprintf(cell, sizeof cell, "-");
            else if (r->gpu && r->access[i][j])
                snprintf(cell, sizeof cell, "%s r%d", rt_p2p_link_name(r->link[i][j]), r->rank[i][j]);
            else
                snprintf(cell, sizeof cell, "%s", rt_p2p_link_name(r->link[i][j]));
            printf(" %14s", cell);
        }
        printf("\n");
    }
}

static void print_matrix(const rt_p2p_report *r, const rt_p2p_matrix *m) {
    printf("\n%s\n", m->title);
    if (!m->host && r->n < 2) {
        printf("  (%s)\n", r->note);
        return;
    }
    printf("%9s", m->host ? "GPU" : "src\\dst");
    for (int j = 0; j < m->cols; j++)
        if (m->host)
            printf(" %12s", rt_p2p_host_col_name(j));
        else
            printf(" %11d", j);
    printf("\n");
    for (int i = 0; i < m->rows; i++) {
        printf("%9d", i);
        for (int j = 0; j < m->cols; j++) {
            if (m->host) printf(" ");
            print_value(stdout, m->v[i * m->cols + j]);
        }
        printf("\n");
    }
}

static void print_report(const rt_p2p_report *r) {
    char reading[512];
    rt_p2p_reading(r, reading, sizeof reading);
    printf("# ringtrain bench p2p: %d %s%s, %zu bytes per copy, %d copies per entry%s%s\n", r->n,
           r->gpu ? "GPU" : "rank", r->n == 1 ? "" : "s", r->size, r->iters, r->gpu ? "" : ", transport ",
           r->gpu ? "" : r->transport);
    print_topology(r);
    for (int k = 0; k < r->nmat; k++) print_matrix(r, &r->mat[k]);
    printf("\nreading: %s\n", reading);
    fflush(stdout);
}

static void json_string(FILE *f, const char *s) {
    fputc('"', f);
    for (; *s; s++)
        if (*s == '"' || *s == '\\')
            fprintf(f, "\\%c", *s);
        else if ((unsigned char)*s < 0x20)
            fprintf(f, "\\u%04x", *s);
        else
            fputc(*s, f);
    fputc('"', f);
}

static void json_matrix(FILE *f, const rt_p2p_matrix *m) {
    fprintf(f, "  ");
    json_string(f, m->key);
    fprintf(f, ": {\"title\": ");
    json_string(f, m->title);
    fprintf(f, ", \"unit\": \"%s\", \"rows\": \"%s\", \"columns\": [", m->latency ? "us" : "GB/s",
            m->host ? "GPU" : "source");
    for (int j = 0; j < m->cols; j++)
        if (m->host)
            fprintf(f, "%s\"%s\"", j ? ", " : "", rt_p2p_host_col_name(j));
        else
            fprintf(f, "%s%d", j ? ", " : "", j);
    fprintf(f, "],\n   \"values\": [");
    for (int i = 0; i < m->rows; i++) {
        fprintf(f, "%s[", i ? ", " : "");
        for (int j = 0; j < m->cols; j++) {
            double v = m->v[i * m->cols + j];
            fprintf(f, isfinite(v) ? "%s%.6g" : "%snull", j ? ", " : "", v);
        }
        fprintf(f, "]");
    }
    fprintf(f, "]}");
}

static void json_topology(FILE *f, const rt_p2p_report *r) {
    fprintf(f, " \"endpoints\": [");
    for (int i = 0; i < r->n; i++) {
        fprintf(f, "%s{\"id\": %d, \"%s\": ", i ? ", " : "", i, r->gpu ? "bus_id" : "cpu");
        json_string(f, r->bus_id[i]);
        fprintf(f, ", \"numa\": %d}", r->numa[i]);
    }
    fprintf(f, "],\n \"links\": [");
    for (int i = 0; i < r->n; i++) {
        fprintf(f, "%s\n  [", i ? "," : "");
        for (int j = 0; j < r->n; j++)
            fprintf(f, "%s{\"link\": \"%s\", \"access\": %d, \"rank\": %d, \"atomics\": %d}", j ? ", " : "",
                    rt_p2p_link_name(r->link[i][j]), r->access[i][j], r->rank[i][j], r->atomics[i][j]);
        fprintf(f, "]");
    }
    fprintf(f, "],\n");
}

static int write_json(const char *path, const rt_p2p_report *r) {
    FILE *f = fopen(path, "w");
    if (!f) {
        fprintf(stderr, "%s: --json %s: cannot write: %s\n", k_prog, path, strerror(errno));
        return 1;
    }
    char reading[512];
    rt_p2p_reading(r, reading, sizeof reading);
    fprintf(f, "{\"benchmark\": \"p2p\", \"device\": \"%s\", \"n\": %d, \"size\": %zu, \"iters\": %d, ",
            r->gpu ? "cuda" : "cpu", r->n, r->size, r->iters);
    fprintf(f, "\"transport\": \"%s\", \"nvml\": %s,\n \"info\": ", r->gpu ? "" : r->transport,
            r->nvml ? "true" : "false");
    rt_cli_info_json(f);
    fprintf(f, ",\n");
    json_topology(f, r);
    fprintf(f, " \"matrices\": {\n");
    for (int k = 0; k < r->nmat; k++) {
        json_matrix(f, &r->mat[k]);
        fprintf(f, "%s\n", k + 1 < r->nmat ? "," : "");
    }
    fprintf(f, " },\n \"reading_matrix\": \"%s\",\n \"reading\": ", r->mat[r->reading_mat].key);
    json_string(f, reading);
    fprintf(f, ",\n \"note\": ");
    json_string(f, r->note);
    fprintf(f, "}\n");
    return fclose(f) == 0 ? 0 : 1;
}

static int finish(const opts *o, rt_p2p_report *r) {
    int rc = 0;
    if (r) {
        print_report(r);
        if (o->json) rc = write_json(o->json, r);
    }
    free(r);
    return rc;
}

/* ---- running ---- */

static int gpu_main(const opts *o) {
    rt_p2p_report *r = NULL;
    if (rt_p2p_bench_gpu(&o->bench, &r) != RT_OK) return rt_cli_fail();
    return finish(o, r);
}

static int rank_main(const opts *o) {
    rt_pg_options po;
    if (rt_pg_options_default(&po) != RT_OK) return rt_cli_fail();
    po.init_method = o->init;
    po.transport = o->transport;
    po.timeout_s = o->timeout_s;
    rt_pg *pg;
    if (rt_pg_init(&po, &pg) != RT_OK) return rt_cli_fail();
    if (rt_pg_size(pg) > RT_P2P_MAX) {
        fprintf(stderr, "%s: %d ranks: at most %d\n", k_prog, rt_pg_size(pg), RT_P2P_MAX);
        rt_pg_destroy(pg);
        return 2;
    }
    rt_p2p_report *r = NULL;
    int rc = rt_p2p_bench_ranks(pg, &o->bench, &r) == RT_OK ? 0 : rt_cli_fail();
    rt_pg_destroy(pg);
    if (rc) return rc;
    return finish(o, r);
}

static int local_rank_main(int local_rank, void *arg) {
    if (local_rank != 0 && !freopen("/dev/null", "w", stdout)) return 1;
    return rank_main(arg);
}

static int cpu_main(opts *o) {
    if (o->nproc == 0) return rank_main(o);
    o->init = "env://";
    rt_launch_options lo;
    rt_launch_options_default(&lo);
    lo.nproc = o->nproc;
    rt_launch_result res;
    rt_status s = rt_launch_fork(&lo, local_rank_main, o, &res);
    if (s != RT_OK) {
        char line[RT_LAUNCH_LINE + 128];
        fprintf(stderr, "%s: %s\n", k_prog,
                res.ranks ? rt_launch_describe(&res, line, sizeof line) : rt_error_message());
    }
    int rc = s == RT_OK ? 0 : res.signal ? 128 + res.signal : 1;
    rt_launch_result_free(&res);
    return rc;
}

/* ---- arguments ---- */

static int parse_valued(const char *a, const char *v, opts *o) {
    const char *want = NULL;
    bool bad = false;
    if (strcmp(a, "--device") == 0) {
        want = "cuda, cpu or auto";
        o->device = strcmp(v, "cuda") == 0 ? DEV_CUDA : strcmp(v, "cpu") == 0 ? DEV_CPU : DEV_AUTO;
        bad = o->device == DEV_AUTO && strcmp(v, "auto") != 0;
    } else if (strcmp(a, "--size") == 0) {
        want = "a size in bytes such as 1M or 64M, from 8 to 4G";
        bad = rt_cli_parse_size(v, &o->bench.size) != 0 || o->bench.size < 8 || o->bench.size > (4ull << 30);
    } else if (strcmp(a, "--iters") == 0) {
        want = "an integer in 1..100000";
        bad = rt_cli_parse_int(v, 1, 100000, &o->bench.iters) != 0;
    } else if (strcmp(a, "--warmup") == 0) {
        want = "an integer in 0..100000";
        bad = rt_cli_parse_int(v, 0, 100000, &o->bench.warmup) != 0;
    } else if (strcmp(a, "--nproc") == 0) {
        want = "an integer in 0..16";
        bad = rt_cli_parse_int(v, 0, RT_P2P_MAX, &o->nproc) != 0;
    } else if (strcmp(a, "--transport") == 0) {
        want = "a transport that carries host buffers (auto, tcp or shm)";
        bad = rt_transport_parse(v, &o->transport) != RT_OK || !rt_transport_takes_host(o->transport);
    } else if (strcmp(a, "--init") == 0) {
        o->init = v;
    } else if (strcmp(a, "--json") == 0) {
        o->json = v;
    } else if (strcmp(a, "--timeout") == 0) {
        want = "seconds, above 0 and at most 86400";
        bad = rt_cli_parse_double(v, 0, 86400, &o->timeout_s) != 0 || !(o->timeout_s > 0);
    }
    if (bad) fprintf(stderr, "%s: %s '%s': expected %s\n", k_prog, a, v, want);
    return bad ? 2 : 0;
}

/* 0 ok, 1 help printed, 2 usage error (printed) */
static int parse_args(int argc, char **argv, opts *o) {
    *o = (opts){.device = DEV_AUTO, .nproc = 2, .init = "env://", .timeout_s = 120};
    if (rt_transport_parse("shm", &o->transport) != RT_OK) return 2; /* bench comm's default */
    rt_p2p_options_default(&o->bench);
    if (rt_setting_is_set(RT_SET_DIST_TIMEOUT) && rt_setting_float(RT_SET_DIST_TIMEOUT, &o->timeout_s) != RT_OK) {
        fprintf(stderr, "%s: %s\n", k_prog, rt_error_message());
        return 2;
    }
    static const char *const k_valued[] = {"--device",    "--size", "--iters", "--warmup", "--nproc",
                                           "--transport", "--init", "--json",  "--timeout"};
    for (int i = 1; i < argc; i++) {
        if (rt_cli_is_help(argv[i])) {
            usage(stdout);
            return 1;
        }
        const char *name = NULL, *v = NULL;
        for (size_t k = 0; k < sizeof k_valued / sizeof k_valued[0] && !name; k++) {
            int r = rt_cli_opt(k_prog, argc, argv, &i, k_valued[k], &v);
            if (r < 0) return 2;
            if (r > 0) name = k_valued[k];
        }
        if (!name) {
            fprintf(stderr, "%s: unknown option '%s' (try --help)\n", k_prog, argv[i]);
            return 2;
        }
        if (parse_valued(name, v, o) != 0) return 2;
    }
    return 0;
}

int rt_cmd_bench_p2p(int argc, char **argv) {
    opts o;
    int pr = parse_args(argc, argv, &o);
    if (pr != 0) return pr == 1 ? 0 : 2;
    if (o.json && rt_cli_check_output(k_prog, "--json", o.json) != 0) return 1;
    if (o.device == DEV_AUTO) {
        rt_p2p_report *probe = NULL; /* auto: a GPU run where one answers */
        rt_status s = rt_p2p_bench_gpu(&o.bench, &probe);
        if (s == RT_OK) return finish(&o, probe);
        if (s != RT_ERR_NODEVICE) return rt_cli_fail();
        o.device = DEV_CPU;
    }
    return o.device == DEV_CUDA ? gpu_main(&o) : cpu_main(&o);
}
