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

typedef struct rt_flight_entry {
    uint64_t id;  /* 0: empty slot */
    uint32_t seq; /* the wire sequence number (collectives); p2p: 0 */
    int kind;     /* rt_comm_kind */
    bool is_send;
    rt_dtype dtype;
    size_t count;
    int peer; /* root (collectives) or peer (p2p), group ranks */
    const char *algo;
    rt_flight_state state;
    uint64_t t_queued, t_started, t_done; /* ns since the recorder's creation; 0: not reached */
} rt_flight_entry;

typedef struct rt_flight {
    pthread_mutex_t mu;
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
uint64_t rt_flight_begin(rt_flight *f, int kind, bool is_send, rt_dtype dtype, size_t count, int peer,
                         const char *algo);
void rt_flight_set_seq(rt_flight *f, uint64_t id, uint32_t seq);
void rt_flight_started(rt_flight *f, uint64_t id);
/* done (ok) or failed; only the first end counts */
void rt_flight_end(rt_flight *f, uint64_t id, bool ok);
/* JSON of the buffer, oldest first (rank, world size: the group's). */
rt_status rt_flight_dump(rt_flight *f, int rank, int world, int group, const char *path);

#endif
