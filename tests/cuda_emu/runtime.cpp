/* The emulated CUDA runtime of the -DRINGTRAIN_CUDA=EMU build (docs/cuda-emulation.md,
 * include/cuda_runtime.h, emu_internal.h): a test instrument, stricter than a GPU where
 * it can be, so that the mistakes a GPU forgives by timing become wrong results here.
 *
 *  - Devices: RINGTRAIN_EMU_GPUS (default 2; 0 = no device) H100-like devices, filtered
 *    and renumbered by CUDA_VISIBLE_DEVICES; RINGTRAIN_EMU_FAIL_INIT=<cudaError number>
 *    makes initialisation (and every call that needs it) fail with that error.
 *  - Device memory: each cudaMalloc is a memfd mapped twice: the address handed out is
 *    a view WITHOUT access (a host dereference faults; the SIGSEGV handler names the
 *    allocation), the emulator works through a read-write alias. Fresh memory is 0xFF
 *    bytes (NaN floats). A freed range stays reserved without access for a while, so a
 *    use after free is named too.
 *  - Streams: a FIFO of operations executed by one worker thread per stream, with an
 *    optional random delay before each (RINGTRAIN_EMU_DELAY_US, RINGTRAIN_EMU_SEED). An
 *    operation may depend on other streams' progress (event waits, the legacy default
 *    stream's implicit synchronisation with blocking streams); the worker waits for them.
 *    Destroyed streams and events stay in memory (a graveyard), so a stale handle is
 *    cudaErrorInvalidResourceHandle, never a crash.
 *  - Copies follow the real rules: pageable sources are read at the call, pageable
 *    destinations make the call wait; pinned memory is read and written when the stream
 *    gets there.
 *  - Faults for tests: rt_emu_fail_call() (emu_internal.h) makes the nth next call of a
 *    runtime function fail; RINGTRAIN_EMU_FAIL_CALL=<call>:<n> arms it at start.
 *  - Counters: host synchronisations (RINGTRAIN_EMU_SYNC_LOG logs each), launches,
 *    operations, live allocations, graph launches; RINGTRAIN_EMU_STATS=<path> appends
 *    them at exit.
 *  - Stream capture and graphs, with CUDA's rules (the section "stream capture"): an
 *    operation on a capturing stream is recorded, not run, with the arguments it had at
 *    the call; a replay runs the recorded operations again, in the order they were
 *    captured, as one operation of the stream it is launched into.
 *
 * One mutex (G.m) guards every queue, stream and event; G.mem guards the memory tables.
 * Nothing is freed at exit: workers may still run (or wait for an NCCL peer) while the
 * process exits, and they must find their state intact.
 */
#ifndef RT_EMU_FULL_RUNTIME
#error                                                                                                                 \
    "runtime.cpp is the full emulated runtime: compile it, emu.cpp and every file that includes <cuda_runtime.h> with -DRT_EMU_FULL_RUNTIME"
#endif

#include "emu_internal.h"
#include "core/cost_ledger.h"
#include "topology.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include <condition_variable>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <thread>
#include <unordered_set>
#include <utility>
#include <vector>

extern "C" const int rt_emu_kernels_with_full_runtime; /* emu.cpp built for the full runtime */

namespace {

struct op;
struct capture;

} // namespace

/* a stream: the handle the program holds is a pointer to it */
struct CUstream_st {
    int device;
    unsigned flags;
    int priority;
    bool legacy;    /* the device's legacy default stream */
    bool destroyed; /* by cudaStreamDestroy: the worker drains the queue and ends */
    unsigned long long serial;
    std::deque<op *> queue;
    unsigned long long enqueued = 0, completed = 0; /* operation numbers, 1-based */
    std::condition_variable work;                   /* the worker waits for operations */
    uint64_t rng;
    capture *cap = nullptr; /* the capture sequence it takes part in, or none */
    uint64_t vt_ns = 0;     /* its emulated clock (with a topology: topology.h); G.m held */
};

/* an event: the stream position of its latest record */
struct CUevent_st {
    int device;
    unsigned flags;
    bool destroyed;
    CUstream_st *stream; /* NULL: never recorded (complete) */
    unsigned long long seq;
    unsigned long long generation; /* of the latest record */
    uint64_t time_ns;              /* when the worker reached the latest record */
    uint64_t vt_ns = 0;            /* the stream's emulated clock there (with a topology) */
    /* a record in a capturing stream (the latest record, then): the capture's id, the
     * stream and its position there; 0 when the latest record ran on a stream */
    unsigned long long cap_id = 0;
    CUstream_st *cap_stream = nullptr;
    size_t cap_pos = 0;
};

namespace {

/* ---- state ------------------------------------------------------------------------ */

const size_t DEVICE_BYTES = (size_t)80 << 30;
const size_t FREED_KEPT = 4096; /* freed ranges kept reserved (named on a host access) */

struct dependency {
    CUstream_st *stream;
    unsigned long long seq; /* runs once stream->completed >= seq */
};

struct op {
    void (*fn)(void *);
    void *arg;
    void (*cleanup)(void *);
    const char *what;
    std::vector<dependency> deps;
    unsigned long long seq;
    uint64_t host_vt = 0; /* the host's emulated time at the call: the op starts no earlier */
};

struct allocation {
    uintptr_t base;
    size_t size, mapped;
    char *alias; /* the emulator's read-write view; NULL once freed */
    int device;
    unsigned long long serial;
};

struct device_state {
    CUstream_st *legacy = nullptr;
    std::vector<CUstream_st *> streams; /* every stream ever created on it */
    size_t used = 0;
};

struct config {
    int physical = 2;         /* RINGTRAIN_EMU_GPUS */
    std::vector<int> visible; /* device -> physical index */
    int fail_init = 0;
    unsigned delay_us = 0;
    uint64_t seed = 0;
    const char *stats_path = nullptr;
    int sync_log_fd = -1;
};

struct runtime_state {
    std::once_flag once;
    config cfg;
    std::mutex m;                   /* streams, events, queues */
    std::condition_variable progress; /* some stream completed an operation */
    std::vector<device_state> dev;
    std::unordered_set<CUstream_st *> streams; /* live user streams */
    std::unordered_set<CUevent_st *> events;   /* live events */
    unsigned long long stream_serial = 0;

    std::mutex mem;
    std::map<uintptr_t, allocation *> allocs; /* live and recently freed, by base */
    std::deque<allocation *> freed;
    std::map<uintptr_t, size_t> pinned;
    unsigned long long alloc_serial = 0, allocs_live = 0;

