/* `ringtrain bench comm`: the collective benchmark of src/dist (dist/comm_bench.h) as a
 * command: options, ranks started through the launcher (dist/launch.h) with --nproc N
 * or taken from the environment (torchrun, mpirun, srun) with --nproc 0, the table on
 * rank 0's stdout, --json. --compare puts all_reduce, reduce+broadcast and
 * reduce_scatter+all_gather side by side (docs/comm-algorithms.md explains the winner).
 * Exit codes: 0 ok, 1 failure (a wrong element included), 2 usage error. */
#include "cli/args.h"
#include "cli/cli.h"
#include "core/info.h"
#include "core/settings.h"
#include "dist/comm_bench.h"
#include "dist/dist.h"
#include "dist/launch.h"

#include <errno.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef struct opts {
    int nproc;
    rt_transport transport;
    rt_comm_bench_options bench;
    const char *json;
    const char *init;
    bool compare;
    bool bind;
    double timeout_s;
} opts;

static int parse_int(const char *s, long lo, long hi, int *out) { return rt_cli_parse_int(s, (int)lo, (int)hi, out); }

/* "a,b,c" or "all" into a bit mask; each name through the library's parse. */
static int parse_collectives(const char *s, unsigned *mask) {
    *mask = 0;
    char buf[256];
    snprintf(buf, sizeof buf, "%s", s);
    for (char *save = NULL, *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        rt_comm_bench_coll c;
        if (strcasecmp(tok, "all") == 0)
            *mask = (1u << RT_BENCH_COLL_COUNT_) - 1;
        else if (rt_comm_bench_coll_parse(tok, &c) == RT_OK)
            *mask |= 1u << c;
        else
            return -1;
    }
    return *mask ? 0 : -1; /* "," names nothing */
}

static int parse_algos(const char *s, unsigned *mask) {
    *mask = 0;
    char buf[256];
    snprintf(buf, sizeof buf, "%s", s);
    for (char *save = NULL, *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        rt_algo a;
        if (strcasecmp(tok, "all") == 0)
            *mask = (1u << RT_COMM_BENCH_ALGOS) - 1;
        else if (rt_algo_parse(tok, &a) == RT_OK && (int)a < RT_COMM_BENCH_ALGOS)
            *mask |= 1u << a;
        else
            return -1;
    }
    return *mask ? 0 : -1;
}

/* The transports the benchmark (host buffers) takes: dist's table's that carry them. */
static const char *transport_list(char *buf, size_t n) {
    if (n) buf[0] = '\0';
    for (int i = 0; i < RT_TRANSPORT_COUNT_; i++)
        if (rt_transport_takes_host((rt_transport)i)) rt_names_append(buf, n, rt_transport_name((rt_transport)i));
    return buf;
}

/* The algorithms the benchmark times: dist's table up to RT_COMM_BENCH_ALGOS. */
static const char *algo_list(char *buf, size_t n) {
    rt_names t = rt_algo_names;
    t.count = RT_COMM_BENCH_ALGOS;
    return rt_names_list(&t, buf, n);
}

static void usage(FILE *f) {
    char colls[256], algos[128], transports[128];
    rt_names_list(&rt_comm_bench_coll_names, colls, sizeof colls);
    algo_list(algos, sizeof algos);
    transport_list(transports, sizeof transports);
    fprintf(f,
            "usage: ringtrain bench comm [options]\n\n"
            "Time collectives per size, nccl-tests style: size, count, time(us), algbw, busbw (GB/s), #wrong.\n\n"
            "  --nproc N            start N local ranks (default 2); 0: take ranks from the environment\n"
            "  --no-bind            do not pin local rank r to CPU r (pinned by default when N <= CPUs,\n"
            "                       as mpirun binds to cores by default)\n"
            "  --init METHOD        rendezvous without --nproc (default env://)\n"
            "  --transport T        %s (default shm)\n"
            "  --min-size S         smallest size, e.g. 8, 4K, 1M (default 8)\n"
            "  --max-size S         largest size (default 64M; nccl-tests go to 256M)\n"
            "  --collective C,...   %s | all (default all_reduce)\n"
            "  --algo A,...         %s | all (default all; broadcast/reduce: ring=chain, naive=flat)\n"
            "  --iters N            timed iterations per size (default: by size, 5..200)\n"
            "  --warmup N           untimed iterations first (default 2)\n"
            "  --compare            all_reduce vs reduce+broadcast vs reduce_scatter+all_gather side by side\n"
            "  --json FILE          write all rows (and `ringtrain info --json`) to FILE\n"
            "  --timeout S          dist timeout (default: RINGTRAIN_DIST_TIMEOUT, else 120)\n"
            "\nEvery option takes its value as --opt VALUE or --opt=VALUE.\n",
            transports, colls, algos);
}

