/* `ringtrain bench comm`: collective benchmarks in the style of nccl-tests.
 *
 * For each size (bytes of f32, doubling from --min-size to --max-size), each
 * collective and each algorithm: warm-up, then timed iterations; the time of an
 * operation is the mean over iterations of the slowest rank. algbw = size / time;
 * busbw = algbw x the collective's factor (all_reduce 2(n-1)/n, all_gather and
 * reduce_scatter (n-1)/n, broadcast and reduce 1), so results compare with the link's
 * peak whatever the number of ranks. After timing, one checked run counts wrong
 * elements (inputs are small integers, so f32 sums are exact). --nproc N forks the
 * ranks itself over loopback; without it the ranks come from the environment
 * (torchrun, mpirun, srun). --compare puts all_reduce, reduce+broadcast and
 * reduce_scatter+all_gather side by side (docs/comm-algorithms.md explains the winner).
 */
#include "cli/cli.h"
#include "core/info.h"
#include "core/timer.h"
#include "dist/dist.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

typedef enum coll { C_ALLREDUCE, C_BCAST, C_REDUCE, C_ALLGATHER, C_REDUCESCATTER, C_COUNT } coll;
static const char *const k_coll[C_COUNT] = {"all_reduce", "broadcast", "reduce", "all_gather", "reduce_scatter"};

typedef struct opts {
    int nproc;
    rt_transport transport;
    size_t min_size, max_size;
    int coll_mask;
    int algo_mask;
    int iters, warmup;
    const char *json;
    const char *init;
    bool compare;
    bool bind;
    double timeout_s;
} opts;

typedef struct row {
    coll c;
    rt_algo a;
    size_t size, count;
    double time_us, algbw, busbw;
    long long wrong;
} row;

/* A size in bytes with an optional K/M/G suffix; at most 1 TiB (so the cast below is
 * defined: inf, nan and 1e30 are refused). */
static int parse_size(const char *s, size_t *out) {
    char *end;
    double v = strtod(s, &end);
    if (end == s || !(v >= 0 && v <= 1099511627776.0)) return -1;
    double mul = 1;
    if (*end == 'K' || *end == 'k')
        mul = 1024, end++;
    else if (*end == 'M' || *end == 'm')
        mul = 1024.0 * 1024, end++;
    else if (*end == 'G' || *end == 'g')
        mul = 1024.0 * 1024 * 1024, end++;
    if (*end == 'B' || *end == 'b') end++;
    if (*end || v * mul > 1099511627776.0) return -1;
    *out = (size_t)(v * mul);
    return 0;
}

/* A whole decimal number in lo..hi (atoi took "abc" as 0 and overflowed silently). */
static int parse_int(const char *s, long lo, long hi, int *out) {
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (end == s || *end || errno || v < lo || v > hi) return -1;
    *out = (int)v;
    return 0;
}

static void usage(FILE *f) {
    fprintf(f,
            "usage: ringtrain bench comm [options]\n\n"
            "Time collectives per size, nccl-tests style: size, count, time(us), algbw, busbw (GB/s), #wrong.\n\n"
            "  --nproc N            fork N local ranks (default 2); 0: take ranks from the environment\n"
            "  --no-bind            do not pin forked rank r to CPU r (pinned by default when N <= CPUs,\n"
            "                       as mpirun binds to cores by default)\n"
            "  --init METHOD        rendezvous without --nproc (default env://)\n"
            "  --transport T        tcp | shm | auto (default shm)\n"
            "  --min-size S         smallest size, e.g. 8, 4K, 1M (default 8)\n"
            "  --max-size S         largest size (default 64M; nccl-tests go to 256M)\n"
            "  --collective C,...   all_reduce broadcast reduce all_gather reduce_scatter | all (default all_reduce)\n"
            "  --algo A,...         ring naive rsag | all (default all; broadcast/reduce: ring=chain, naive=flat)\n"
            "  --iters N            timed iterations per size (default: by size, 5..200)\n"
            "  --warmup N           untimed iterations first (default 2)\n"
            "  --compare            all_reduce vs reduce+broadcast vs reduce_scatter+all_gather side by side\n"
            "  --json FILE          write all rows (and `ringtrain info --json`) to FILE\n"
            "  --timeout S          dist timeout (default 120)\n");
}