    unsigned long long host_syncs = 0, ops = 0, graph_launches = 0; /* atomics */
    std::map<unsigned long long, capture *> captures;              /* active capture sequences, by id */
    unsigned long long capture_serial = 0;
    struct sigaction old_segv;
    /* the emulated clock (only with RINGTRAIN_EMU_TOPOLOGY, topology.h): the host's time is
     * the latest stream time it has waited for; copies advance their stream's clock by
     * their modelled time, event waits carry it across streams, events read it. G.m held. */
    uint64_t host_vt = 0;
    std::set<std::pair<int, int>> peers; /* (device, peer): cudaDeviceEnablePeerAccess, physical */
};

/* never destroyed: workers may outlive main() */
runtime_state &G = *new runtime_state;

thread_local int t_device = 0;
thread_local CUstream_st *t_running = nullptr; /* the stream this worker runs */
thread_local uint64_t t_model_ns = 0;          /* modelled time of the operation running */
thread_local cudaError_t t_last_error = cudaSuccess;
thread_local std::vector<CUstream_st *> *t_per_thread = nullptr; /* cudaStreamPerThread, by device */
thread_local cudaStreamCaptureMode t_capture_mode = cudaStreamCaptureModeGlobal; /* cudaThreadExchange... */

cudaError_t fail(cudaError_t e) {
    if (e != cudaSuccess) t_last_error = e;
    return e;
}

/* rt_emu_fail_call: one armed failure at a time */
std::mutex inject_mu;
const char *inject_call; /* NULL: none armed */
int inject_left;
cudaError_t inject_err;

/* RINGTRAIN_EMU_FAIL_CALL=<call>:<nth>: the nth call of that runtime function fails with
 * cudaErrorNotSupported (rt_emu_fail_call, for a whole program: `ringtrain train`) */
void arm_from_env(void) {
    const char *v = getenv("RINGTRAIN_EMU_FAIL_CALL");
    if (!v || !*v) return;
    const char *colon = strchr(v, ':');
    char *end = nullptr;
    long nth = colon ? strtol(colon + 1, &end, 10) : 0;
    if (!colon || colon == v || end == colon + 1 || *end || nth < 1)
        rt_emu_fatal("RINGTRAIN_EMU_FAIL_CALL=%s: expected <call>:<n>, n >= 1 (e.g. cudaStreamBeginCapture:1)", v);
    rt_emu_fail_call(strndup(v, (size_t)(colon - v)), (int)nth, cudaErrorNotSupported);
}

/* Whether this call of `call` is the armed failure (then *e is its error). */
bool injected(const char *call, cudaError_t *e) {
    std::lock_guard<std::mutex> lk(inject_mu);
    if (!inject_call || strcmp(inject_call, call) != 0 || --inject_left > 0) return false;
    inject_call = nullptr;
    *e = inject_err;
    return true;
}
#define RT_INJECTED(call)                                                                                              \
    do {                                                                                                               \
        cudaError_t ie_;                                                                                               \
        if (injected(call, &ie_)) return fail(ie_);                                                                    \
    } while (0)

uint64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

uint64_t splitmix(uint64_t *s) {
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* ---- configuration ---------------------------------------------------------------- */

long env_long(const char *name, long dflt) {
    const char *v = getenv(name);
    if (!v || !*v) return dflt;
    char *end;
    long x = strtol(v, &end, 0);
    if (*end) rt_emu_fatal("%s=%s is not a number", name, v);
    return x;
}

/* CUDA_VISIBLE_DEVICES: indices up to the first invalid one (what the driver does) */
std::vector<int> visible_devices(int physical) {
    std::vector<int> out;
    const char *v = getenv("CUDA_VISIBLE_DEVICES");
    if (!v) {
        for (int i = 0; i < physical; i++) out.push_back(i);
        return out;
    }
    const char *p = v;
    while (*p) {
        char *end;
        long x = strtol(p, &end, 10);
        if (end == p || x < 0 || x >= physical) break;
        bool dup = false;
        for (int d : out) dup |= d == x;
        if (dup) break;
        out.push_back((int)x);
        while (*end == ' ') end++;
        if (*end != ',') break;
        p = end + 1;
    }
    return out;
}

void write_stats(void) {
    if (!G.cfg.stats_path) return;
    char line[256];
    int n = snprintf(line, sizeof line,
                     "{\"host_syncs\":%llu,\"launches\":%llu,\"ops\":%llu,\"allocs_live\":%llu,"
                     "\"graph_launches\":%llu}\n",
                     rt_emu_host_syncs(), rt_emu_launch_count(), rt_emu_ops(), rt_emu_allocs_live(),
                     rt_emu_graph_launches());
    int fd = open(G.cfg.stats_path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (fd < 0) return;
    if (write(fd, line, (size_t)n) != n) { /* nothing to do at exit */
    }
    close(fd);
}

void install_segv_handler(void);

void init_once(void) {
    (void)rt_emu_kernels_with_full_runtime;
    config &c = G.cfg;
    c.physical = (int)env_long("RINGTRAIN_EMU_GPUS", 2);
    if (c.physical < 0 || c.physical > 64) rt_emu_fatal("RINGTRAIN_EMU_GPUS=%d: expected 0 to 64", c.physical);
    c.visible = visible_devices(c.physical);
    c.fail_init = (int)env_long("RINGTRAIN_EMU_FAIL_INIT", 0);
    c.delay_us = (unsigned)env_long("RINGTRAIN_EMU_DELAY_US", 0);
    c.seed = (uint64_t)env_long("RINGTRAIN_EMU_SEED", (long)getpid());
    const char *stats = getenv("RINGTRAIN_EMU_STATS");
    if (stats && *stats) c.stats_path = strdup(stats);
    arm_from_env();
    const char *log = getenv("RINGTRAIN_EMU_SYNC_LOG");
    if (log && *log) {
        c.sync_log_fd = open(log, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
        if (c.sync_log_fd < 0) rt_emu_fatal("RINGTRAIN_EMU_SYNC_LOG=%s: %s", log, strerror(errno));
    }
    G.dev.resize(c.visible.size());
    rt_emu_topo_init(c.physical);
    install_segv_handler();
    atexit(write_stats);
}

cudaError_t init(void) {
    std::call_once(G.once, init_once);
    return (cudaError_t)G.cfg.fail_init;
}

int device_count(void) { return (int)G.cfg.visible.size(); }

/* initialised, with the calling thread's device valid */
cudaError_t ready(void) {
    cudaError_t e = init();
    if (e != cudaSuccess) return e;
    if (device_count() == 0) return cudaErrorNoDevice;
    return cudaSuccess;
}

#define RT_READY()                                                                                                     \
    do {                                                                                                               \
        cudaError_t e_ = ready();                                                                                      \
        if (e_ != cudaSuccess) return fail(e_);                                                                        \
    } while (0)

/* a potentially unsafe call during a capture that forbids it (the section "stream capture") */
#define RT_CAPTURE_SAFE()                                                                                              \
    do {                                                                                                               \
        cudaError_t e_ = unsafe_call();                                                                                \
        if (e_ != cudaSuccess) return fail(e_);                                                                        \
    } while (0)

/* ---- device memory ---------------------------------------------------------------- */

size_t page_size(void) { return (size_t)sysconf(_SC_PAGESIZE); }

/* the allocation (live or recently freed) whose range holds address a; G.mem held */
allocation *find_alloc(uintptr_t a) {
    auto it = G.allocs.upper_bound(a);
    if (it == G.allocs.begin()) return nullptr;
    --it;
    allocation *al = it->second;
    return a < al->base + al->mapped ? al : nullptr;
}

/* the live allocation holding [p, p + n) (p may be its end when n == 0); G.mem held */
allocation *find_live(const void *p, size_t n) {
    uintptr_t a = (uintptr_t)p;
    allocation *al = find_alloc(a);
    if (!al && n == 0 && a > 0) al = find_alloc(a - 1); /* one past the end */
    if (!al || !al->alias) return nullptr;
    if (a + n < a || a + n > al->base + al->size) return nullptr;
    return al;
}

/* "allocation #7 of 4096 bytes on device 1 (offset 128)" */
int describe(char *buf, size_t n, const allocation *al, uintptr_t a) {
    return snprintf(buf, n, "%sallocation #%llu of %zu bytes on device %d (offset %zu)", al->alias ? "" : "freed ",
                    al->serial, al->size, al->device, (size_t)(a - al->base));
}

void segv_handler(int sig, siginfo_t *si, void *uc) {
    uintptr_t a = (uintptr_t)si->si_addr;
    bool locked = G.mem.try_lock(); /* a fault while the tables change: read them anyway */
    allocation *al = find_alloc(a);
    if (al) {
        char buf[512];
        int k = snprintf(buf, sizeof buf, "cuda emulation: host access to device memory at %p: ", (void *)a);
        k += describe(buf + k, sizeof buf - (size_t)k, al, a);
        k += snprintf(buf + k, sizeof buf - (size_t)k, "\n");
        if (write(2, buf, (size_t)k) < 0) { /* nothing else to do */
        }
        abort();
    }
    if (locked) G.mem.unlock();
    /* not ours: the previous handler, or the default action when the access repeats */
    if ((G.old_segv.sa_flags & SA_SIGINFO) && G.old_segv.sa_sigaction) {
        G.old_segv.sa_sigaction(sig, si, uc);
        return;
    }
    if (G.old_segv.sa_handler != SIG_DFL && G.old_segv.sa_handler != SIG_IGN) {
        G.old_segv.sa_handler(sig);
        return;
    }
    signal(SIGSEGV, SIG_DFL);
}

void install_segv_handler(void) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = segv_handler;
    sa.sa_flags = SA_SIGINFO | SA_ONSTACK;
    sigemptyset(&sa.sa_mask);
    if (sigaction(SIGSEGV, &sa, &G.old_segv) != 0) rt_emu_fatal("sigaction(SIGSEGV): %s", strerror(errno));
}

/* the two views of fresh shared pages: handed-out (no access) and alias (read-write) */
bool map_twice(size_t mapped, void **view, void **alias) {
    int fd = memfd_create("rt_emu_device", MFD_CLOEXEC);
    if (fd < 0) return false;
    bool ok = ftruncate(fd, (off_t)mapped) == 0;
    *view = ok ? mmap(nullptr, mapped, PROT_NONE, MAP_SHARED, fd, 0) : MAP_FAILED;
    *alias = *view != MAP_FAILED ? mmap(nullptr, mapped, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0) : MAP_FAILED;
    close(fd);
    if (*alias == MAP_FAILED) {
        if (*view != MAP_FAILED) munmap(*view, mapped);
        return false;
    }
    return true;
}

/* keep the freed range reserved without access (releasing its pages); forget the
 * oldest freed range beyond FREED_KEPT. G.mem held. */
void retire(allocation *al) {
    munmap(al->alias, al->mapped);
    al->alias = nullptr;
    mmap((void *)al->base, al->mapped, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED, -1, 0);
    G.freed.push_back(al);
    if (G.freed.size() > FREED_KEPT) {
        allocation *old = G.freed.front();
        G.freed.pop_front();
        G.allocs.erase(old->base);
        munmap((void *)old->base, old->mapped);
        delete old;
    }
}

/* ---- pinned host memory ----------------------------------------------------------- */

/* G.mem held */
bool pinned_holds(const void *p, size_t n) {
    uintptr_t a = (uintptr_t)p;
    auto it = G.pinned.upper_bound(a);
    if (it == G.pinned.begin()) return false;
    --it;
    return a >= it->first && a + n >= a && a + n <= it->first + it->second;
}

/* where a copy's operand lies */
enum place { DEVICE, PINNED, PAGEABLE, INVALID };

/* and, for device memory, the emulator's alias of it */
place classify(const void *p, size_t n, char **alias) {
    std::lock_guard<std::mutex> lk(G.mem);
    allocation *al = find_live(p, n);
    if (al) {
        *alias = al->alias + ((uintptr_t)p - al->base);
        return DEVICE;
    }
    if (find_alloc((uintptr_t)p) || find_alloc((uintptr_t)p + (n ? n - 1 : 0))) return INVALID; /* freed, overrun */
    *alias = (char *)p;
    return pinned_holds(p, n) ? PINNED : PAGEABLE;
}

/* ---- streams ---------------------------------------------------------------------- */

void worker_main(CUstream_st *st);

/* G.m held */
CUstream_st *new_stream(int device, unsigned flags, int priority, bool legacy) {
    CUstream_st *st = new CUstream_st;
    st->device = device;
    st->flags = flags;
    st->priority = priority;
    st->legacy = legacy;
    st->destroyed = false;
    st->serial = ++G.stream_serial;
    st->rng = G.cfg.seed ^ (st->serial * 0x2545F4914F6CDD1Dull);
    G.dev[(size_t)device].streams.push_back(st);
    std::thread(worker_main, st).detach();
    return st;
}

/* G.m held */
CUstream_st *legacy_stream(int device) {
    device_state &d = G.dev[(size_t)device];
    if (!d.legacy) d.legacy = new_stream(device, 0, 0, true);
    return d.legacy;
}

/* the stream a handle names (0 / legacy / per-thread: the current device's); NULL for an
 * invalid handle. G.m held. */
CUstream_st *resolve(cudaStream_t s) {
    if (s == nullptr || s == cudaStreamLegacy) return legacy_stream(t_device);
    if (s == cudaStreamPerThread) {
        if (!t_per_thread) t_per_thread = new std::vector<CUstream_st *>(G.dev.size(), nullptr);
        CUstream_st *&st = (*t_per_thread)[(size_t)t_device];
        if (!st) st = new_stream(t_device, cudaStreamDefault, 0, false);
        return st;
    }
    return G.streams.count(s) ? s : nullptr;
}

bool blocking(const CUstream_st *st) { return !st->legacy && !(st->flags & cudaStreamNonBlocking); }

/* Append o to st with the legacy stream's implicit dependencies: legacy work waits for
 * the earlier work of the device's blocking streams, blocking streams wait for earlier
 * legacy work. Returns the operation's number. G.m held. */
unsigned long long enqueue_locked(CUstream_st *st, op *o) {
    device_state &d = G.dev[(size_t)st->device];
    if (st->legacy) {
        for (CUstream_st *b : d.streams)
            if (blocking(b) && b->completed < b->enqueued) o->deps.push_back({b, b->enqueued});
    } else if (blocking(st) && d.legacy && d.legacy->completed < d.legacy->enqueued) {
        o->deps.push_back({d.legacy, d.legacy->enqueued});
    }
    o->seq = ++st->enqueued;
    o->host_vt = G.host_vt;
    st->queue.push_back(o);
    st->work.notify_one();
    return o->seq;
}

op *new_op(const char *what, void (*fn)(void *), void *arg, void (*cleanup)(void *)) {
    op *o = new op;
    o->fn = fn;
    o->arg = arg;
    o->cleanup = cleanup;
    o->what = what;
    o->seq = 0;
    return o;
}

void delay(CUstream_st *st) {
    if (!G.cfg.delay_us) return;
    unsigned us = (unsigned)(splitmix(&st->rng) % (G.cfg.delay_us + 1ull));
    if (us) usleep(us);
}

void worker_main(CUstream_st *st) {
    t_running = st;
    std::unique_lock<std::mutex> lk(G.m);
    for (;;) {
        st->work.wait(lk, [st] { return !st->queue.empty() || st->destroyed; });
        if (st->queue.empty()) return; /* destroyed and drained */
        op *o = st->queue.front();
        st->queue.pop_front();
        for (const dependency &d : o->deps)
            G.progress.wait(lk, [&d] { return d.stream->completed >= d.seq; });
        if (st->vt_ns < o->host_vt) st->vt_ns = o->host_vt;
        lk.unlock();
        delay(st);
        if (o->fn) o->fn(o->arg);
        if (o->cleanup) o->cleanup(o->arg);
        __atomic_add_fetch(&G.ops, 1, __ATOMIC_RELAXED);
        lk.lock();
        st->vt_ns += t_model_ns;
        t_model_ns = 0;
        st->completed = o->seq;
        delete o;
        G.progress.notify_all();
    }
}

/* block the host until st has completed operation seq. G.m held through lk. */
void wait_for(std::unique_lock<std::mutex> &lk, CUstream_st *st, unsigned long long seq) {
    G.progress.wait(lk, [st, seq] { return st->completed >= seq; });
    if (G.host_vt < st->vt_ns) G.host_vt = st->vt_ns;
}

/* a host synchronisation with every stream of a device (cudaDeviceSynchronize, cudaFree) */
void drain_device(int device) {
    std::unique_lock<std::mutex> lk(G.m);
    std::vector<dependency> all;
    for (CUstream_st *s : G.dev[(size_t)device].streams) all.push_back({s, s->enqueued});
    for (const dependency &d : all) wait_for(lk, d.stream, d.seq);
}

/* ---- stream capture ------------------------------------------------------------------
 *
 * A capture sequence begins on one stream (cudaStreamBeginCapture) and spreads to every
 * stream that waits on an event recorded in it. While it lasts, an operation enqueued on
 * one of its streams becomes a node (the operation's function and its argument, which
 * holds the values the call was given: a host value passed at capture time is baked in)
 * instead of running. A record of an event on a capturing stream marks a position in
 * the sequence, for the waits that fork and join streams. What CUDA refuses is refused
 * with CUDA's error, and the sequence is invalidated (cudaStreamEndCapture then returns
 * cudaErrorStreamCaptureInvalidated and no graph):
 *  - a "potentially unsafe" call (allocation, free, a host synchronisation, a stream or
 *    event query) from a thread that the capture modes prohibit (cudaThreadExchange-
 *    StreamCaptureMode's rules): cudaErrorStreamCaptureUnsupported;
 *  - synchronising or querying a capturing stream, in any mode: the same;
 *  - work on the legacy default stream while a blocking stream of its device captures:
 *    cudaErrorStreamCaptureImplicit;
 *  - a copy from or to pageable host memory: cudaErrorStreamCaptureUnsupported;
 *  - waiting on an event recorded outside the sequence: cudaErrorStreamCaptureIsolation;
 *    on one of another sequence: cudaErrorStreamCaptureMerge;
 *  - querying, synchronising or timing an event whose latest record was captured:
 *    cudaErrorCapturedEvent;
 *  - ending with a forked stream that was not joined back: cudaErrorStreamCaptureUnjoined.
 * A graph runs its nodes in the order they were captured (a valid order for the edges
 * the events made: a wait is enqueued after the record it waits for). */

struct graph_node {
    void (*fn)(void *);
    void *arg;
    void (*cleanup)(void *);
    const char *what;
    void (*on_queue)(void *) = nullptr; /* rt_emu_stream_enqueue_queued: at each launch */
};

/* the nodes of a graph, shared by the graph, its instances and the launches in flight */
struct node_list {
    std::vector<graph_node> nodes;
    std::vector<rt_cost_op> costs; /* the cost ledger's records of the captured operations, replayed at each launch */
    ~node_list() {
        for (graph_node &n : nodes)
            if (n.cleanup) n.cleanup(n.arg);
    }
};

struct capture {
    unsigned long long id;
    cudaStreamCaptureMode mode;
    std::thread::id owner;
    CUstream_st *origin;
    std::vector<CUstream_st *> streams; /* the origin first, then the forked ones */
    std::shared_ptr<node_list> nodes;
    std::map<CUstream_st *, size_t> ops;    /* per stream: operations captured on it */
    std::map<CUstream_st *, size_t> joined; /* per stream: how far another stream waited */
    cudaError_t invalid = cudaSuccess;      /* the first error that invalidated it */
};

/* G.m held */
void invalidate(capture *c, cudaError_t why) {
    if (c->invalid == cudaSuccess) c->invalid = why;
}

/* Whether the calling thread may make a potentially unsafe call now; if not, the
 * captures that forbid it are invalidated and the error is returned. G.m held. */
cudaError_t unsafe_call_locked(void) {
    if (t_capture_mode == cudaStreamCaptureModeRelaxed) return cudaSuccess;
    const std::thread::id me = std::this_thread::get_id();
    cudaError_t e = cudaSuccess;
    for (auto &kv : G.captures) {
        capture *c = kv.second;
        bool mine = c->owner == me && c->mode != cudaStreamCaptureModeRelaxed;
        bool global = t_capture_mode == cudaStreamCaptureModeGlobal && c->mode == cudaStreamCaptureModeGlobal;
        if (mine || global) {
            invalidate(c, cudaErrorStreamCaptureUnsupported);
            e = cudaErrorStreamCaptureUnsupported;
        }
    }
    return e;
}

cudaError_t unsafe_call(void) {
    std::lock_guard<std::mutex> lk(G.m);
    return unsafe_call_locked();
}

/* The legacy stream's implicit dependency on a capturing blocking stream of its device
 * is refused (and invalidates that capture). G.m held. */
cudaError_t legacy_implicit(const CUstream_st *st) {
    if (!st->legacy) return cudaSuccess;
    cudaError_t e = cudaSuccess;
    for (auto &kv : G.captures)
        for (CUstream_st *s : kv.second->streams)
            if (s->device == st->device && blocking(s)) {
                invalidate(kv.second, cudaErrorStreamCaptureImplicit);
                e = cudaErrorStreamCaptureImplicit;
            }
    return e;
}

/* Enqueue o on st, or capture it where st is capturing. On an error o is deleted but
 * not its argument (the caller's, as after a failed rt_emu_stream_enqueue) and nothing
 * is enqueued. *seq: the operation's number (0 when captured). G.m held. */
cudaError_t enqueue_or_capture(CUstream_st *st, op *o, unsigned long long *seq) {
    cudaError_t e = legacy_implicit(st);
    if (e == cudaSuccess && st->cap && st->cap->invalid != cudaSuccess) e = cudaErrorStreamCaptureInvalidated;
    if (e != cudaSuccess) {
        delete o;
        return e;
    }
    if (!st->cap) {
        unsigned long long n = enqueue_locked(st, o);
        if (seq) *seq = n;
        return cudaSuccess;
    }
    if (o->fn) st->cap->nodes->nodes.push_back({o->fn, o->arg, o->cleanup, o->what});
    else if (o->cleanup) o->cleanup(o->arg);
    st->cap->ops[st]++;
    delete o;
    if (seq) *seq = 0;
    return cudaSuccess;
}

/* a launch of a graph: its nodes in order, on the launching stream's worker */
void graph_run(void *p) {
    for (graph_node &n : (*static_cast<std::shared_ptr<node_list> *>(p))->nodes)
        if (n.fn) n.fn(n.arg);
}

void graph_free(void *p) { delete static_cast<std::shared_ptr<node_list> *>(p); }

/* the capture an event's latest record belongs to, if that capture is still going */
capture *event_capture(const CUevent_st *e) {
    auto it = G.captures.find(e->cap_id);
    return e->cap_id && it != G.captures.end() ? it->second : nullptr;
}

/* synchronising or querying a capturing stream: refused in every mode. G.m held. */
cudaError_t capturing_stream_refused(CUstream_st *st) {
    if (!st->cap) return cudaSuccess;
    invalidate(st->cap, cudaErrorStreamCaptureUnsupported);
    return cudaErrorStreamCaptureUnsupported;
}

/* cudaEventRecord on a capturing stream: a position in the sequence, no operation.
 * G.m held. */
cudaError_t capture_record(CUstream_st *st, CUevent_st *e) {
    capture *c = st->cap;
    if (c->invalid != cudaSuccess) return cudaErrorStreamCaptureInvalidated;
    e->cap_id = c->id;
    e->cap_stream = st;
    e->cap_pos = ++c->ops[st];
    return cudaSuccess;
}

/* cudaStreamWaitEvent where the stream captures or the event was recorded in a capture:
 * a fork (the stream joins the event's sequence), a join, or a refusal. G.m held. */
cudaError_t capture_wait(CUstream_st *st, CUevent_st *e) {
    capture *ec = event_capture(e);
    if (!ec) { /* recorded outside any capture going on (or in one that has ended) */
        if (e->cap_id) return cudaErrorCapturedEvent;
        invalidate(st->cap, cudaErrorStreamCaptureIsolation);
        return cudaErrorStreamCaptureIsolation;
    }
    if (st->cap && st->cap != ec) {
        invalidate(st->cap, cudaErrorStreamCaptureMerge);
        invalidate(ec, cudaErrorStreamCaptureMerge);
        return cudaErrorStreamCaptureMerge;
    }
    if (ec->invalid != cudaSuccess) return cudaErrorStreamCaptureInvalidated;
    if (!st->cap) { /* a fork: st joins the sequence */
        cudaError_t imp = legacy_implicit(st);
        if (imp != cudaSuccess || st->legacy) return imp != cudaSuccess ? imp : cudaErrorStreamCaptureImplicit;
        st->cap = ec;
        ec->streams.push_back(st);
    }
    if (e->cap_stream != st) { /* a wait adds no work to st: only a dependency */
        size_t &j = ec->joined[e->cap_stream];
        if (e->cap_pos > j) j = e->cap_pos;
    }
    return cudaSuccess;
}

/* The end of a sequence: every stream leaves it, and it is gone. G.m held. */
void capture_finish(capture *c) {
    for (CUstream_st *s : c->streams) s->cap = nullptr;
    G.captures.erase(c->id);
}

/* a forked stream with work after the last point another stream waited for */
bool capture_unjoined(capture *c) {
    for (CUstream_st *s : c->streams)
        if (s != c->origin && c->joined[s] < c->ops[s]) return true;
    return false;
}

/* enqueue (fn, arg) on s and optionally wait for it; the common path of copies */
cudaError_t submit(cudaStream_t s, const char *what, void (*fn)(void *), void *arg, void (*cleanup)(void *),
                   bool wait) {
    std::unique_lock<std::mutex> lk(G.m);
    CUstream_st *st = resolve(s);
    if (!st) {
        lk.unlock();
        if (cleanup) cleanup(arg);
        return fail(cudaErrorInvalidResourceHandle);
    }
    if (wait && st->cap) { /* a synchronous operation cannot be captured */
        invalidate(st->cap, cudaErrorStreamCaptureUnsupported);
        lk.unlock();
        if (cleanup) cleanup(arg);
        return fail(cudaErrorStreamCaptureUnsupported);
    }
    if (wait) {
        cudaError_t u = unsafe_call_locked();
        if (u != cudaSuccess) {
            lk.unlock();
            if (cleanup) cleanup(arg);
            return fail(u);
        }
    }
    unsigned long long seq = 0;
    cudaError_t e = enqueue_or_capture(st, new_op(what, fn, arg, cleanup), &seq);
    if (e != cudaSuccess) {
        lk.unlock();
        if (cleanup) cleanup(arg);
        return fail(e);
    }
    if (wait) {
        wait_for(lk, st, seq);
        lk.unlock();
        rt_emu_count_host_sync(what);
    }
    return cudaSuccess;
}

/* ---- copies ----------------------------------------------------------------------- */

struct copy_op {
    void *dst;
    const void *src;
    size_t n;
    void *staging;     /* a pageable source, copied at the call */
    uint64_t model_ns; /* its modelled time (with a topology) */
};

void copy_run(void *p) {
    copy_op *c = static_cast<copy_op *>(p);
    memmove(c->dst, c->staging ? c->staging : c->src, c->n);
    t_model_ns += c->model_ns;
}

void copy_free(void *p) {
    copy_op *c = static_cast<copy_op *>(p);
    free(c->staging);
    delete c;
}

bool host_side(place p) { return p == PINNED || p == PAGEABLE; }

/* a copy's end for the topology: the physical device of device memory, or host memory */
int topo_end(const void *p, place where) {
    if (where == PINNED) return RT_EMU_HOST_PINNED;
    if (where == PAGEABLE) return RT_EMU_HOST_PAGEABLE;
    std::lock_guard<std::mutex> lk(G.mem);
    allocation *al = find_live(p, 0);
    return al ? G.cfg.visible[(size_t)al->device] : RT_EMU_HOST_PAGEABLE;
}

/* the modelled time of a copy (0 without a topology) */
uint64_t model_ns(const void *dst, place dp, const void *src, place sp, size_t n) {
    if (!rt_emu_topo_active()) return 0;
    int d = topo_end(dst, dp), s = topo_end(src, sp);
    bool peer = false;
    if (d >= 0 && s >= 0) {
        std::lock_guard<std::mutex> lk(G.m);
        peer = G.peers.count({s, d}) || G.peers.count({d, s});
    }
    return rt_emu_topo_copy_ns(s, d, n, peer);
}

/* the checks of a copy's kind against where its operands lie */
cudaError_t check_kind(cudaMemcpyKind kind, place dst, place src) {
    if (dst == INVALID || src == INVALID) return cudaErrorInvalidValue;
    switch (kind) {
    case cudaMemcpyHostToHost:
        return host_side(dst) && host_side(src) ? cudaSuccess : cudaErrorInvalidValue;
    case cudaMemcpyHostToDevice:
        return dst == DEVICE && host_side(src) ? cudaSuccess : cudaErrorInvalidValue;
    case cudaMemcpyDeviceToHost:
        return host_side(dst) && src == DEVICE ? cudaSuccess : cudaErrorInvalidValue;
    case cudaMemcpyDeviceToDevice:
        return dst == DEVICE && src == DEVICE ? cudaSuccess : cudaErrorInvalidValue;
    case cudaMemcpyDefault:
        return cudaSuccess;
    }
    return cudaErrorInvalidMemcpyDirection;
}

/* A copy on stream s. A pageable source is read now; a pageable destination makes the
 * call wait for the copy. `sync`: cudaMemcpy's rules (waits except device to device and
 * from pageable memory to the device, which return once the source is staged). */
cudaError_t copy(void *dst, const void *src, size_t n, cudaMemcpyKind kind, cudaStream_t s, bool sync,
                 const char *what) {
    RT_READY();
    char *dview = nullptr, *sview = nullptr;
    place dp = classify(dst, n, &dview), sp = classify(src, n, &sview);
    cudaError_t e = check_kind(kind, dp, sp);
    if (e != cudaSuccess) return fail(e);
    if (n == 0) return cudaSuccess;
    copy_op *c = new copy_op{dview, sview, n, nullptr, model_ns(dst, dp, src, sp, n)};
    if (sp == PAGEABLE) {
        c->staging = malloc(n);
        if (!c->staging) rt_emu_fatal("%s: out of host memory for %zu bytes", what, n);
        memcpy(c->staging, src, n);
    }
    bool wait = dp == PAGEABLE;
    if (sync) wait = !(dp == DEVICE && sp == DEVICE) && !(dp == DEVICE && sp == PAGEABLE);
    if (dp == PAGEABLE || sp == PAGEABLE) { /* a graph cannot hold a copy of pageable memory */
        std::lock_guard<std::mutex> lk(G.m);
        CUstream_st *st = resolve(s);
        if (st && st->cap) {
            invalidate(st->cap, cudaErrorStreamCaptureUnsupported);
            copy_free(c);
            return fail(cudaErrorStreamCaptureUnsupported);
        }
    }
    cudaError_t r = submit(s, what, copy_run, c, copy_free, wait);
    /* the ledger: device memory only (a host side moves over PCIe, not counted) */
    const rt_emu_cost cost{sp == DEVICE ? (double)n : 0.0, dp == DEVICE ? (double)n : 0.0, 0.0, RT_COST_MATH_NONE};
    if (r == cudaSuccess) rt_emu_ledger_record(s, RT_COST_COPY, what, &cost);
    return r;
}

struct set_op {
    void *dst;
    int value;
    size_t n;
};

void set_run(void *p) {
    set_op *c = static_cast<set_op *>(p);
    memset(c->dst, c->value, c->n);
}

void set_free(void *p) { delete static_cast<set_op *>(p); }

cudaError_t set(void *dst, int value, size_t n, cudaStream_t s, const char *what) {
    RT_READY();
    char *view = nullptr;
    if (classify(dst, n, &view) != DEVICE) return fail(cudaErrorInvalidValue);
    if (n == 0) return cudaSuccess;
    cudaError_t r = submit(s, what, set_run, new set_op{view, value, n}, set_free, false);
    const rt_emu_cost cost{0.0, (double)n, 0.0, RT_COST_MATH_NONE};
    if (r == cudaSuccess) rt_emu_ledger_record(s, RT_COST_FILL, what, &cost);
    return r;
}

/* ---- events ----------------------------------------------------------------------- */

struct record_op {
    CUevent_st *ev;
    unsigned long long generation;
};

void record_run(void *p) {
    record_op *r = static_cast<record_op *>(p);
    uint64_t t = now_ns();
    std::lock_guard<std::mutex> lk(G.m);
    if (r->ev->generation == r->generation) {
        r->ev->time_ns = t;
        r->ev->vt_ns = t_running ? t_running->vt_ns + t_model_ns : 0;
    }
}

/* cudaStreamWaitEvent's operation: the waiting stream's clock reaches the record's */
struct wait_op {
    CUevent_st *ev; /* events are never freed */
    unsigned long long generation;
};

void wait_run(void *p) {
    wait_op *w = static_cast<wait_op *>(p);
    std::lock_guard<std::mutex> lk(G.m);
    if (t_running && w->ev->generation == w->generation && t_running->vt_ns < w->ev->vt_ns)
        t_running->vt_ns = w->ev->vt_ns;
}

void wait_free(void *p) { delete static_cast<wait_op *>(p); }

void record_free(void *p) { delete static_cast<record_op *>(p); }

/* G.m held */
bool event_complete(const CUevent_st *e) { return !e->stream || e->stream->completed >= e->seq; }

/* ---- host functions --------------------------------------------------------------- */

struct host_fn_op {
    cudaHostFn_t fn;
    void *data;
};

void host_fn_run(void *p) {
    host_fn_op *h = static_cast<host_fn_op *>(p);
    h->fn(h->data);
}

void host_fn_free(void *p) { delete static_cast<host_fn_op *>(p); }

/* ---- device properties ------------------------------------------------------------ */

int pci_bus(int device) { return 0x10 + G.cfg.visible[(size_t)device]; }

void fill_properties(struct cudaDeviceProp *p, int device) {
    memset(p, 0, sizeof *p);
    snprintf(p->name, sizeof p->name, "NVIDIA H100 80GB HBM3 (emulated)");
    for (int i = 0; i < 16; i++) p->uuid.bytes[i] = (char)(0xE0 + i + 16 * G.cfg.visible[(size_t)device]);
    p->totalGlobalMem = DEVICE_BYTES;
    p->sharedMemPerBlock = 48 << 10;
    p->regsPerBlock = 65536;
    p->warpSize = 32;
    p->memPitch = 2147483647;
    p->maxThreadsPerBlock = 1024;
    p->maxThreadsDim[0] = p->maxThreadsDim[1] = 1024;
    p->maxThreadsDim[2] = 64;
    p->maxGridSize[0] = 2147483647;
    p->maxGridSize[1] = p->maxGridSize[2] = 65535;
    p->totalConstMem = 64 << 10;
    p->major = 9;
    p->minor = 0;
    p->textureAlignment = 512;
    p->texturePitchAlignment = 32;
    p->multiProcessorCount = 132;
    p->canMapHostMemory = 1;
    p->concurrentKernels = 1;
    p->ECCEnabled = 1;
    p->pciBusID = pci_bus(device);
    p->pciDeviceID = 0;
    p->pciDomainID = 0;
    p->asyncEngineCount = 3;
    p->unifiedAddressing = 1;
    p->memoryBusWidth = 5120;
    p->l2CacheSize = 50 << 20;
    p->persistingL2CacheMaxSize = 30 << 20;
    p->maxThreadsPerMultiProcessor = 2048;
    p->streamPrioritiesSupported = 1;
    p->globalL1CacheSupported = 1;
    p->localL1CacheSupported = 1;
    p->sharedMemPerMultiprocessor = 228 << 10;
    p->regsPerMultiprocessor = 65536;
    p->managedMemory = 1;
    p->concurrentManagedAccess = 1;
    p->computePreemptionSupported = 1;
    p->cooperativeLaunch = 1;
    p->sharedMemPerBlockOptin = 227 << 10;
    p->maxBlocksPerMultiProcessor = 32;
    p->reservedSharedMemPerBlock = 1 << 10;
    p->hostRegisterSupported = 1;
    p->memoryPoolsSupported = 1;
    p->clusterLaunch = 1;
}

} // namespace

/* ==== the runtime API =================================================================== */

extern "C" {

/* ---- errors ---- */

cudaError_t cudaGetLastError(void) {
    cudaError_t e = t_last_error;
    t_last_error = cudaSuccess;
    return e;
}

cudaError_t cudaPeekAtLastError(void) { return t_last_error; }

#define RT_EMU_ERROR_NAME(name, number, text)                                                                          \
    case name:                                                                                                         \
        return #name;
#define RT_EMU_ERROR_TEXT(name, number, text)                                                                          \
    case name:                                                                                                         \
        return text;

const char *cudaGetErrorName(cudaError_t e) {
    switch (e) { RT_EMU_CUDA_ERRORS(RT_EMU_ERROR_NAME) }
    return "unrecognized error code";
}

const char *cudaGetErrorString(cudaError_t e) {
    switch (e) { RT_EMU_CUDA_ERRORS(RT_EMU_ERROR_TEXT) }
    return "unrecognized error code";
}

/* ---- devices ---- */

cudaError_t cudaGetDeviceCount(int *count) {
    cudaError_t e = init();
    if (e != cudaSuccess) return fail(e);
    if (!count) return fail(cudaErrorInvalidValue);
    *count = device_count();
    return *count ? cudaSuccess : fail(cudaErrorNoDevice);
}

cudaError_t cudaSetDevice(int device) {
    RT_READY();
    if (device < 0 || device >= device_count()) return fail(cudaErrorInvalidDevice);
    t_device = device;
    return cudaSuccess;
}

cudaError_t cudaGetDevice(int *device) {
    RT_READY();
    if (!device) return fail(cudaErrorInvalidValue);
    *device = t_device;
    return cudaSuccess;
}

cudaError_t cudaGetDeviceProperties(struct cudaDeviceProp *prop, int device) {
    RT_READY();
    if (!prop) return fail(cudaErrorInvalidValue);
    if (device < 0 || device >= device_count()) return fail(cudaErrorInvalidDevice);
    fill_properties(prop, device);
    return cudaSuccess;
}

cudaError_t cudaDeviceGetPCIBusId(char *bus_id, int len, int device) {
    RT_READY();
    if (!bus_id || len <= 0) return fail(cudaErrorInvalidValue);
    if (device < 0 || device >= device_count()) return fail(cudaErrorInvalidDevice);
    snprintf(bus_id, (size_t)len, "0000:%02x:00.0", pci_bus(device));
    return cudaSuccess;
}

/* answer without initialising, as the real ones do */
cudaError_t cudaDriverGetVersion(int *v) {
    if (!v) return fail(cudaErrorInvalidValue);
    std::call_once(G.once, init_once);
    *v = G.cfg.fail_init == cudaErrorInsufficientDriver ? 12020 : CUDART_VERSION;
    return cudaSuccess;
}

cudaError_t cudaRuntimeGetVersion(int *v) {
    if (!v) return fail(cudaErrorInvalidValue);
    *v = CUDART_VERSION;
    return cudaSuccess;
}

cudaError_t cudaMemGetInfo(size_t *free_b, size_t *total_b) {
    RT_READY();
    if (!free_b || !total_b) return fail(cudaErrorInvalidValue);
    std::lock_guard<std::mutex> lk(G.mem);
    *total_b = DEVICE_BYTES;
    *free_b = DEVICE_BYTES - G.dev[(size_t)t_device].used;
    return cudaSuccess;
}

cudaError_t cudaDeviceSynchronize(void) {
    RT_READY();
    RT_CAPTURE_SAFE();
    drain_device(t_device);
    rt_emu_count_host_sync("cudaDeviceSynchronize");
    return cudaSuccess;
}

cudaError_t cudaDeviceGetStreamPriorityRange(int *least, int *greatest) {
    RT_READY();
    if (least) *least = 0;
    if (greatest) *greatest = -5;
    return cudaSuccess;
}

/* ---- peer access (answered from the topology, topology.h) ---- */

static bool valid_device(int d) { return d >= 0 && d < device_count(); }

static int physical(int d) { return G.cfg.visible[(size_t)d]; }

cudaError_t cudaDeviceCanAccessPeer(int *can, int device, int peer) {
    RT_READY();
    if (!can) return fail(cudaErrorInvalidValue);
    if (!valid_device(device) || !valid_device(peer)) return fail(cudaErrorInvalidDevice);
    *can = device != peer && rt_emu_topo_access(physical(device), physical(peer));
    return cudaSuccess;
}

cudaError_t cudaDeviceGetP2PAttribute(int *value, enum cudaDeviceP2PAttr attr, int src, int dst) {
    RT_READY();
    if (!value) return fail(cudaErrorInvalidValue);
    if (!valid_device(src) || !valid_device(dst) || src == dst) return fail(cudaErrorInvalidDevice);
    int a = physical(src), b = physical(dst);
    switch (attr) {
    case cudaDevP2PAttrPerformanceRank:
        *value = rt_emu_topo_rank(a, b);
        return cudaSuccess;
    case cudaDevP2PAttrAccessSupported:
        *value = rt_emu_topo_access(a, b);
        return cudaSuccess;
    case cudaDevP2PAttrNativeAtomicSupported:
        *value = rt_emu_topo_access(a, b) && rt_emu_topo_atomics(a, b);
        return cudaSuccess;
    case cudaDevP2PAttrCudaArrayAccessSupported:
        *value = rt_emu_topo_access(a, b);
        return cudaSuccess;
    }
    return fail(cudaErrorInvalidValue);
}

/* the calling thread's device may access peer's memory from now on */
cudaError_t cudaDeviceEnablePeerAccess(int peer, unsigned flags) {
    RT_READY();
    if (flags) return fail(cudaErrorInvalidValue);
    if (!valid_device(peer) || peer == t_device) return fail(cudaErrorInvalidDevice);
    int a = physical(t_device), b = physical(peer);
    if (!rt_emu_topo_access(a, b)) return fail(cudaErrorPeerAccessUnsupported);
    std::lock_guard<std::mutex> lk(G.m);
    return G.peers.insert({a, b}).second ? cudaSuccess : fail(cudaErrorPeerAccessAlreadyEnabled);
}

cudaError_t cudaDeviceDisablePeerAccess(int peer) {
    RT_READY();
    if (!valid_device(peer) || peer == t_device) return fail(cudaErrorInvalidDevice);
    std::lock_guard<std::mutex> lk(G.m);
    return G.peers.erase({physical(t_device), physical(peer)}) ? cudaSuccess : fail(cudaErrorPeerAccessNotEnabled);
}

/* ---- memory ---- */

cudaError_t cudaMalloc(void **p, size_t n) {
    RT_READY();
    RT_CAPTURE_SAFE();
    if (!p) return fail(cudaErrorInvalidValue);
    *p = nullptr;
    if (n == 0) return cudaSuccess;
    const size_t page = page_size();
    if (n > DEVICE_BYTES) return fail(cudaErrorMemoryAllocation);
    const size_t mapped = (n + page - 1) / page * page;
    std::lock_guard<std::mutex> lk(G.mem);
    device_state &d = G.dev[(size_t)t_device];
    if (d.used + n > DEVICE_BYTES) return fail(cudaErrorMemoryAllocation);
    void *view, *alias;
    if (!map_twice(mapped, &view, &alias)) return fail(cudaErrorMemoryAllocation);
    memset(alias, 0xFF, mapped); /* uninitialised device memory reads as NaN */
    allocation *al = new allocation{(uintptr_t)view, n, mapped, (char *)alias, t_device, ++G.alloc_serial};
    G.allocs[al->base] = al;
    d.used += n;
    G.allocs_live++;
    *p = view;
    return cudaSuccess;
}

/* implicitly synchronising, as the real one: the device's pending work may use p */
cudaError_t cudaFree(void *p) {
    RT_READY();
    RT_CAPTURE_SAFE();
    if (!p) return cudaSuccess;
    int device;
    {
        std::lock_guard<std::mutex> lk(G.mem);
        auto it = G.allocs.find((uintptr_t)p);
        if (it == G.allocs.end() || !it->second->alias) return fail(cudaErrorInvalidValue);
        device = it->second->device;
    }
    drain_device(device);
    rt_emu_count_host_sync("cudaFree");
    std::lock_guard<std::mutex> lk(G.mem);
    auto it = G.allocs.find((uintptr_t)p);
    if (it == G.allocs.end() || !it->second->alias) return fail(cudaErrorInvalidValue); /* freed meanwhile */
    allocation *al = it->second;
    G.dev[(size_t)al->device].used -= al->size;
    G.allocs_live--;
    retire(al);
    return cudaSuccess;
}

cudaError_t cudaHostAlloc(void **p, size_t n, unsigned flags) {
    RT_READY();
    RT_INJECTED("cudaHostAlloc");
    RT_CAPTURE_SAFE();
    if (!p || flags > 0x0f) return fail(cudaErrorInvalidValue);
    size_t mapped = ((n ? n : 1) + page_size() - 1) / page_size() * page_size();
    void *m = mmap(nullptr, mapped, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED) {
        *p = nullptr;
        return fail(cudaErrorMemoryAllocation);
    }
    std::lock_guard<std::mutex> lk(G.mem);
    G.pinned[(uintptr_t)m] = mapped;
    *p = m;
    return cudaSuccess;
}

cudaError_t cudaMallocHost(void **p, size_t n) { return cudaHostAlloc(p, n, cudaHostAllocDefault); }

/* implicitly synchronising, as the real one: pending copies may use p */
cudaError_t cudaFreeHost(void *p) {
    RT_READY();
    RT_CAPTURE_SAFE();
    if (!p) return cudaSuccess;
    {
        std::lock_guard<std::mutex> lk(G.mem);
        if (!G.pinned.count((uintptr_t)p)) return fail(cudaErrorInvalidValue);
    }
    for (int d = 0; d < device_count(); d++) drain_device(d);
    rt_emu_count_host_sync("cudaFreeHost");
    std::lock_guard<std::mutex> lk(G.mem);
    auto it = G.pinned.find((uintptr_t)p);
    if (it == G.pinned.end()) return fail(cudaErrorInvalidValue);
    munmap(p, it->second);
    G.pinned.erase(it);
    return cudaSuccess;
}

cudaError_t cudaMemcpy(void *dst, const void *src, size_t n, enum cudaMemcpyKind kind) {
    return copy(dst, src, n, kind, cudaStreamLegacy, true, "cudaMemcpy");
}

cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t n, enum cudaMemcpyKind kind, cudaStream_t s) {
    RT_INJECTED("cudaMemcpyAsync");
    return copy(dst, src, n, kind, s, false, "cudaMemcpyAsync");
}

/* a copy between two devices' memory: each pointer must lie on the device named for it */
cudaError_t cudaMemcpyPeerAsync(void *dst, int dst_device, const void *src, int src_device, size_t n, cudaStream_t s) {
    RT_READY();
    if (!valid_device(dst_device) || !valid_device(src_device)) return fail(cudaErrorInvalidDevice);
    if (n && (rt_emu_ptr_device(dst) != dst_device || rt_emu_ptr_device(src) != src_device))
        return fail(cudaErrorInvalidValue);
    return copy(dst, src, n, cudaMemcpyDeviceToDevice, s, false, "cudaMemcpyPeerAsync");
}

cudaError_t cudaMemset(void *p, int value, size_t n) { return set(p, value, n, cudaStreamLegacy, "cudaMemset"); }

cudaError_t cudaMemsetAsync(void *p, int value, size_t n, cudaStream_t s) {
    return set(p, value, n, s, "cudaMemsetAsync");
}

/* ---- streams ---- */

cudaError_t cudaStreamCreateWithPriority(cudaStream_t *ps, unsigned flags, int priority) {
    RT_READY();
    if (!ps || (flags & ~(unsigned)cudaStreamNonBlocking)) return fail(cudaErrorInvalidValue);
    std::lock_guard<std::mutex> lk(G.m);
    CUstream_st *st = new_stream(t_device, flags, priority, false);
    G.streams.insert(st);
    *ps = st;
    return cudaSuccess;
}

cudaError_t cudaStreamCreateWithFlags(cudaStream_t *ps, unsigned flags) {
    return cudaStreamCreateWithPriority(ps, flags, 0);
}

cudaError_t cudaStreamCreate(cudaStream_t *ps) { return cudaStreamCreateWithPriority(ps, cudaStreamDefault, 0); }

/* pending work still runs; the handle is invalid from now on */
cudaError_t cudaStreamDestroy(cudaStream_t s) {
    RT_READY();
    std::lock_guard<std::mutex> lk(G.m);
    if (!G.streams.erase(s)) return fail(cudaErrorInvalidResourceHandle);
    s->destroyed = true;
    s->work.notify_one();
    return cudaSuccess;
}

cudaError_t cudaStreamSynchronize(cudaStream_t s) {
    RT_READY();
    std::unique_lock<std::mutex> lk(G.m);
    CUstream_st *st = resolve(s);
    if (!st) return fail(cudaErrorInvalidResourceHandle);
    cudaError_t e = capturing_stream_refused(st);
    if (e == cudaSuccess) e = unsafe_call_locked();
    if (e == cudaSuccess) e = legacy_implicit(st);
    if (e != cudaSuccess) return fail(e);
    /* the legacy stream: as if an operation on it completed (with its implicit waits) */
    unsigned long long seq = st->legacy ? enqueue_locked(st, new_op("cudaStreamSynchronize", nullptr, nullptr, nullptr))
                                        : st->enqueued;
    wait_for(lk, st, seq);
    lk.unlock();
    rt_emu_count_host_sync("cudaStreamSynchronize");
    return cudaSuccess;
}

cudaError_t cudaStreamQuery(cudaStream_t s) {
    RT_READY();
    std::lock_guard<std::mutex> lk(G.m);
    CUstream_st *st = resolve(s);
    if (!st) return fail(cudaErrorInvalidResourceHandle);
    cudaError_t e = capturing_stream_refused(st);
    if (e == cudaSuccess) e = unsafe_call_locked();
    if (e != cudaSuccess) return fail(e);
    return st->completed >= st->enqueued ? cudaSuccess : fail(cudaErrorNotReady);
}

cudaError_t cudaStreamGetFlags(cudaStream_t s, unsigned *flags) {
    RT_READY();
    std::lock_guard<std::mutex> lk(G.m);
    CUstream_st *st = resolve(s);
    if (!st) return fail(cudaErrorInvalidResourceHandle);
    if (!flags) return fail(cudaErrorInvalidValue);
    *flags = st->flags;
    return cudaSuccess;
}

/* waits for the record that is the event's latest now (none: nothing to wait for) */
cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned flags) {
    RT_READY();
    RT_INJECTED("cudaStreamWaitEvent");
    if (flags & ~(unsigned)cudaEventWaitExternal) return fail(cudaErrorInvalidValue);
    std::lock_guard<std::mutex> lk(G.m);
    CUstream_st *st = resolve(s);
    if (!st || !G.events.count(e)) return fail(cudaErrorInvalidResourceHandle);
    if (st->cap || e->cap_id) return fail(capture_wait(st, e));
    op *o = new_op("cudaStreamWaitEvent", wait_run, new wait_op{e, e->generation}, wait_free);
    if (e->stream) o->deps.push_back({e->stream, e->seq});
    cudaError_t err = enqueue_or_capture(st, o, nullptr);
    return err == cudaSuccess ? cudaSuccess : fail(err);
}

cudaError_t cudaLaunchHostFunc(cudaStream_t s, cudaHostFn_t fn, void *data) {
    RT_READY();
    if (!fn) return fail(cudaErrorInvalidValue);
    return submit(s, "cudaLaunchHostFunc", host_fn_run, new host_fn_op{fn, data}, host_fn_free, false);
}

/* ---- events ---- */

cudaError_t cudaEventCreateWithFlags(cudaEvent_t *pe, unsigned flags) {
    RT_READY();
    RT_INJECTED("cudaEventCreateWithFlags");
    if (!pe || flags > 0x07 || ((flags & cudaEventInterprocess) && !(flags & cudaEventDisableTiming)))
        return fail(cudaErrorInvalidValue);
    CUevent_st *e = new CUevent_st{t_device, flags, false, nullptr, 0, 0, 0};
    std::lock_guard<std::mutex> lk(G.m);
    G.events.insert(e);
    *pe = e;
    return cudaSuccess;
}

cudaError_t cudaEventCreate(cudaEvent_t *pe) { return cudaEventCreateWithFlags(pe, cudaEventDefault); }

cudaError_t cudaEventDestroy(cudaEvent_t e) {
    RT_READY();
    std::lock_guard<std::mutex> lk(G.m);
    if (!G.events.erase(e)) return fail(cudaErrorInvalidResourceHandle);
    e->destroyed = true;
    return cudaSuccess;
}

/* cudaEventRecordWithFlags(cudaEventRecordExternal) on a capturing stream: an event
 * record node, not a position in the sequence. Each launch of the graph records the event
 * anew (cudaGraphLaunch gives it the launch's stream position and a new generation), and
 * the node stamps the event's time when it runs, so the event times the captured work
 * between two such nodes. G.m held. */
cudaError_t capture_record_node(CUstream_st *st, CUevent_st *e) {
    return enqueue_or_capture(st, new_op("cudaEventRecord", record_run, new record_op{e, 0}, record_free), nullptr);
}

cudaError_t event_record(cudaEvent_t e, cudaStream_t s, bool external) {
    std::lock_guard<std::mutex> lk(G.m);
    CUstream_st *st = resolve(s);
    if (!st || !G.events.count(e) || st->device != e->device) return fail(cudaErrorInvalidResourceHandle);
    cudaError_t err = legacy_implicit(st);
    if (err == cudaSuccess && st->cap) err = external ? capture_record_node(st, e) : capture_record(st, e);
    if (err != cudaSuccess || st->cap) return err == cudaSuccess ? cudaSuccess : fail(err);
    e->generation++;
    e->seq = enqueue_locked(st, new_op("cudaEventRecord", record_run, new record_op{e, e->generation}, record_free));
    e->stream = st;
    e->cap_id = 0;
    return cudaSuccess;
}

cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s) {
    RT_READY();
    RT_INJECTED("cudaEventRecord");
    return event_record(e, s, false);
}