/* ---- output (rank 0) ---- */

typedef struct printer {
    const opts *o;
    bool header_done;
    rt_comm_bench_row cmp[RT_COMM_BENCH_ALGOS];
    unsigned have;
    size_t cmp_size;
} printer;

static void print_row(const rt_comm_bench_row *r, void *arg) {
    printer *p = arg;
    if (!p->o->compare) {
        printf("%12zu %12zu %-15s %-6s %11.1f %8.3f %8.3f %7lld\n", r->size, r->count, rt_comm_bench_coll_name(r->coll),
               rt_algo_name(r->algo), r->time_us, r->algbw, r->busbw, r->wrong);
        fflush(stdout);
        return;
    }
    if (r->coll != RT_BENCH_ALL_REDUCE) return;
    if (r->size != p->cmp_size) p->have = 0, p->cmp_size = r->size;
    p->cmp[r->algo] = *r;
    p->have |= 1u << r->algo;
    if (p->have != (1u << RT_COMM_BENCH_ALGOS) - 1) return;
    if (!p->header_done)
        printf("%12s %14s %14s %14s  %-10s %7s\n", "size(B)", "ring(us)", "reduce+bcast", "rs+ag(us)", "fastest",
               "#wrong");
    p->header_done = true;
    int best = 0;
    for (int k = 1; k < RT_COMM_BENCH_ALGOS; k++)
        if (p->cmp[k].time_us < p->cmp[best].time_us) best = k;
    static const char *const nm[RT_COMM_BENCH_ALGOS] = {"ring", "reduce+bcast", "rs+ag"};
    printf("%12zu %14.1f %14.1f %14.1f  %-12s %5lld\n", p->cmp[0].size, p->cmp[0].time_us, p->cmp[1].time_us,
           p->cmp[2].time_us, nm[best], p->cmp[0].wrong + p->cmp[1].wrong + p->cmp[2].wrong);
    fflush(stdout);
}

static int write_json(const opts *o, int n, rt_transport t, const rt_comm_bench_row *rows, int nrows) {
    FILE *f = fopen(o->json, "w");
    if (!f) {
        fprintf(stderr, "ringtrain bench comm: --json %s: cannot write: %s\n", o->json, strerror(errno));
        return 1;
    }
    fprintf(f, "{\"benchmark\": \"comm\", \"nproc\": %d, \"transport\": \"%s\", \"dtype\": \"f32\",\n \"info\": ", n,
            rt_transport_name(t));
    rt_cli_info_json(f);
    fprintf(f, ",\n \"rows\": [\n");
    for (int i = 0; i < nrows; i++)
        fprintf(f,
                "  {\"collective\": \"%s\", \"algo\": \"%s\", \"size\": %zu, \"count\": %zu, \"time_us\": %.3f, "
                "\"algbw_GBps\": %.4f, \"busbw_GBps\": %.4f, \"wrong\": %lld}%s\n",
                rt_comm_bench_coll_name(rows[i].coll), rt_algo_name(rows[i].algo), rows[i].size, rows[i].count,
                rows[i].time_us, rows[i].algbw, rows[i].busbw, rows[i].wrong, i + 1 < nrows ? "," : "");
    fprintf(f, " ]}\n");
    return fclose(f) == 0 ? 0 : 1;
}