static int parse_list(const char *s, const char *const *names, int n, int *mask) {
    *mask = 0;
    char buf[256];
    snprintf(buf, sizeof buf, "%s", s);
    for (char *tok = strtok(buf, ","); tok; tok = strtok(NULL, ",")) {
        if (strcmp(tok, "all") == 0) {
            *mask = (1 << n) - 1;
            continue;
        }
        int found = 0;
        for (int i = 0; i < n; i++)
            if (strcmp(tok, names[i]) == 0) *mask |= 1 << i, found = 1;
        if (!found) return -1;
    }
    return *mask ? 0 : -1; /* "," names nothing */
}

static double busbw_factor(coll c, int n) {
    switch (c) {
    case C_ALLREDUCE:
        return 2.0 * (n - 1) / n;
    case C_ALLGATHER:
    case C_REDUCESCATTER:
        return (double)(n - 1) / n;
    default:
        return 1.0;
    }
}

static float pat(size_t i) { return (float)((i % 7) + 1); }

typedef struct bufs {
    float *a, *b;
} bufs;

/* One operation of collective c with algorithm a over `size` bytes. */
static rt_status run_op(rt_pg *pg, coll c, rt_algo a, bufs *B, size_t count) {
    int n = rt_pg_size(pg);
    rt_pg_set_algo(pg, a);
    switch (c) {
    case C_ALLREDUCE:
        return rt_all_reduce(pg, B->a, count, RT_F32, RT_OP_SUM);
    case C_BCAST:
        return rt_broadcast(pg, B->a, count, RT_F32, 0);
    case C_REDUCE:
        return rt_reduce(pg, B->a, count, RT_F32, RT_OP_SUM, 0);
    case C_ALLGATHER:
        return rt_all_gather(pg, B->a, B->b, count / (size_t)n, RT_F32);
    case C_REDUCESCATTER:
        return rt_reduce_scatter(pg, B->a, B->b, count / (size_t)n, RT_F32, RT_OP_SUM);
    default:
        return RT_ERROR(RT_ERR_INVALID, "collective %d", (int)c);
    }
}

static void fill(rt_pg *pg, coll c, bufs *B, size_t count) {
    int r = rt_pg_rank(pg);
    for (size_t i = 0; i < count; i++) B->a[i] = (float)(r + 1) * pat(i);
    (void)c;
}

static long long count_wrong(rt_pg *pg, coll c, bufs *B, size_t count) {
    int n = rt_pg_size(pg), r = rt_pg_rank(pg);
    float tri = (float)(n * (n + 1) / 2);
    long long wrong = 0;
    size_t per = count / (size_t)n;
    switch (c) {
    case C_ALLREDUCE:
        for (size_t i = 0; i < count; i++) wrong += B->a[i] != pat(i) * tri;
        break;
    case C_BCAST:
        for (size_t i = 0; i < count; i++) wrong += B->a[i] != pat(i);
        break;
    case C_REDUCE:
        if (r == 0)
            for (size_t i = 0; i < count; i++) wrong += B->a[i] != pat(i) * tri;
        break;
    case C_ALLGATHER:
        for (int k = 0; k < n; k++)
            for (size_t i = 0; i < per; i++) wrong += B->b[(size_t)k * per + i] != (float)(k + 1) * pat(i);
        break;
    case C_REDUCESCATTER:
        for (size_t i = 0; i < per; i++) wrong += B->b[i] != pat((size_t)r * per + i) * tri;
        break;
    default:
        break;
    }
    return wrong;
}

