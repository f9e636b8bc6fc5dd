/* The flight recorder: a process group's last N operations (docs/dist.md, "Flight
 * recorder"). One fixed array allocated with the group; recording takes the recorder's
 * small mutex, never allocates, and may be called from any thread (the progress thread
 * completes asynchronous requests). An entry is named by its id (1, 2, ...: the order in
 * which this group began its operations); slot = (id - 1) % cap, so a late completion of
 * an entry already overwritten by a newer one is ignored. */
#ifndef RT_DIST_FLIGHT_H
#define RT_DIST_FLIGHT_H

#include "core/status.h"
#include "core/tensor.h"

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

typedef enum rt_flight_state {
    RT_FLIGHT_QUEUED = 0, /* called, not yet handed to the transport */
    RT_FLIGHT_STARTED,    /* handed to the engine / enqueued on the nccl stream */
    RT_FLIGHT_DONE,
    RT_FLIGHT_FAILED,
} rt_flight_state;

#define RT_FLIGHT_TAG 64

typedef struct rt_flight_entry {
    uint64_t id;  /* 0: empty slot */
    uint32_t seq; /* the wire sequence number (collectives); p2p: the n-th message to/from that peer */
    int kind;     /* rt_comm_kind */
    bool is_send;
    rt_dtype dtype;
    size_t count;
    int peer; /* root (collectives) or peer (p2p), group ranks */
    int rop;  /* rt_reduce_op (reducing operations), else -1 */
    const char *algo;
    char tag[RT_FLIGHT_TAG]; /* the caller's context (rt_pg_set_tag), "" when none */
    rt_flight_state state;
    uint64_t t_queued, t_started, t_done; /* ns since the recorder's creation; 0: not reached */
} rt_flight_entry;

struct rt_flight_cell;

typedef struct rt_flight {
    pthread_mutex_t mu;
    struct rt_flight_cell *cell; /* NULL, or a shared page this recorder keeps current (below) */
    rt_flight_entry *e;
    uint32_t cap;
    uint64_t next_id;
    uint64_t t0_ns;     /* rt_now_ns() at creation */
    int64_t t0_wall_ns; /* CLOCK_REALTIME at creation */
} rt_flight;

/* cap 0: a disabled recorder (every call is a no-op, the dump has no entries). */
rt_status rt_flight_init(rt_flight *f, uint32_t cap);
void rt_flight_destroy(rt_flight *f);
/* A new entry, queued now; returns its id (0 when disabled). */
uint64_t rt_flight_begin(rt_flight *f, int kind, bool is_send, rt_dtype dtype, size_t count, int peer, int rop,
                         const char *algo, const char *tag);
void rt_flight_set_seq(rt_flight *f, uint64_t id, uint32_t seq);
void rt_flight_started(rt_flight *f, uint64_t id);
/* done (ok) or failed; only the first end counts */
void rt_flight_end(rt_flight *f, uint64_t id, bool ok);
/* The id of the newest entry if it is an all-reduce of `count` elements, else 0. */
uint64_t rt_flight_last_allreduce(rt_flight *f, size_t count);
/* Entry `id` if it is still in the buffer: its end on rt_now_ns()'s clock (*done_ns, 0
 * while it has not ended) and its algorithm; false when disabled or overwritten. */
bool rt_flight_end_of(rt_flight *f, uint64_t id, uint64_t *done_ns, const char **algo);
/* JSON of the buffer, oldest first (rank, world size: the group's). */
rt_status rt_flight_dump(rt_flight *f, int rank, int world, int group, const char *path);

/* ---- hangs and desyncs (docs/dist.md, "Hangs and desyncs") ----
 * A collective's fingerprint: what every rank must agree on at one sequence number. */
typedef struct rt_flight_fp {
    uint32_t seq; /* 0: none */
    int kind, rop, dtype, root;
    uint64_t count;
    char tag[RT_FLIGHT_TAG];
} rt_flight_fp;

/* What one rank publishes about itself (the store key rt/fr/<group>/<rank>): the oldest
 * collectives it has begun and not finished (up to RT_FLIGHT_PENDING, oldest first), how
 * long it has waited in the oldest, and its last completed collective. */