/* One rank: join the group, run the benchmark, rank 0 prints. Returns the exit code. */
static int rank_main(const opts *o) {
    rt_pg_options po;
    if (rt_pg_options_default(&po) != RT_OK) return rt_cli_fail();
    po.init_method = o->init;
    po.transport = o->transport;
    po.timeout_s = o->timeout_s;
    rt_pg *pg;
    if (rt_pg_init(&po, &pg) != RT_OK) return rt_cli_fail();
    int me = rt_pg_rank(pg), n = rt_pg_size(pg);
    size_t min_size = o->bench.min_size < 8 ? 8 : o->bench.min_size;
    if (me == 0) {
        printf("# ringtrain bench comm: %d ranks, transport %s, f32, sizes %zu..%zu bytes, timeout %g s\n", n,
               rt_transport_name(rt_pg_transport(pg)), min_size, o->bench.max_size, o->timeout_s);
        if (!o->compare)
            printf("%12s %12s %-15s %-6s %11s %8s %8s %7s\n", "size(B)", "count", "collective", "algo", "time(us)",
                   "algbw", "busbw", "#wrong");
    }
    printer p = {.o = o};
    rt_comm_bench_row *rows = NULL;
    int nrows = 0;
    int status = 0;
    if (rt_comm_bench_run(pg, &o->bench, me == 0 ? print_row : NULL, &p, &rows, &nrows) != RT_OK)
        status = rt_cli_fail();
    if (me == 0 && o->json && !status) status = write_json(o, n, rt_pg_transport(pg), rows, nrows);
    long long bad = 0;
    for (int i = 0; i < nrows; i++) bad += rows[i].wrong;
    free(rows);
    rt_pg_destroy(pg);
    if (bad && !status) {
        fprintf(stderr, "ringtrain bench comm: %lld wrong elements\n", bad);
        status = 1;
    }
    return status;
}

/* A local rank started by the launcher: the table comes from rank 0 only; one core per
 * rank, as mpirun binds by default. */
static int local_rank_main(int local_rank, void *arg) {
    const opts *o = arg;
    if (local_rank != 0 && !freopen("/dev/null", "w", stdout)) return 1;
    long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
    if (o->bind && ncpu > 0 && o->nproc <= ncpu) {
        cpu_set_t set;
        CPU_ZERO(&set);
        CPU_SET(local_rank % ncpu, &set);
        if (sched_setaffinity(0, sizeof set, &set) != 0) perror("sched_setaffinity");
    }
    return rank_main(o);
}

/* The value v of option a (one of k_valued): 0 ok, 2 a bad value (printed). */
static int parse_valued(const char *prog, const char *a, const char *v, opts *o) {
    int bad = 0;
    const char *want = NULL; /* what a bad value should have been */
    char want_buf[384], names[256];
    if (strcmp(a, "--nproc") == 0) {
        want = "an integer in 0..64";
        bad = parse_int(v, 0, 64, &o->nproc) != 0;
    } else if (strcmp(a, "--init") == 0) {
        o->init = v;
    } else if (strcmp(a, "--transport") == 0) {
        snprintf(want_buf, sizeof want_buf, "one of %s", transport_list(names, sizeof names));
        want = want_buf;
        bad = rt_transport_parse(v, &o->transport) != RT_OK || !rt_transport_takes_host(o->transport);
    } else if (strcmp(a, "--min-size") == 0) {
        want = "a size in bytes such as 8, 4K, 1M";
        bad = rt_cli_parse_size(v, &o->bench.min_size) != 0;
    } else if (strcmp(a, "--max-size") == 0) {
        want = "a size in bytes such as 8, 4K, 1M, at most 4G";
        bad = rt_cli_parse_size(v, &o->bench.max_size) != 0 || o->bench.max_size > (4ull << 30);
    } else if (strcmp(a, "--collective") == 0) {
        snprintf(want_buf, sizeof want_buf, "a comma-separated list of %s, or all",
                 rt_names_list(&rt_comm_bench_coll_names, names, sizeof names));
        want = want_buf;
        bad = parse_collectives(v, &o->bench.coll_mask) != 0;
    } else if (strcmp(a, "--algo") == 0) {
        snprintf(want_buf, sizeof want_buf, "a comma-separated list of %s, or all", algo_list(names, sizeof names));
        want = want_buf;
        bad = parse_algos(v, &o->bench.algo_mask) != 0;
    } else if (strcmp(a, "--iters") == 0) {
        want = "an integer in 1..1000000";
        bad = parse_int(v, 1, 1000000, &o->bench.iters) != 0;
    } else if (strcmp(a, "--warmup") == 0) {
        want = "an integer in 0..1000000";
        bad = parse_int(v, 0, 1000000, &o->bench.warmup) != 0;
    } else if (strcmp(a, "--json") == 0) {
        o->json = v;
    } else if (strcmp(a, "--timeout") == 0) {
        want = "seconds, above 0 and at most 86400";
        bad = rt_cli_parse_double(v, 0, 86400, &o->timeout_s) != 0 || !(o->timeout_s > 0);
    }
    if (bad) {
        fprintf(stderr, "%s: %s '%s': expected %s\n", prog, a, v, want);
        return 2;
    }
    return 0;
}