static rt_status bench_one(rt_pg *pg, const opts *o, coll c, rt_algo a, size_t size, bufs *B, row *out) {
    int n = rt_pg_size(pg);
    size_t count = size / sizeof(float);
    if ((c == C_ALLGATHER || c == C_REDUCESCATTER) && count % (size_t)n) count -= count % (size_t)n;
    int iters = o->iters;
    if (iters <= 0) {
        double it = (double)(64u << 20) / (double)(size ? size : 1);
        iters = it > 200 ? 200 : it < 5 ? 5 : (int)it;
    }
    fill(pg, c, B, count);
    for (int i = 0; i < o->warmup; i++) RT_CHECK(run_op(pg, c, a, B, count));
    RT_CHECK(rt_barrier(pg));
    uint64_t t0 = rt_now_ns();
    for (int i = 0; i < iters; i++) RT_CHECK(run_op(pg, c, a, B, count));
    double us = (double)(rt_now_ns() - t0) / 1e3 / iters;
    RT_CHECK(rt_all_reduce(pg, &us, 1, RT_F64, RT_OP_MAX));
    fill(pg, c, B, count);
    RT_CHECK(run_op(pg, c, a, B, count));
    long long wrong = count_wrong(pg, c, B, count);
    RT_CHECK(rt_all_reduce(pg, &wrong, 1, RT_I64, RT_OP_SUM));
    size_t bytes = count * sizeof(float);
    out->c = c;
    out->a = a;
    out->size = bytes;
    out->count = count;
    out->time_us = us;
    out->algbw = us > 0 ? (double)bytes / (us * 1e-6) / 1e9 : 0;
    out->busbw = out->algbw * busbw_factor(c, n);
    out->wrong = wrong;
    return RT_OK;
}

static void print_row(const row *r) {
    printf("%12zu %12zu %-15s %-6s %11.1f %8.3f %8.3f %7lld\n", r->size, r->count, k_coll[r->c], rt_algo_name(r->a),
           r->time_us, r->algbw, r->busbw, r->wrong);
    fflush(stdout);
}