cudaError_t cudaEventRecordWithFlags(cudaEvent_t e, cudaStream_t s, unsigned int flags) {
    RT_READY();
    RT_INJECTED("cudaEventRecord");
    if (flags & ~(unsigned)cudaEventRecordExternal) return fail(cudaErrorInvalidValue);
    return event_record(e, s, (flags & cudaEventRecordExternal) != 0);
}

cudaError_t cudaEventQuery(cudaEvent_t e) {
    RT_READY();
    std::lock_guard<std::mutex> lk(G.m);
    if (!G.events.count(e)) return fail(cudaErrorInvalidResourceHandle);
    cudaError_t err = unsafe_call_locked();
    if (err == cudaSuccess && e->cap_id) err = cudaErrorCapturedEvent;
    if (err != cudaSuccess) return fail(err);
    return event_complete(e) ? cudaSuccess : fail(cudaErrorNotReady);
}

cudaError_t cudaEventSynchronize(cudaEvent_t e) {
    RT_READY();
    std::unique_lock<std::mutex> lk(G.m);
    if (!G.events.count(e)) return fail(cudaErrorInvalidResourceHandle);
    cudaError_t err = unsafe_call_locked();
    if (err == cudaSuccess && e->cap_id) err = cudaErrorCapturedEvent;
    if (err != cudaSuccess) return fail(err);
    if (e->stream) wait_for(lk, e->stream, e->seq);
    lk.unlock();
    rt_emu_count_host_sync("cudaEventSynchronize");
    return cudaSuccess;
}

cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t a, cudaEvent_t b) {
    RT_READY();
    if (!ms) return fail(cudaErrorInvalidValue);
    std::lock_guard<std::mutex> lk(G.m);
    if (!G.events.count(a) || !G.events.count(b)) return fail(cudaErrorInvalidResourceHandle);
    if ((a->flags | b->flags) & cudaEventDisableTiming) return fail(cudaErrorInvalidResourceHandle);
    if (a->cap_id || b->cap_id) return fail(cudaErrorCapturedEvent);
    if (!a->stream || !b->stream) return fail(cudaErrorInvalidResourceHandle); /* never recorded */
    if (!event_complete(a) || !event_complete(b)) return fail(cudaErrorNotReady);
    if (rt_emu_topo_active()) /* the emulated clock: the model's times, exactly */
        *ms = (float)((double)((int64_t)(b->vt_ns - a->vt_ns)) / 1e6);
    else
        *ms = (float)((double)((int64_t)(b->time_ns - a->time_ns)) / 1e6);
    return cudaSuccess;
}

/* ---- stream capture and graphs (the section "stream capture" above) ---- */

} /* extern "C" */

struct CUgraph_st {
    std::shared_ptr<node_list> nodes;
};
struct CUgraphExec_st {
    std::shared_ptr<node_list> nodes;
};