/* The defaults (RINGTRAIN_DIST_TIMEOUT sets the timeout's), then the arguments: 0 ok,
 * 1 help printed, 2 usage error (printed). */
static int parse_args(const char *prog, int argc, char **argv, opts *o) {
    *o = (opts){.nproc = 2, .transport = RT_TRANSPORT_SHM, .init = "env://", .timeout_s = 120, .bind = true};
    /* RINGTRAIN_DIST_TIMEOUT sets the default timeout, as for every process group (docs/settings.md) */
    if (rt_setting_is_set(RT_SET_DIST_TIMEOUT) && rt_setting_float(RT_SET_DIST_TIMEOUT, &o->timeout_s) != RT_OK) {
        fprintf(stderr, "%s: %s\n", prog, rt_error_message());
        return 2;
    }
    rt_comm_bench_options_default(&o->bench);
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (rt_cli_is_help(a)) {
            usage(stdout);
            return 1;
        }
        int f;
        if ((f = rt_cli_flag(prog, a, "--no-bind")) != 0) {
            if (f < 0) return 2;
            o->bind = false;
            continue;
        }
        if ((f = rt_cli_flag(prog, a, "--compare")) != 0) {
            if (f < 0) return 2;
            o->compare = true;
            o->bench.coll_mask = 1u << RT_BENCH_ALL_REDUCE;
            o->bench.algo_mask = (1u << RT_COMM_BENCH_ALGOS) - 1;
            continue;
        }
        /* --opt VALUE or --opt=VALUE */
        static const char *const k_valued[] = {"--nproc",    "--init",       "--transport", "--min-size",
                                               "--max-size", "--collective", "--algo",      "--iters",
                                               "--warmup",   "--json",       "--timeout"};
        const char *name = NULL, *v = NULL;
        for (size_t k = 0; k < sizeof k_valued / sizeof k_valued[0] && !name; k++) {
            int r = rt_cli_opt(prog, argc, argv, &i, k_valued[k], &v);
            if (r < 0) return 2;
            if (r > 0) name = k_valued[k];
        }
        if (!name) {
            fprintf(stderr, "%s: unknown option '%s' (try --help)\n", prog, a);
            return 2;
        }
        if (parse_valued(prog, name, v, o) != 0) return 2;
    }
    return 0;
}

int rt_cmd_bench_comm(int argc, char **argv) {
    const char *prog = "ringtrain bench comm";
    opts o;
    int pr = parse_args(prog, argc, argv, &o);
    if (pr != 0) return pr == 1 ? 0 : 2;
    /* an output that cannot be written fails now, not after the benchmark */
    if (o.json && rt_cli_check_output(prog, "--json", o.json) != 0) return 1;
    if (o.bench.min_size < 8) o.bench.min_size = 8;
    if (o.bench.min_size > o.bench.max_size) {
        fprintf(stderr, "ringtrain bench comm: --min-size %zu is above --max-size %zu\n", o.bench.min_size,
                o.bench.max_size);
        return 2;
    }
    if (o.nproc == 0) return rank_main(&o);
    /* local ranks meet through env:// on the launcher's loopback port */
    o.init = "env://";
    rt_launch_options lo;
    rt_launch_options_default(&lo);
    lo.nproc = o.nproc;
    rt_launch_result res;
    rt_status s = rt_launch_fork(&lo, local_rank_main, &o, &res);
    if (s != RT_OK) {
        char line[RT_LAUNCH_LINE + 128];
        fprintf(stderr, "ringtrain bench comm: %s\n",
                res.ranks ? rt_launch_describe(&res, line, sizeof line) : rt_error_message());
    }
    int rc = s == RT_OK ? 0 : res.signal ? 128 + res.signal : 1;
    rt_launch_result_free(&res);
    return rc;
}