static int rank_main(const opts *o, int rank, int port) {
    rt_pg_options po;
    rt_pg_options_default(&po);
    char method[64];
    if (o->nproc > 0) {
        snprintf(method, sizeof method, "tcp://127.0.0.1:%d", port);
        po.init_method = method;
        po.rank = rank;
        po.world_size = o->nproc;
    } else {
        po.init_method = o->init;
    }
    po.transport = o->transport;
    po.timeout_s = o->timeout_s;
    rt_pg *pg;
    if (rt_pg_init(&po, &pg) != RT_OK) return rt_cli_fail();
    int me = rt_pg_rank(pg), n = rt_pg_size(pg);
    bufs B;
    size_t cap = o->max_size + 64;
    B.a = malloc(cap);
    B.b = malloc(cap);
    if (!B.a || !B.b) {
        fprintf(stderr, "ringtrain bench comm: out of memory (%zu bytes)\n", cap);
        return 1;
    }
    memset(B.a, 0, cap);
    memset(B.b, 0, cap);
    row *rows = NULL;
    int nrows = 0, caprows = 0;
    if (me == 0) {
        printf("# ringtrain bench comm: %d ranks, transport %s, f32, sizes %zu..%zu bytes\n", n,
               rt_transport_name(rt_pg_transport(pg)), o->min_size, o->max_size);
        if (!o->compare)
            printf("%12s %12s %-15s %-6s %11s %8s %8s %7s\n", "size(B)", "count", "collective", "algo", "time(us)",
                   "algbw", "busbw", "#wrong");
    }
    int status = 0;
    for (size_t size = o->min_size; size <= o->max_size && !status; size = size ? size * 2 : 8) {
        row cmp[3];
        int ncmp = 0;
        for (int c = 0; c < C_COUNT && !status; c++) {
            if (!(o->coll_mask & (1 << c))) continue;
            for (int a = 0; a < 3; a++) {
                if (!(o->algo_mask & (1 << a))) continue;
                if ((c == C_ALLGATHER || c == C_REDUCESCATTER) && a != RT_ALGO_RING) continue;
                if ((c == C_BCAST || c == C_REDUCE) && a == RT_ALGO_RSAG) continue;
                row r;
                if (bench_one(pg, o, (coll)c, (rt_algo)a, size, &B, &r) != RT_OK) {
                    status = rt_cli_fail();
                    break;
                }
                if (me == 0) {
                    if (nrows == caprows) {
                        caprows = caprows ? 2 * caprows : 64;
                        rows = realloc(rows, (size_t)caprows * sizeof *rows);
                        if (!rows) return 1;
                    }
                    rows[nrows++] = r;
                    if (o->compare && c == C_ALLREDUCE && ncmp < 3)
                        cmp[ncmp++] = r;
                    else if (!o->compare)
                        print_row(&r);
                }
            }
        }
        if (me == 0 && o->compare && ncmp == 3) {
            if (size == o->min_size)
                printf("%12s %14s %14s %14s  %-10s %7s\n", "size(B)", "ring(us)", "reduce+bcast", "rs+ag(us)",
                       "fastest", "#wrong");
            int best = 0;
            for (int k = 1; k < 3; k++)
                if (cmp[k].time_us < cmp[best].time_us) best = k;
            static const char *const nm[3] = {"ring", "reduce+bcast", "rs+ag"};
            printf("%12zu %14.1f %14.1f %14.1f  %-12s %5lld\n", cmp[0].size, cmp[0].time_us, cmp[1].time_us,
                   cmp[2].time_us, nm[best], cmp[0].wrong + cmp[1].wrong + cmp[2].wrong);
            fflush(stdout);
        }
        if (size == 0) break;
    }
    if (me == 0 && o->json && !status) {
        FILE *f = fopen(o->json, "w");
        if (!f) {
            fprintf(stderr, "ringtrain bench comm: cannot write %s\n", o->json);
            status = 1;
        } else {
            fprintf(f,
                    "{\"benchmark\": \"comm\", \"nproc\": %d, \"transport\": \"%s\", \"dtype\": \"f32\",\n \"info\": ",
                    n, rt_transport_name(rt_pg_transport(pg)));
            rt_cli_info_json(f);
            fprintf(f, ",\n \"rows\": [\n");
            for (int i = 0; i < nrows; i++)
                fprintf(
                    f,
                    "  {\"collective\": \"%s\", \"algo\": \"%s\", \"size\": %zu, \"count\": %zu, \"time_us\": %.3f, "
                    "\"algbw_GBps\": %.4f, \"busbw_GBps\": %.4f, \"wrong\": %lld}%s\n",
                    k_coll[rows[i].c], rt_algo_name(rows[i].a), rows[i].size, rows[i].count, rows[i].time_us,
                    rows[i].algbw, rows[i].busbw, rows[i].wrong, i + 1 < nrows ? "," : "");
            fprintf(f, " ]}\n");
            fclose(f);
        }
    }
    long long bad = 0;
    for (int i = 0; i < nrows; i++) bad += rows[i].wrong;
    free(rows);
    free(B.a);
    free(B.b);
    rt_pg_destroy(pg);
    if (bad && !status) {
        fprintf(stderr, "ringtrain bench comm: %lld wrong elements\n", bad);
        status = 1;
    }
    return status;
}

static int free_port(void) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sa;
    memset(&sa, 0, sizeof sa);
    sa.sin_family = AF_INET;
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t sl = sizeof sa;
    int port = 0;
    if (fd >= 0 && bind(fd, (struct sockaddr *)&sa, sizeof sa) == 0 &&
        getsockname(fd, (struct sockaddr *)&sa, &sl) == 0)
        port = ntohs(sa.sin_port);
    if (fd >= 0) close(fd);
    return port;
}