#define RT_FLIGHT_PENDING 4
typedef struct rt_flight_state_rec {
    bool present; /* the rank published (false: it is stopped, hung, or dead) */
    /* not published: read from its shared page (rt_flight_cell) when it is on this host */
    bool from_cell;
    rt_flight_fp begun; /* with from_cell: the last collective it began */
    int npending;
    rt_flight_fp pending[RT_FLIGHT_PENDING]; /* oldest first */
    double wait_s;                           /* in pending[0] */
    rt_flight_fp last_done;                  /* seq 0: none */
} rt_flight_state_rec;

/* A page of shared memory (a memfd, readable by the other ranks of the host through
 * /proc/<pid>/fd/<n>) where the recorder keeps the last collective it began and the last
 * it completed: a rank that is stopped or hung cannot publish anything, but its peers
 * can still read this. Writers bump `gen` to odd before and to even after a change. */
#define RT_FLIGHT_CELL_MAGIC 0x52544643u
typedef struct rt_flight_cell {
    uint32_t magic;
    uint32_t gen;
    uint32_t last_begun;                    /* the sequence number of the last collective begun */
    rt_flight_fp begun[RT_FLIGHT_PENDING];  /* the last ones begun, at [seq % RT_FLIGHT_PENDING] */
    uint64_t t_begun_ns[RT_FLIGHT_PENDING]; /* rt_now_ns() (CLOCK_MONOTONIC: one clock per host) when each began */
    rt_flight_fp last_done;
} rt_flight_cell;
/* The bytes of a cell's memfd (one page; the peers map this much) and its name. */
#define RT_FLIGHT_CELL_BYTES 4096
#define RT_FLIGHT_CELL_NAME "ringtrain-flight"
/* Open a peer's cell for reading through `path` (/proc/<pid>/fd/<n>): a descriptor, or -1
 * when the path is not such a cell (a reused pid or another pid namespace can point it at
 * anything): never blocks (a FIFO), and the file is a regular memfd named
 * RT_FLIGHT_CELL_NAME of at least RT_FLIGHT_CELL_BYTES (a shorter one: SIGBUS on read). */
int rt_flight_cell_open(const char *path);
/* A consistent copy of a cell (false: not a cell, or it kept changing). */
bool rt_flight_cell_read(const volatile rt_flight_cell *c, rt_flight_cell *out);

/* This recorder's state now (collectives only). */
void rt_flight_get_state(rt_flight *f, rt_flight_state_rec *out);
/* The fingerprint of entry `id` (false: overwritten or none). */
bool rt_flight_fp_of(rt_flight *f, uint64_t id, rt_flight_fp *out);
/* Fingerprints as text and back: "seq kind rop dtype root count\ntag". */
int rt_flight_fp_format(const rt_flight_fp *fp, char *buf, size_t n);
bool rt_flight_fp_parse(const char *s, rt_flight_fp *out);
/* A state as text and back: "<wait s> <npending>\n" then the last done and each pending
 * fingerprint as rt_flight_fp_format writes it, one per two lines. */
int rt_flight_state_format(const rt_flight_state_rec *s, char *buf, size_t n);
bool rt_flight_state_parse(const char *s, rt_flight_state_rec *out);
/* Whether two fingerprints disagree (tags are context, never compared). */
bool rt_flight_fp_differ(const rt_flight_fp *a, const rt_flight_fp *b);
/* "all_reduce #12 (f32 x 1000, sum, bucket 3 of 6, step 5)" */
void rt_flight_fp_describe(const rt_flight_fp *fp, char *buf, size_t n);
/* The diagnosis over every rank's state (rec[r], r = 0..n-1; missing ranks: present
 * false). Pure: the text only. Returns 1 (a desync: ranks disagree at one sequence
 * number), 2 (a rank is behind: it has not started the operation others wait in),
 * 0 (nothing to say: out is ""). */
int rt_flight_diagnose(const rt_flight_state_rec *rec, int n, char *out, size_t len);

#endif