extern "C" {

cudaError_t cudaThreadExchangeStreamCaptureMode(enum cudaStreamCaptureMode *mode) {
    if (!mode || (unsigned)*mode > (unsigned)cudaStreamCaptureModeRelaxed) return fail(cudaErrorInvalidValue);
    std::swap(*mode, t_capture_mode);
    return cudaSuccess;
}

cudaError_t cudaStreamBeginCapture(cudaStream_t s, enum cudaStreamCaptureMode mode) {
    RT_READY();
    RT_INJECTED("cudaStreamBeginCapture");
    if ((unsigned)mode > (unsigned)cudaStreamCaptureModeRelaxed) return fail(cudaErrorInvalidValue);
    std::lock_guard<std::mutex> lk(G.m);
    CUstream_st *st = resolve(s);
    if (!st) return fail(cudaErrorInvalidResourceHandle);
    if (st->legacy) return fail(cudaErrorStreamCaptureUnsupported);
    if (st->cap) return fail(cudaErrorIllegalState);
    capture *c = new capture;
    c->id = ++G.capture_serial;
    c->mode = mode;
    c->owner = std::this_thread::get_id();
    c->origin = st;
    c->streams.push_back(st);
    c->nodes = std::make_shared<node_list>();
    c->ops[st] = 0;
    G.captures[c->id] = c;
    st->cap = c;
    return cudaSuccess;
}

cudaError_t cudaStreamEndCapture(cudaStream_t s, cudaGraph_t *graph) {
    RT_READY();
    if (!graph) return fail(cudaErrorInvalidValue);
    *graph = nullptr;
    std::lock_guard<std::mutex> lk(G.m);
    CUstream_st *st = resolve(s);
    if (!st) return fail(cudaErrorInvalidResourceHandle);
    capture *c = st->cap;
    if (!c) return fail(cudaErrorIllegalState);
    if (c->origin != st) {
        invalidate(c, cudaErrorStreamCaptureUnmatched);
        return fail(cudaErrorStreamCaptureUnmatched);
    }
    if (c->mode != cudaStreamCaptureModeRelaxed && c->owner != std::this_thread::get_id())
        return fail(cudaErrorStreamCaptureWrongThread);
    bool unjoined = capture_unjoined(c);
    cudaError_t e = c->invalid != cudaSuccess ? cudaErrorStreamCaptureInvalidated
                    : unjoined                ? cudaErrorStreamCaptureUnjoined
                                              : cudaSuccess;
    if (e == cudaSuccess) *graph = new CUgraph_st{c->nodes};
    capture_finish(c);
    delete c; /* its nodes live on in the graph, or go now */
    return e == cudaSuccess ? cudaSuccess : fail(e);
}

cudaError_t cudaStreamIsCapturing(cudaStream_t s, enum cudaStreamCaptureStatus *status) {
    RT_READY();
    if (!status) return fail(cudaErrorInvalidValue);
    std::lock_guard<std::mutex> lk(G.m);
    CUstream_st *st = resolve(s);
    if (!st) return fail(cudaErrorInvalidResourceHandle);
    if (st->legacy) { /* asking the legacy stream while a blocking stream captures is refused */
        cudaError_t e = legacy_implicit(st);
        if (e != cudaSuccess) return fail(e);
    }
    *status = !st->cap                          ? cudaStreamCaptureStatusNone
              : st->cap->invalid != cudaSuccess ? cudaStreamCaptureStatusInvalidated
                                                : cudaStreamCaptureStatusActive;
    return cudaSuccess;
}

cudaError_t cudaGraphInstantiate(cudaGraphExec_t *exec, cudaGraph_t graph, unsigned long long flags) {
    RT_READY();
    if (!exec || !graph || flags > 0x0f) return fail(cudaErrorInvalidValue);
    *exec = new CUgraphExec_st{graph->nodes};
    return cudaSuccess;
}

/* one operation on the stream: the graph's nodes in their captured order */
cudaError_t cudaGraphLaunch(cudaGraphExec_t exec, cudaStream_t s) {
    RT_READY();
    if (!exec) return fail(cudaErrorInvalidValue);
    std::lock_guard<std::mutex> lk(G.m);
    CUstream_st *st = resolve(s);
    if (!st) return fail(cudaErrorInvalidResourceHandle);
    if (st->cap) { /* a graph inside a capture (a child graph node) is not emulated */
        invalidate(st->cap, cudaErrorStreamCaptureUnsupported);
        return fail(cudaErrorStreamCaptureUnsupported);
    }
    auto *nodes = new std::shared_ptr<node_list>(exec->nodes);
    unsigned long long seq = 0;
    cudaError_t e = enqueue_or_capture(st, new_op("cudaGraphLaunch", graph_run, nodes, graph_free), &seq);
    if (e != cudaSuccess) {
        graph_free(nodes);
        return fail(e);
    }
    for (graph_node &n : exec->nodes->nodes) { /* event record nodes: recorded by this launch */
        if (n.fn != record_run) continue;
        record_op *r = static_cast<record_op *>(n.arg);
        if (r->ev->destroyed) continue;
        r->generation = ++r->ev->generation;
        r->ev->stream = st;
        r->ev->seq = seq; /* complete with the launch: never earlier than the node ran */
        r->ev->cap_id = 0;
    }
    for (graph_node &n : exec->nodes->nodes) /* G.m held: the worker cannot start the graph yet */
        if (n.on_queue) n.on_queue(n.arg);
    __atomic_add_fetch(&G.graph_launches, 1, __ATOMIC_RELAXED);
    rt_emu_ledger_graph_launch(s, exec->nodes->costs.data(), exec->nodes->costs.size()); /* G.m, then the ledger's */
    return cudaSuccess;
}

/* The instance takes the graph's nodes (their arguments) where the two have the same
 * operations in the same order; otherwise nothing changes and the update fails. */
cudaError_t cudaGraphExecUpdate(cudaGraphExec_t exec, cudaGraph_t graph, cudaGraphExecUpdateResultInfo *info) {
    RT_READY();
    if (!exec || !graph) return fail(cudaErrorInvalidValue);
    const std::vector<graph_node> &a = exec->nodes->nodes, &b = graph->nodes->nodes;
    cudaGraphExecUpdateResult r = cudaGraphExecUpdateSuccess;
    if (a.size() != b.size()) r = cudaGraphExecUpdateErrorTopologyChanged;
    for (size_t i = 0; r == cudaGraphExecUpdateSuccess && i < a.size(); i++)
        if (a[i].fn != b[i].fn || strcmp(a[i].what, b[i].what) != 0) r = cudaGraphExecUpdateErrorNodeTypeChanged;
    if (info) *info = cudaGraphExecUpdateResultInfo{r, nullptr, nullptr};
    if (r != cudaGraphExecUpdateSuccess) return fail(cudaErrorGraphExecUpdateFailure);
    exec->nodes = graph->nodes; /* launches in flight keep the old nodes */
    return cudaSuccess;
}

cudaError_t cudaGraphExecDestroy(cudaGraphExec_t exec) {
    RT_READY();
    if (!exec) return fail(cudaErrorInvalidValue);
    delete exec;
    return cudaSuccess;
}

cudaError_t cudaGraphDestroy(cudaGraph_t graph) {
    RT_READY();
    if (!graph) return fail(cudaErrorInvalidValue);
    delete graph;
    return cudaSuccess;
}

/* ==== the interface of the emulated libraries (emu_internal.h) ========================== */

cudaError_t rt_emu_stream_enqueue(cudaStream_t s, const char *what, void (*fn)(void *arg), void *arg,
                                  void (*cleanup)(void *arg)) {
    cudaError_t e = ready();
    if (e != cudaSuccess) return e;
    std::lock_guard<std::mutex> lk(G.m);
    CUstream_st *st = resolve(s);
    if (!st) return cudaErrorInvalidResourceHandle;
    return enqueue_or_capture(st, new_op(what, fn, arg, cleanup), nullptr);
}

/* rt_emu_stream_enqueue, and on_queue(arg) under G.m whenever the operation is put on a
 * queue to run: now where s does not capture, at each cudaGraphLaunch where it does */
cudaError_t rt_emu_stream_enqueue_queued(cudaStream_t s, const char *what, void (*fn)(void *arg), void *arg,
                                         void (*cleanup)(void *arg), void (*on_queue)(void *arg)) {
    cudaError_t e = ready();
    if (e != cudaSuccess) return e;
    std::lock_guard<std::mutex> lk(G.m);
    CUstream_st *st = resolve(s);
    if (!st) return cudaErrorInvalidResourceHandle;
    capture *c = st->cap;
    e = enqueue_or_capture(st, new_op(what, fn, arg, cleanup), nullptr);
    if (e != cudaSuccess) return e;
    if (!c)
        on_queue(arg); /* G.m held: the worker cannot start it yet */
    else if (fn)
        c->nodes->nodes.back().on_queue = on_queue;
    return cudaSuccess;
}

int rt_emu_capture_cost(cudaStream_t s, const rt_cost_op *o) {
    if (ready() != cudaSuccess) return 0;
    std::lock_guard<std::mutex> lk(G.m);
    CUstream_st *st = resolve(s);
    if (!st || !st->cap) return 0;
    if (st->cap->invalid == cudaSuccess) st->cap->nodes->costs.push_back(*o);
    return 1;
}

unsigned long long rt_emu_stream_serial(cudaStream_t s) {
    if (ready() != cudaSuccess) return 0;
    std::lock_guard<std::mutex> lk(G.m);
    CUstream_st *st = resolve(s);
    return st ? st->serial : 0;
}

int rt_emu_stream_device(cudaStream_t s) {
    if (ready() != cudaSuccess) return -1;
    std::lock_guard<std::mutex> lk(G.m);
    CUstream_st *st = resolve(s);
    return st ? st->device : -1;
}

void *rt_emu_dev_view(const void *p, size_t n) {
    std::lock_guard<std::mutex> lk(G.mem);
    allocation *al = find_live(p, n);
    return al ? al->alias + ((uintptr_t)p - al->base) : nullptr;
}

int rt_emu_is_pinned(const void *p, size_t n) {
    std::lock_guard<std::mutex> lk(G.mem);
    return pinned_holds(p, n);
}

/* what p is, for a fault message: "allocation #3 ..." or "no allocation near it" */
static void explain(char *buf, size_t n, const void *p) {
    std::lock_guard<std::mutex> lk(G.mem);
    uintptr_t a = (uintptr_t)p;
    allocation *al = find_alloc(a);
    if (!al) {
        auto it = G.allocs.upper_bound(a);
        if (it != G.allocs.begin()) al = (--it)->second;
    }
    if (!al) {
        snprintf(buf, n, "not device memory, not pinned (no device allocation below it)");
        return;
    }
    char d[200];
    describe(d, sizeof d, al, a);
    if (a < al->base + al->mapped)
        snprintf(buf, n, "inside %s", d);
    else
        snprintf(buf, n, "not device memory, not pinned (nearest below: %s)", d);
}

void *rt_emu_access(const void *p, size_t n, const char *what) {
    if (void *v = rt_emu_dev_view(p, n)) return v;
    if (rt_emu_is_pinned(p, n)) return const_cast<void *>(p);
    char why[300];
    explain(why, sizeof why, p);
    rt_emu_fatal("%s: the device cannot access %p (%zu bytes): %s", what, p, n, why);
}

void *rt_emu_kernel_arg(const void *p, const char *kernel, int index, cudaStream_t stream) {
    if (!p) return nullptr;
    int device = rt_emu_stream_device(stream);
    {
        std::lock_guard<std::mutex> lk(G.mem);
        allocation *al = find_live(p, 0);
        if (al && (device < 0 || al->device == device)) return al->alias + ((uintptr_t)p - al->base);
        if (al)
            rt_emu_fatal("kernel %s: argument %d (%p) is memory of device %d, the launch is on device %d (no peer "
                         "access in the emulation)",
                         kernel, index, p, al->device, device);
        if (pinned_holds(p, 0)) return const_cast<void *>(p);
    }
    char why[300];
    explain(why, sizeof why, p);
    rt_emu_fatal("kernel %s: argument %d (%p) is not device memory: %s", kernel, index, p, why);
}

int rt_emu_ptr_device(const void *p) {
    std::lock_guard<std::mutex> lk(G.mem);
    allocation *al = find_live(p, 0);
    return al ? al->device : -1;
}

int rt_emu_current_device(void) { return t_device; }

int rt_emu_device_count(void) {
    init();
    return device_count();
}

void rt_emu_count_host_sync(const char *what) {
    __atomic_add_fetch(&G.host_syncs, 1, __ATOMIC_RELAXED);
    if (G.cfg.sync_log_fd < 0) return;
    char line[256];
    int n = snprintf(line, sizeof line, "%llu %s\n", (unsigned long long)now_ns(), what);
    if (n > (int)sizeof line - 1) n = (int)sizeof line - 1;
    if (write(G.cfg.sync_log_fd, line, (size_t)n) < 0) { /* a lost log line is not an error of the program */
    }
}

unsigned long long rt_emu_host_syncs(void) { return __atomic_load_n(&G.host_syncs, __ATOMIC_RELAXED); }

unsigned long long rt_emu_ops(void) { return __atomic_load_n(&G.ops, __ATOMIC_RELAXED); }

unsigned long long rt_emu_graph_launches(void) { return __atomic_load_n(&G.graph_launches, __ATOMIC_RELAXED); }

unsigned long long rt_emu_allocs_live(void) {
    std::lock_guard<std::mutex> lk(G.mem);
    return G.allocs_live;
}

void rt_emu_set_last_error(cudaError_t e) { fail(e); }

void rt_emu_fail_call(const char *call, int nth, cudaError_t err) {
    std::lock_guard<std::mutex> lk(inject_mu);
    inject_call = call;
    inject_left = nth;
    inject_err = err;
}

void rt_emu_fatal(const char *fmt, ...) {
    char buf[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    fprintf(stderr, "cuda emulation: %s\n", buf);
    fflush(stderr);
    abort();
}

} // extern "C"