int rt_cmd_bench_comm(int argc, char **argv) {
    opts o = {.nproc = 2,
              .transport = RT_TRANSPORT_SHM,
              .min_size = 8,
              .max_size = 64u << 20,
              .coll_mask = 1 << C_ALLREDUCE,
              .algo_mask = 7,
              .iters = 0,
              .warmup = 2,
              .init = "env://",
              .timeout_s = 120,
              .bind = true};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (rt_cli_is_help(a)) {
            usage(stdout);
            return 0;
        }
        if (strcmp(a, "--no-bind") == 0) {
            o.bind = false;
            continue;
        }
        if (strcmp(a, "--compare") == 0) {
            o.compare = true;
            o.coll_mask = 1 << C_ALLREDUCE;
            o.algo_mask = 7;
            continue;
        }
        if (!v) {
            fprintf(stderr, "ringtrain bench comm: %s needs a value (try --help)\n", a);
            return 2;
        }
        i++;
        int bad = 0;
        const char *want = NULL; /* what a bad value should have been */
        if (strcmp(a, "--nproc") == 0) {
            want = "an integer in 0..64";
            bad = parse_int(v, 0, 64, &o.nproc) != 0;
        } else if (strcmp(a, "--init") == 0) {
            o.init = v;
        } else if (strcmp(a, "--transport") == 0) {
            want = "tcp, shm or auto";
            bad = rt_transport_parse(v, &o.transport) != 0 || o.transport == RT_TRANSPORT_NCCL;
        } else if (strcmp(a, "--min-size") == 0) {
            want = "a size in bytes such as 8, 4K, 1M";
            bad = parse_size(v, &o.min_size) != 0;
        } else if (strcmp(a, "--max-size") == 0) {
            want = "a size in bytes such as 8, 4K, 1M, at most 4G";
            bad = parse_size(v, &o.max_size) != 0 || o.max_size > (4ull << 30);
        } else if (strcmp(a, "--collective") == 0) {
            want = "a comma-separated list of all_reduce broadcast reduce all_gather reduce_scatter, or all";
            bad = parse_list(v, k_coll, C_COUNT, &o.coll_mask) != 0;
        } else if (strcmp(a, "--algo") == 0) {
            static const char *const an[3] = {"ring", "naive", "rsag"};
            want = "a comma-separated list of ring naive rsag, or all";
            bad = parse_list(v, an, 3, &o.algo_mask) != 0;
        } else if (strcmp(a, "--iters") == 0) {
            want = "an integer in 1..1000000";
            bad = parse_int(v, 1, 1000000, &o.iters) != 0;
        } else if (strcmp(a, "--warmup") == 0) {
            want = "an integer in 0..1000000";
            bad = parse_int(v, 0, 1000000, &o.warmup) != 0;
        } else if (strcmp(a, "--json") == 0) {
            o.json = v;
        } else if (strcmp(a, "--timeout") == 0) {
            char *end;
            want = "seconds, above 0 and at most 86400";
            o.timeout_s = strtod(v, &end);
            bad = end == v || *end || !(o.timeout_s > 0 && o.timeout_s <= 86400);
        } else {
            fprintf(stderr, "ringtrain bench comm: unknown option '%s' (try --help)\n", a);
            return 2;
        }
        if (bad) {
            fprintf(stderr, "ringtrain bench comm: %s '%s': expected %s\n", a, v, want);
            return 2;
        }
    }
    if (o.min_size < 8) o.min_size = 8;
    if (o.min_size > o.max_size) {
        fprintf(stderr, "ringtrain bench comm: --min-size %zu is above --max-size %zu\n", o.min_size, o.max_size);
        return 2;
    }
    if (o.nproc == 0) return rank_main(&o, -1, 0);
    int port = free_port();
    pid_t pids[64];
    fflush(stdout);
    for (int r = 0; r < o.nproc; r++) {
        pids[r] = fork();
        if (pids[r] < 0) {
            perror("fork");
            return 1;
        }
        if (pids[r] == 0) {
            if (r != 0 && !freopen("/dev/null", "w", stdout)) _exit(1);
            long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
            if (o.bind && ncpu > 0 && o.nproc <= ncpu) { /* one core per rank, as mpirun binds by default */
                cpu_set_t set;
                CPU_ZERO(&set);
                CPU_SET(r % ncpu, &set);
                if (sched_setaffinity(0, sizeof set, &set) != 0) perror("sched_setaffinity");
            }
            _exit(rank_main(&o, r, port));
        }
    }
    int rc = 0;
    for (int r = 0; r < o.nproc; r++) {
        int st;
        waitpid(pids[r], &st, 0);
        int code = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
        if (code && !rc) {
            rc = code;
            fprintf(stderr, "ringtrain bench comm: rank %d exited with %d\n", r, code);
        }
    }
    return rc ? 1 : 0;
}
