/* The emulated NCCL (include/nccl.h): communicators across the processes of one host,
 * the collectives and point-to-point calls ringtrain uses, group calls, non-blocking
 * communicators, asynchronous errors, finalize/destroy/abort. A test instrument for the
 * emulated-GPU build (docs/cuda-emulation.md), so it is strict where NCCL's behaviour
 * allows it to be.
 *
 * Communicators. ncclGetUniqueId makes 16 random bytes (in an id of 128); ranks meet in
 * a segment /dev/shm/ringtrain-emu-nccl-<hex> named from them (plus a small lock file
 * beside it), created by whichever rank comes first and unlinked as soon as every rank
 * has mapped it (or when an init fails or is aborted), so nothing is left behind and jobs
 * never meet by accident. Each rank holds an OFD lock on byte `rank` of the lock file for
 * as long as its process lives: a peer whose lock is gone has died (crash, kill -9),
 * which the waiting ranks notice within a millisecond of polling; their communicator then
 * reports ncclRemoteError (NCCL's "a remote process exited prematurely"; ncclSystemError
 * is NCCL's own system-call failure, not a peer's death). A peer that exits after
 * ncclCommDestroy (or ncclCommFinalize) returned with all its work executed has not died
 * prematurely: what it sent stays readable in the segment and the others finish receiving
 * it (a send completes once its data is in the ring, before the receiver has read it, so
 * a fast rank may well be gone by then). A peer that aborts or destroys
 * its communicator but lives on is, as with NCCL's intra-node transports, not noticed:
 * the others wait (until their caller's timeout aborts them).
 * Two ranks whose current devices (rt_emu_current_device at init) have the same PCI bus
 * id are refused with ncclInvalidUsage on those ranks, as NCCL does ("Duplicate GPU").
 *
 * Operations. A call validates on the calling thread and enqueues one operation on the
 * given stream (rt_emu_stream_enqueue); the stream's worker executes it in its turn,
 * reading and writing device buffers through rt_emu_access, so a buffer whose producer
 * was not ordered before the stream is read too early, as on a GPU. Operations of one
 * communicator execute in the order they were issued (a ticket per operation), across
 * streams. Collectives move data through one slot per rank in the segment, chunk by
 * chunk: every rank posts its chunk, waits for all, computes its result from the slots in
 * rank order 0, 1, ..., n-1 (so all ranks get bit-identical results), and marks the
 * chunk consumed. Send/recv use a byte ring per ordered pair of ranks, each message
 * headed by its size (a recv whose size differs from the matching send stops the
 * emulation with a message: NCCL's behaviour is undefined there).
 *
 * Reductions, as NCCL 2.28.9 computes them (src/enqueue.cc hostToDevRedOp, lines
 * 2271-2323; src/device/reduce_kernel.h FuncPreMulSum lines 544-662, FuncSumPostDiv
 * lines 775-821, FuncMinMax lines 397-398; src/device/generate.py line 141 maps signed
 * integer Sum/Prod/PreMulSum/SumPostDiv to the unsigned kernels):
 *   - ncclSum, ncclProd: a + b, a * b in the element type (integers wrap: unsigned
 *     arithmetic); floats: x0 + x1 + ... in rank order, each addition rounded.
 *   - ncclMax, ncclMin: floats fmaxf/fminf (fmax/fmin) (a NaN loses to a number);
 *     integers compared as signed or unsigned per type.
 *   - ncclAvg on float/double: ncclDevPreMulSum with scalar float(1.0/nranks) (double:
 *     1.0/nranks): every rank's element is multiplied by the scalar, then summed:
 *     ((x0*s + x1*s) + x2*s) + ... in rank order.
 *   - ncclAvg on integers: ncclDevSumPostDiv: the wrapping sum, then divided by nranks
 *     rounding toward zero, with NCCL's own reciprocal-and-fixup division (on the
 *     absolute value of a signed sum, the sign put back).
 *   NCCL's real order of additions depends on its ring/tree and channel layout; only the
 *   per-element formula above is NCCL's, the rank order is the emulation's (fixed).
 *   Float16/Bfloat16/fp8 are not emulated (ncclInvalidArgument): ringtrain uses none.
 *
 * Stream capture (as NCCL allows since 2.9: collectives, point-to-point and groups). An
 * operation issued on a capturing stream is validated and recorded into the graph, not
 * run. Each launch of the graph (cudaGraphLaunch) issues it anew: it takes its ticket at
 * the launch, on the launching thread (rt_emu_stream_enqueue_queued), so it is ordered
 * among the communicator's other operations where the host launched the graph (ranks that
 * launch the same graph at the same point agree, as NCCL requires: a launch is collective
 * over the ranks of the capture), and it reads and writes its buffers when it executes. A
 * peer that died before or during a replay gives ncclRemoteError as for any operation; a
 * replay on an aborted or destroyed communicator does nothing (garbage, as after an
 * abort). Communicator management (init, finalize, destroy, abort) has no stream and is
 * not captured.
 *
 * Groups (thread-local, nesting, as NCCL): operations between ncclGroupStart and the
 * outermost ncclGroupEnd are collected and enqueued at ncclGroupEnd, one unit per
 * communicator: collectives in call order, then every send and recv progressed together,
 * so send/recv pairs never deadlock whatever their order. A call that fails inside a group
 * records the group's error; ncclGroupEnd then returns it and drops the group's work (as
 * NCCL). NCCL then silently appends later calls of that thread to the still-open group,
 * which never runs: the emulation instead refuses any operation or init issued while a
 * group left open after a failure is still open (ncclInvalidUsage, with a message), and
 * rt_emu_nccl_group_depth() lets a test check that a caller closed its groups.
 *
 * Non-blocking communicators (config.blocking = 0): init runs on a thread of the
 * communicator and returns ncclInProgress; each operation (and ncclGroupEnd) returns
 * ncclInProgress and is enqueued on the stream later, by that thread;
 * ncclCommGetAsyncError reports ncclInProgress until it is. A call on a communicator still
 * in progress fails with ncclInvalidArgument, like NCCL ("Attempt to use communicator
 * before the previous operation returned ncclSuccess"), and breaks the communicator.
 * ncclCommFinalize returns ncclInProgress until all of the communicator's enqueued work
 * has executed. ncclCommAbort stops every operation of the communicator that is waiting
 * (its stream continues; the data is garbage) and makes later calls fail.
 *
 * Waiting (a worker in an operation, init, finalize) polls: spins, then yields, then
 * sleeps 50 us at a time; no timeouts, so ranks may be arbitrarily slow.
 *
 * Environment (test-only):
 *   RINGTRAIN_EMU_NCCL_FAIL=<name>:<n>[,<name>:<n>...]  the n-th call (1-based) of NCCL
 *       function <name> (e.g. ncclSend, ncclGroupEnd, ncclCommInitRankConfig) in this
 *       process returns ncclUnhandledCudaError, as if its kernel launch had failed
 *       (inside a group: recorded as the group's error; on a non-blocking communicator:
 *       also its asynchronous error).
 *   RINGTRAIN_EMU_NCCL_KILL=<name>:<n>  the process kills itself (SIGKILL) when the n-th
 *       operation <name> (ncclAllReduce, ncclSend, ...) of this process starts executing
 *       on its stream: a peer dying at a precise point, for the fault tests.
 *   RINGTRAIN_EMU_NCCL_DEBUG=1  print every error to stderr (misuse is always printed).
 */
#include "core/cost_ledger.h"
#include "emu_internal.h"

#include <nccl.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <climits>
#include <cmath>
#include <condition_variable>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

namespace {

/* ---- constants and the shared segment ------------------------------------------------ */

constexpr uint64_t kIdMagic = 0x4e43434c454d5531ull; /* "1UMELCCN": an id made by ncclGetUniqueId */
constexpr uint64_t kSegMagic = 0x5254454d554e4343ull;
constexpr size_t kSlot = 1u << 20;   /* collective bytes per rank and chunk */
constexpr size_t kChan = 256u << 10; /* ring bytes per ordered pair of ranks */
constexpr off_t kLockBase = 0;       /* byte `rank` of the lock file: held while the rank lives */

static_assert(std::atomic<uint64_t>::is_always_lock_free, "shared atomics must be lock-free");

struct alignas(64) SegHeader {
    std::atomic<uint64_t> magic;
    std::atomic<int32_t> nranks;
    std::atomic<int32_t> joined;
};

/* kRankDone: the rank destroyed (or finalized) its communicator after all of its work
 * had executed: everything it sent is in the rings, so its process exiting afterwards is
 * a clean end, not a death (see probe_peers) */
enum : uint32_t { kRankFree = 0, kRankJoined = 1, kRankLeft = 2, kRankDone = 3 };

struct alignas(64) RankRec {
    std::atomic<uint32_t> state;
    std::atomic<int32_t> pid;
    char bus[32];
    alignas(64) std::atomic<uint64_t> posted; /* last collective chunk written to the slot */
    alignas(64) std::atomic<uint64_t> done;   /* last collective chunk read from all slots */
};

struct alignas(64) ChanRec {
    std::atomic<uint64_t> head; /* bytes written by the sender */
    alignas(64) std::atomic<uint64_t> tail; /* bytes consumed by the receiver */
};

size_t seg_size(int n) {
    return sizeof(SegHeader) + sizeof(RankRec) * (size_t)n + sizeof(ChanRec) * (size_t)n * n + kSlot * (size_t)n +
           kChan * (size_t)n * n;
}

/* ---- process-wide state: debug, fault injection, the communicators ------------------- */

bool g_debug = false;
std::mutex g_err_mu;
std::string g_last_error;

void note_error(bool always, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void note_error(bool always, const char *fmt, ...) {
    char buf[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    {
        std::lock_guard<std::mutex> l(g_err_mu);
        g_last_error = buf;
    }
    if (always || g_debug) fprintf(stderr, "emulated NCCL: %s\n", buf);
}

struct Trigger {
    std::string name;
    long n;
    std::atomic<long> seen{0};
};
std::once_flag g_env_once;
std::vector<Trigger *> g_fail, g_kill;

void parse_triggers(const char *env, std::vector<Trigger *> &out) {
    if (!env) return;
    std::string s(env);
    size_t pos = 0;
    while (pos < s.size()) {
        size_t end = s.find(',', pos);
        if (end == std::string::npos) end = s.size();
        std::string item = s.substr(pos, end - pos);
        size_t colon = item.rfind(':');
        Trigger *t = new Trigger;
        t->name = item.substr(0, colon);
        t->n = colon == std::string::npos ? 1 : strtol(item.c_str() + colon + 1, nullptr, 10);
        out.push_back(t);
        pos = end + 1;
    }
}

void read_env() {
    std::call_once(g_env_once, [] {
        const char *d = getenv("RINGTRAIN_EMU_NCCL_DEBUG");
        g_debug = d && *d && strcmp(d, "0") != 0;
        parse_triggers(getenv("RINGTRAIN_EMU_NCCL_FAIL"), g_fail);
        parse_triggers(getenv("RINGTRAIN_EMU_NCCL_KILL"), g_kill);
    });
}

/* counts one call of `name`; true when it is the one the variable names */
bool fires(std::vector<Trigger *> &ts, const char *name) {
    read_env();
    bool hit = false;
    for (Trigger *t : ts)
        if (t->name == name && ++t->seen == t->n) hit = true;
    return hit;
}

bool inject_fail(const char *name) {
    if (!fires(g_fail, name)) return false;
    note_error(true, "%s: failing on purpose (RINGTRAIN_EMU_NCCL_FAIL)", name);
    return true;
}

uint64_t now_ns() {
    timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* ---- the communicator ---------------------------------------------------------------- */

}  // namespace

struct ncclComm {
    int rank = 0, nranks = 0, dev = 0;
    bool blocking = true;
    char seg_path[96] = "", lock_path[112] = "";
    int lock_fd = -1; /* kept open until the process exits: the lock says "alive" */
    uint8_t *base = nullptr;
    size_t size = 0;
    SegHeader *hdr = nullptr;
    RankRec *ranks = nullptr;
    ChanRec *chans = nullptr;
    uint8_t *slots = nullptr, *rings = nullptr;
    char bus[32] = "";

    std::atomic<int> async{ncclSuccess}; /* ncclResult_t */
    std::atomic<bool> abort_flag{false};
    std::atomic<bool> released{false};  /* destroyed or aborted by its owner */
    std::atomic<bool> finalized{false};
    std::atomic<bool> ready{false};     /* rendezvous done */
    std::atomic<int> pending{0};        /* units enqueued, not yet executed */
    std::atomic<uint64_t> serving{0};   /* ticket of the unit that may execute */
    std::atomic<uint64_t> next_ticket{0}; /* taken under the runtime's lock (unit_queued) */
    uint64_t coll_step = 0;             /* collective chunks so far: the unit holding the turn */
    std::atomic<uint64_t> last_probe{0};
    std::atomic<int> users{1};          /* the owner + every queued unit: the mapping lives until 0 */

    std::mutex mu; /* the launcher's queue */
    std::condition_variable cv;
    std::deque<std::function<void()>> jobs;
    std::thread launcher;
    bool launcher_stop = false;

    RankRec &rec(int r) { return ranks[r]; }
    ChanRec &chan(int src, int dst) { return chans[(size_t)src * nranks + dst]; }
    uint8_t *slot(int r) { return slots + kSlot * (size_t)r; }
    uint8_t *ring(int src, int dst) { return rings + kChan * ((size_t)src * nranks + dst); }
};

namespace {

std::mutex g_comms_mu;
std::vector<ncclComm *> g_comms; /* every communicator ever made: never freed (a stale handle is detected) */

int live_comms() {
    std::lock_guard<std::mutex> l(g_comms_mu);
    int n = 0;
    for (ncclComm *c : g_comms)
        if (!c->released) n++;
    return n;
}

bool known(ncclComm *c) {
    std::lock_guard<std::mutex> l(g_comms_mu);
    return std::find(g_comms.begin(), g_comms.end(), c) != g_comms.end();
}

/* first error wins; ncclSuccess and ncclInProgress are not errors */
void set_error(ncclComm *c, ncclResult_t e) {
    int cur = c->async.load();
    while (cur == ncclSuccess || cur == ncclInProgress)
        if (c->async.compare_exchange_weak(cur, e)) return;
}

bool comm_ok(ncclComm *c) {
    int a = c->async.load(std::memory_order_acquire);
    return !c->abort_flag.load(std::memory_order_acquire) && (a == ncclSuccess || a == ncclInProgress);
}

void unmap(ncclComm *c) {
    if (c->base) munmap(c->base, c->size);
    c->base = nullptr;
}

void drop_user(ncclComm *c) {
    if (c->users.fetch_sub(1) == 1) unmap(c);
}

/* ---- liveness and waiting ------------------------------------------------------------ */

/* true while rank r's process lives (its lock is held) */
bool rank_alive(ncclComm *c, int r) {
    struct flock fl;
    memset(&fl, 0, sizeof fl);
    fl.l_type = F_WRLCK;
    fl.l_whence = SEEK_SET;
    fl.l_start = kLockBase + r;
    fl.l_len = 1;
    if (fcntl(c->lock_fd, F_OFD_GETLK, &fl) != 0) return true; /* cannot tell: assume alive */
    return fl.l_type != F_UNLCK;
}

/* Looks at every peer that joined; a dead one breaks the communicator (ncclRemoteError).
 * A peer that finished cleanly (kRankDone: ncclCommDestroy/ncclCommFinalize with all its
 * work executed) and then exited is not dead: its sends are complete in the rings and the
 * ranks still receiving them (or waiting on other peers) must be able to finish. The state is
 * read again after the lock was found gone: a peer may have finished between the two
 * looks (its store precedes its exit, which releases the lock). */
bool probe_peers(ncclComm *c) {
    for (int r = 0; r < c->nranks; r++) {
        uint32_t st = c->rec(r).state.load();
        if (r == c->rank || st == kRankFree || st == kRankDone) continue;
        if (!rank_alive(c, r) && c->rec(r).state.load() != kRankDone) {
            note_error(false, "rank %d: peer rank %d (pid %d) died", c->rank, r, (int)c->rec(r).pid.load());
            set_error(c, ncclRemoteError);
            return false;
        }
    }
    return true;
}

/* One pause of a poll loop; false when the wait must end (abort, error, dead peer). */
struct Waiter {
    ncclComm *c;
    unsigned spins = 0;
    uint64_t next_probe = 0;
    explicit Waiter(ncclComm *comm) : c(comm) {}
    bool pause() {
        if (!comm_ok(c)) return false;
        spins++;
        if (spins < 64) return true;
        uint64_t t = now_ns();
        if (t >= next_probe) {
            next_probe = t + 1000000; /* a look at the peers every millisecond */
            if (!probe_peers(c)) return false;
        }
        if (spins < 512) {
            sched_yield();
        } else {
            timespec ts = {0, 50000};
            nanosleep(&ts, nullptr);
        }
        return true;
    }
};

/* ---- rendezvous ---------------------------------------------------------------------- */

uint64_t id_word(const ncclUniqueId &id, int i) {
    uint64_t w;
    memcpy(&w, id.internal + 8 * i, sizeof w);
    return w;
}

void unlink_files(ncclComm *c) {
    if (c->seg_path[0]) unlink(c->seg_path);
    if (c->lock_path[0]) unlink(c->lock_path);
}

ncclResult_t open_segment(ncclComm *c) {
    c->lock_fd = open(c->lock_path, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    if (c->lock_fd < 0) {
        note_error(true, "init: %s: %s", c->lock_path, strerror(errno));
        return ncclSystemError;
    }
    struct flock fl;
    memset(&fl, 0, sizeof fl);
    fl.l_type = F_WRLCK;
    fl.l_whence = SEEK_SET;
    fl.l_start = kLockBase + c->rank;
    fl.l_len = 1;
    if (fcntl(c->lock_fd, F_OFD_SETLK, &fl) != 0) {
        note_error(true, "init: rank %d of this unique id joined twice", c->rank);
        return ncclInvalidUsage;
    }
    int fd = open(c->seg_path, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    if (fd < 0) {
        note_error(true, "init: %s: %s", c->seg_path, strerror(errno));
        return ncclSystemError;
    }
    c->size = seg_size(c->nranks);
    struct stat sb;
    if (fstat(fd, &sb) != 0 || ((size_t)sb.st_size < c->size && ftruncate(fd, (off_t)c->size) != 0)) {
        note_error(true, "init: sizing %s: %s", c->seg_path, strerror(errno));
        close(fd);
        return ncclSystemError;
    }
    void *p = mmap(nullptr, c->size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (p == MAP_FAILED) {
        note_error(true, "init: mapping %s: %s", c->seg_path, strerror(errno));
        return ncclSystemError;
    }
    c->base = (uint8_t *)p;
    c->hdr = (SegHeader *)p;
    c->ranks = (RankRec *)(c->base + sizeof(SegHeader));
    c->chans = (ChanRec *)((uint8_t *)c->ranks + sizeof(RankRec) * (size_t)c->nranks);
    c->slots = (uint8_t *)c->chans + sizeof(ChanRec) * (size_t)c->nranks * c->nranks;
    c->rings = c->slots + kSlot * (size_t)c->nranks;
    return ncclSuccess;
}

ncclResult_t join_segment(ncclComm *c) {
    uint64_t m = 0;
    if (!c->hdr->magic.compare_exchange_strong(m, kSegMagic) && m != kSegMagic) return ncclInternalError;
    int32_t n = 0;
    if (!c->hdr->nranks.compare_exchange_strong(n, c->nranks) && n != c->nranks) {
        note_error(true, "init: rank %d says %d ranks, another rank said %d", c->rank, c->nranks, (int)n);
        return ncclInvalidArgument;
    }
    RankRec &me = c->rec(c->rank);
    me.pid.store((int32_t)getpid());
    memcpy(me.bus, c->bus, sizeof me.bus);
    uint32_t st = kRankFree;
    if (!me.state.compare_exchange_strong(st, kRankJoined)) {
        note_error(true, "init: rank %d of this unique id joined twice", c->rank);
        return ncclInvalidUsage;
    }
    c->hdr->joined.fetch_add(1);
    return ncclSuccess;
}

ncclResult_t wait_all_joined(ncclComm *c) {
    bool counted = false;
    Waiter w(c);
    while (c->hdr->joined.load() < c->nranks) {
        for (int r = 0; r < c->nranks; r++)
            if (c->rec(r).state.load() == kRankLeft) { /* gave up during init: its bootstrap socket closed */
                note_error(false, "init: rank %d left before every rank joined", r);
                set_error(c, ncclRemoteError);
            }
        if (!counted && c->blocking) {
            rt_emu_count_host_sync("ncclCommInitRank");
            counted = true;
        }
        if (!w.pause()) break;
    }
    int a = c->async.load();
    if (c->abort_flag) return ncclInvalidUsage;
    return a == ncclInProgress || a == ncclSuccess ? ncclSuccess : (ncclResult_t)a;
}

ncclResult_t check_duplicate_gpu(ncclComm *c) {
    for (int r = 0; r < c->nranks; r++)
        if (r != c->rank && strncmp(c->rec(r).bus, c->bus, sizeof c->bus) == 0) {
            note_error(true, "Duplicate GPU detected : rank %d and rank %d both on CUDA device %s", c->rank, r,
                       c->bus);
            return ncclInvalidUsage;
        }
    return ncclSuccess;
}

ncclResult_t rendezvous(ncclComm *c) {
    ncclResult_t r = open_segment(c);
    if (r == ncclSuccess) r = join_segment(c);
    if (r == ncclSuccess) r = wait_all_joined(c);
    unlink_files(c); /* everyone has mapped it, or the init failed: nobody else needs the name */
    if (r == ncclSuccess) r = check_duplicate_gpu(c);
    if (r != ncclSuccess && c->hdr) c->rec(c->rank).state.store(kRankLeft);
    return r;
}

/* ---- the launcher thread (non-blocking communicators) -------------------------------- */

void launcher_main(ncclComm *c) {
    (void)cudaSetDevice(c->dev);
    std::unique_lock<std::mutex> l(c->mu);
    for (;;) {
        c->cv.wait(l, [c] { return c->launcher_stop || !c->jobs.empty(); });
        if (c->jobs.empty()) return;
        std::function<void()> job = std::move(c->jobs.front());
        c->jobs.pop_front();
        l.unlock();
        job();
        l.lock();
    }
}

void post_job(ncclComm *c, std::function<void()> job) {
    std::lock_guard<std::mutex> l(c->mu);
    c->jobs.push_back(std::move(job));
    c->cv.notify_all();
}

void stop_launcher(ncclComm *c) {
    if (!c->launcher.joinable()) return;
    {
        std::lock_guard<std::mutex> l(c->mu);
        c->launcher_stop = true;
        c->cv.notify_all();
    }
    c->launcher.join();
}

/* ---- operations ---------------------------------------------------------------------- */

enum Kind { kAllReduce, kBroadcast, kReduce, kAllGather, kReduceScatter, kSend, kRecv };

const char *kind_name(Kind k) {
    static const char *const names[] = {"ncclAllReduce",     "ncclBroadcast", "ncclReduce", "ncclAllGather",
                                        "ncclReduceScatter", "ncclSend",      "ncclRecv"};
    return names[k];
}

struct Op {
    Kind kind;
    const void *send;
    void *recv;
    size_t count;
    ncclDataType_t dt;
    ncclRedOp_t op;
    int root; /* root, or the peer of send/recv */
    ncclComm *comm;
    cudaStream_t stream;
};

size_t type_size(ncclDataType_t t) {
    switch (t) {
    case ncclInt8:
    case ncclUint8:
        return 1;
    case ncclInt32:
    case ncclUint32:
    case ncclFloat32:
        return 4;
    case ncclInt64:
    case ncclUint64:
    case ncclFloat64:
        return 8;
    default:
        return 0; /* not emulated */
    }
}

/* ---- reductions (see the header comment for NCCL's definitions) ---- */

template <typename T> struct Unsigned {
    using type = typename std::make_unsigned<T>::type;
};

/* NCCL's FuncSumPostDiv::divide (reduce_kernel.h 787-803) on the wrapped sum x */
template <typename U> U post_div(U x, uint32_t divisor, bool is_signed) {
    using W = typename std::conditional<sizeof(U) == 8, uint64_t, uint32_t>::type;
    W recip = W(-1) / divisor;
    bool xneg = is_signed && (x & ~(U(-1) >> 1));
    W xabs = xneg ? W(U(-x)) : W(x);
    W q = sizeof(W) == 8 ? W(((unsigned __int128)xabs * recip) >> 64) : W(((uint64_t)xabs * recip) >> 32);
    if (xabs - q * divisor >= divisor) q += 1;
    return xneg ? U(-U(q)) : U(q);
}

template <typename T> void reduce_int(T *out, const T *const *in, int n, size_t k, ncclRedOp_t op) {
    using U = typename Unsigned<T>::type;
    const bool is_signed = std::is_signed<T>::value;
    for (size_t i = 0; i < k; i++) {
        U acc = (U)in[0][i];
        T best = in[0][i];
        for (int r = 1; r < n; r++) {
            T x = in[r][i];
            switch (op) {
            case ncclProd:
                acc = U(acc * (U)x);
                break;
            case ncclMax:
                best = x > best ? x : best;
                break;
            case ncclMin:
                best = x < best ? x : best;
                break;
            default: /* ncclSum, ncclAvg */
                acc = U(acc + (U)x);
            }
        }
        if (op == ncclMax || op == ncclMin) {
            out[i] = best;
        } else {
            if (op == ncclAvg) acc = post_div<U>(acc, (uint32_t)n, is_signed);
            memcpy(&out[i], &acc, sizeof acc);
        }
    }
}

template <typename T> void reduce_float(T *out, const T *const *in, int n, size_t k, ncclRedOp_t op) {
    const T s = (T)(1.0 / n); /* float(1.0/nranks) for float, 1.0/nranks for double */
    for (size_t i = 0; i < k; i++) {
        T acc = op == ncclAvg ? in[0][i] * s : in[0][i];
        for (int r = 1; r < n; r++) {
            T x = in[r][i];
            switch (op) {
            case ncclProd:
                acc = acc * x;
                break;
            case ncclMax:
                acc = std::fmax(acc, x);
                break;
            case ncclMin:
                acc = std::fmin(acc, x);
                break;
            case ncclAvg: {
                volatile T pre = x * s; /* the pre-multiplication rounds on its own (no fused multiply-add) */
                acc = acc + pre;
                break;
            }
            default:
                acc = acc + x;
            }
        }
        out[i] = acc;
    }
}

/* out[0..k) = in[0][..] op in[1][..] op ... (rank order); in[r] points into slots */
void reduce(void *out, const void *const *in, int n, size_t k, ncclDataType_t dt, ncclRedOp_t op) {
    switch (dt) {
    case ncclInt8:
        return reduce_int((int8_t *)out, (const int8_t *const *)in, n, k, op);
    case ncclUint8:
        return reduce_int((uint8_t *)out, (const uint8_t *const *)in, n, k, op);
    case ncclInt32:
        return reduce_int((int32_t *)out, (const int32_t *const *)in, n, k, op);
    case ncclUint32:
        return reduce_int((uint32_t *)out, (const uint32_t *const *)in, n, k, op);
    case ncclInt64:
        return reduce_int((int64_t *)out, (const int64_t *const *)in, n, k, op);
    case ncclUint64:
        return reduce_int((uint64_t *)out, (const uint64_t *const *)in, n, k, op);
    case ncclFloat32:
        return reduce_float((float *)out, (const float *const *)in, n, k, op);
    case ncclFloat64:
        return reduce_float((double *)out, (const double *const *)in, n, k, op);
    default:
        rt_emu_fatal("emulated NCCL: reduction over data type %d", (int)dt);
    }
}

/* ---- collectives: one chunk step through the slots ---- */

/* Waits until every rank's counter `field` reached `g`; false when the wait was cut short. */
template <typename F> bool wait_all(ncclComm *c, uint64_t g, F field) {
    Waiter w(c);
    for (int r = 0; r < c->nranks; r++)
        while (field(c->rec(r)).load(std::memory_order_acquire) < g)
            if (!w.pause()) return false;
    return true;
}

/* One step: fill(my slot), wait for all posts, consume(slots), mark it read. */
template <typename Fill, typename Consume> bool chunk_step(ncclComm *c, Fill fill, Consume consume) {
    uint64_t g = ++c->coll_step;
    if (!wait_all(c, g - 1, [](RankRec &r) -> std::atomic<uint64_t> & { return r.done; })) return false;
    fill(c->slot(c->rank));
    c->rec(c->rank).posted.store(g, std::memory_order_release);
    if (!wait_all(c, g, [](RankRec &r) -> std::atomic<uint64_t> & { return r.posted; })) return false;
    consume();
    c->rec(c->rank).done.store(g, std::memory_order_release);
    return true;
}

uint8_t *dev(const void *p, size_t n, const char *what) {
    return n ? (uint8_t *)rt_emu_access(p, n, what) : nullptr;
}

bool run_allreduce_like(ncclComm *c, const Op &o, bool to_root_only) {
    const size_t es = type_size(o.dt), nb = o.count * es, per = kSlot / es;
    const char *what = kind_name(o.kind);
    const uint8_t *snd = dev(o.send, nb, what);
    bool writes = !to_root_only || c->rank == o.root;
    uint8_t *rcv = writes ? dev(o.recv, nb, what) : nullptr;
    std::vector<const void *> in((size_t)c->nranks);
    for (size_t off = 0; off < o.count; off += per) {
        size_t k = std::min(per, o.count - off);
        bool ok = chunk_step(
            c, [&](uint8_t *mine) { memcpy(mine, snd + off * es, k * es); },
            [&] {
                if (!writes) return;
                for (int r = 0; r < c->nranks; r++) in[r] = c->slot(r);
                reduce(rcv + off * es, in.data(), c->nranks, k, o.dt, o.op);
            });
        if (!ok) return false;
    }
    return true;
}

bool run_broadcast(ncclComm *c, const Op &o) {
    const size_t es = type_size(o.dt), nb = o.count * es, per = kSlot / es;
    const char *what = kind_name(o.kind);
    const uint8_t *snd = c->rank == o.root ? dev(o.send, nb, what) : nullptr;
    uint8_t *rcv = dev(o.recv, nb, what);
    for (size_t off = 0; off < o.count; off += per) {
        size_t k = std::min(per, o.count - off);
        bool ok = chunk_step(
            c,
            [&](uint8_t *mine) {
                if (snd) memcpy(mine, snd + off * es, k * es);
            },
            [&] { memmove(rcv + off * es, c->slot(o.root), k * es); });
        if (!ok) return false;
    }
    return true;
}

bool run_allgather(ncclComm *c, const Op &o) {
    const size_t es = type_size(o.dt), nb = o.count * es, per = kSlot / es;
    const char *what = kind_name(o.kind);
    const uint8_t *snd = dev(o.send, nb, what);
    uint8_t *rcv = dev(o.recv, nb * (size_t)c->nranks, what);
    for (size_t off = 0; off < o.count; off += per) {
        size_t k = std::min(per, o.count - off);
        bool ok = chunk_step(
            c, [&](uint8_t *mine) { memcpy(mine, snd + off * es, k * es); },
            [&] {
                for (int r = 0; r < c->nranks; r++) memcpy(rcv + ((size_t)r * o.count + off) * es, c->slot(r), k * es);
            });
        if (!ok) return false;
    }
    return true;
}

bool run_reduce_scatter(ncclComm *c, const Op &o) {
    const int n = c->nranks;
    const size_t es = type_size(o.dt), nb = o.count * es, per = kSlot / (es * (size_t)n);
    const char *what = kind_name(o.kind);
    const uint8_t *snd = dev(o.send, nb * (size_t)n, what);
    uint8_t *rcv = dev(o.recv, nb, what);
    std::vector<const void *> in((size_t)n);
    for (size_t off = 0; off < o.count; off += per) {
        size_t k = std::min(per, o.count - off);
        bool ok = chunk_step(
            c,
            [&](uint8_t *mine) { /* segment j of my chunk: what rank j reduces */
                for (int j = 0; j < n; j++) memcpy(mine + (size_t)j * k * es, snd + ((size_t)j * o.count + off) * es, k * es);
            },
            [&] {
                for (int r = 0; r < n; r++) in[r] = c->slot(r) + (size_t)c->rank * k * es;
                reduce(rcv + off * es, in.data(), n, k, o.dt, o.op);
            });
        if (!ok) return false;
    }
    return true;
}

/* ---- point to point: a byte ring per ordered pair, messages headed by their size ---- */

struct P2p {
    const Op *op;
    uint8_t *buf; /* device alias */
    uint64_t bytes;
    uint64_t pos = 0; /* of 8 + bytes: the header, then the payload */
    uint8_t hdr[8];
    bool done() const { return pos == 8 + bytes; }
};

/* moves what fits; true when something moved */
bool progress_send(ncclComm *c, P2p &p) {
    ChanRec &ch = c->chan(c->rank, p.op->root);
    uint8_t *ring = c->ring(c->rank, p.op->root);
    uint64_t head = ch.head.load(std::memory_order_relaxed), tail = ch.tail.load(std::memory_order_acquire);
    bool moved = false;
    while (!p.done() && head - tail < kChan) {
        size_t at = head % kChan, room = std::min<uint64_t>(kChan - (head - tail), kChan - at);
        size_t n;
        if (p.pos < 8) {
            n = std::min<size_t>(room, 8 - p.pos);
            memcpy(ring + at, p.hdr + p.pos, n);
        } else {
            n = std::min<uint64_t>(room, 8 + p.bytes - p.pos);
            memcpy(ring + at, p.buf + (p.pos - 8), n);
        }
        p.pos += n;
        head += n;
        ch.head.store(head, std::memory_order_release);
        moved = true;
    }
    return moved;
}

bool progress_recv(ncclComm *c, P2p &p) {
    ChanRec &ch = c->chan(p.op->root, c->rank);
    uint8_t *ring = c->ring(p.op->root, c->rank);
    uint64_t tail = ch.tail.load(std::memory_order_relaxed), head = ch.head.load(std::memory_order_acquire);
    bool moved = false;
    while (!p.done() && head > tail) {
        size_t at = tail % kChan, avail = std::min<uint64_t>(head - tail, kChan - at);
        size_t n;
        if (p.pos < 8) {
            n = std::min<size_t>(avail, 8 - p.pos);
            memcpy(p.hdr + p.pos, ring + at, n);
            if (p.pos + n == 8) {
                uint64_t sent;
                memcpy(&sent, p.hdr, 8);
                if (sent != p.bytes)
                    rt_emu_fatal("emulated NCCL: rank %d: ncclRecv of %llu bytes from rank %d matched an ncclSend of "
                                 "%llu bytes (sizes of a send/recv pair must agree)",
                                 c->rank, (unsigned long long)p.bytes, p.op->root, (unsigned long long)sent);
            }
        } else {
            n = std::min<uint64_t>(avail, 8 + p.bytes - p.pos);
            memcpy(p.buf + (p.pos - 8), ring + at, n);
        }
        p.pos += n;
        tail += n;
        ch.tail.store(tail, std::memory_order_release);
        moved = true;
    }
    return moved;
}

/* Progresses every send and recv of a unit together; messages to/from one peer in order. */
bool run_p2p(ncclComm *c, const std::vector<const Op *> &ops) {
    std::vector<P2p> ps;
    for (const Op *o : ops) {
        P2p p;
        p.op = o;
        p.bytes = o->count * type_size(o->dt);
        p.buf = p.bytes ? (uint8_t *)rt_emu_access(o->kind == kSend ? o->send : o->recv, p.bytes, kind_name(o->kind))
                        : nullptr;
        memcpy(p.hdr, &p.bytes, 8);
        ps.push_back(p);
    }
    Waiter w(c);
    std::vector<char> busy(2 * (size_t)c->nranks);
    for (;;) {
        bool all = true, moved = false;
        std::fill(busy.begin(), busy.end(), 0);
        for (P2p &p : ps) {
            if (p.done()) continue;
            all = false;
            char &b = busy[2 * (size_t)p.op->root + (p.op->kind == kSend)];
            if (b) continue; /* an earlier message to/from this peer is not through yet */
            b = 1;
            moved |= p.op->kind == kSend ? progress_send(c, p) : progress_recv(c, p);
            if (!p.done()) continue;
        }
        if (all) return true;
        if (moved) {
            w.spins = 0;
        } else if (!w.pause()) {
            return false;
        }
    }
}

/* ---- units: what one ncclGroupEnd (or one ungrouped call) enqueues per communicator ---- */

struct Unit {
    Unit(ncclComm *c, std::vector<Op> o) : comm(c), ops(std::move(o)) {}
    ncclComm *comm;
    std::vector<Op> ops;
    std::mutex mu;               /* tickets */
    std::deque<uint64_t> tickets; /* one per run queued and not yet started (a graph's node: per launch) */
};

/* A turn already served on a communicator that works is the emulation's own bug (a unit
 * run twice on one ticket: a replay reusing its capture's): stop, do not hang. */
bool wait_turn(ncclComm *c, uint64_t ticket) {
    Waiter w(c);
    for (;;) {
        uint64_t now = c->serving.load(std::memory_order_acquire);
        if (now == ticket) return true;
        if (now > ticket && comm_ok(c))
            rt_emu_fatal("emulated NCCL: rank %d: operation ticket %llu runs after ticket %llu was served", c->rank,
                         (unsigned long long)ticket, (unsigned long long)now - 1);
        if (!w.pause()) return false;
    }
}

void maybe_die(const Op &o) {
    if (fires(g_kill, kind_name(o.kind))) {
        fprintf(stderr, "emulated NCCL: rank %d: killing this process at %s (RINGTRAIN_EMU_NCCL_KILL)\n", o.comm->rank,
                kind_name(o.kind));
        fflush(stderr);
        raise(SIGKILL);
    }
}

bool run_ops(ncclComm *c, Unit *u) {
    std::vector<const Op *> p2p;
    for (const Op &o : u->ops) {
        maybe_die(o);
        if (o.count == 0) continue;
        bool ok = true;
        switch (o.kind) {
        case kAllReduce:
            ok = run_allreduce_like(c, o, false);
            break;
        case kReduce:
            ok = run_allreduce_like(c, o, true);
            break;
        case kBroadcast:
            ok = run_broadcast(c, o);
            break;
        case kAllGather:
            ok = run_allgather(c, o);
            break;
        case kReduceScatter:
            ok = run_reduce_scatter(c, o);
            break;
        default:
            p2p.push_back(&o);
        }
        if (!ok) return false;
    }
    return p2p.empty() || run_p2p(c, p2p);
}

/* The unit is put on a stream's queue to run (rt_emu_stream_enqueue_queued, under the
 * runtime's lock): its ticket now, so that the communicator's work runs in the order the
 * host queued it, a captured unit at each launch of its graph. */
void unit_queued(void *arg) {
    Unit *u = (Unit *)arg;
    ncclComm *c = u->comm;
    c->pending.fetch_add(1);
    c->users.fetch_add(1);
    std::lock_guard<std::mutex> l(u->mu);
    u->tickets.push_back(c->next_ticket.fetch_add(1));
}

/* One run: the oldest ticket queued (runs of one node are alike, so any order of them
 * across streams is fine). Reads and writes the buffers now, at each replay. */
void unit_run(void *arg) {
    Unit *u = (Unit *)arg;
    ncclComm *c = u->comm;
    uint64_t ticket;
    {
        std::lock_guard<std::mutex> l(u->mu);
        ticket = u->tickets.front();
        u->tickets.pop_front();
    }
    /* an aborted or broken communicator does nothing: the stream goes on, the data is garbage */
    if (wait_turn(c, ticket) && comm_ok(c)) (void)run_ops(c, u);
    c->serving.store(ticket + 1, std::memory_order_release);
    c->pending.fetch_sub(1);
    drop_user(c);
}

/* the unit is gone: after its one run, or with its graph's last instance */
void unit_cleanup(void *arg) {
    Unit *u = (Unit *)arg;
    ncclComm *c = u->comm;
    delete u;
    drop_user(c);
}

/* Enqueues the unit on `stream` (the other streams of its ops wait for each other around
 * it, as NCCL joins a group's streams), or on a capturing stream records it into the graph,
 * as NCCL allows (collectives, p2p and groups): it takes its ticket at each launch of the
 * graph and reads the buffers then. Called on the calling thread (blocking) or the
 * launcher (non-blocking). */
ncclResult_t launch_unit(Unit *u) {
    ncclComm *c = u->comm;
    int saved = 0;
    (void)cudaGetDevice(&saved);
    (void)cudaSetDevice(c->dev);
    cudaStream_t s0 = u->ops[0].stream;
    std::vector<cudaStream_t> others;
    for (const Op &o : u->ops)
        if (o.stream != s0 && std::find(others.begin(), others.end(), o.stream) == others.end())
            others.push_back(o.stream);
    for (const Op &o : u->ops)
        if (o.stream && rt_emu_stream_device(o.stream) != c->dev) {
            note_error(true, "%s: the stream is not on the communicator's device %d", kind_name(o.kind), c->dev);
            (void)cudaSetDevice(saved);
            delete u;
            return ncclUnhandledCudaError;
        }
    cudaError_t e = cudaSuccess;
    for (cudaStream_t s : others) { /* s0 after the others' earlier work */
        cudaEvent_t ev;
        if ((e = cudaEventCreateWithFlags(&ev, cudaEventDisableTiming)) != cudaSuccess) break;
        if ((e = cudaEventRecord(ev, s)) == cudaSuccess) e = cudaStreamWaitEvent(s0, ev, 0);
        cudaEventDestroy(ev);
        if (e != cudaSuccess) break;
    }
    if (e == cudaSuccess) {
        c->users.fetch_add(1); /* the unit's own: unit_cleanup drops it */
        e = rt_emu_stream_enqueue_queued(s0, kind_name(u->ops[0].kind), unit_run, u, unit_cleanup, unit_queued);
        if (e != cudaSuccess) { /* nothing queued, no ticket taken */
            delete u;
            drop_user(c);
        }
    } else {
        delete u;
    }
    for (cudaStream_t s : others) { /* the others after the unit */
        if (e != cudaSuccess) break;
        cudaEvent_t ev;
        if ((e = cudaEventCreateWithFlags(&ev, cudaEventDisableTiming)) != cudaSuccess) break;
        if ((e = cudaEventRecord(ev, s0)) == cudaSuccess) e = cudaStreamWaitEvent(s, ev, 0);
        cudaEventDestroy(ev);
    }
    (void)cudaSetDevice(saved);
    if (e != cudaSuccess) {
        note_error(true, "enqueueing on a stream: %s", cudaGetErrorString(e));
        (void)cudaGetLastError();
        return ncclUnhandledCudaError;
    }
    return ncclSuccess;
}

/* Enqueues the units now (blocking communicators) or on the launcher (non-blocking:
 * ncclInProgress until it has). */
ncclResult_t launch_units(std::vector<Unit *> &units) {
    ncclResult_t ret = ncclSuccess;
    for (Unit *u : units) {
        ncclComm *c = u->comm;
        if (c->blocking) {
            ncclResult_t r = launch_unit(u);
            if (r != ncclSuccess && ret == ncclSuccess) ret = r;
            continue;
        }
        c->async.store(ncclInProgress);
        post_job(c, [u, c] {
            ncclResult_t r = launch_unit(u);
            if (r != ncclSuccess) {
                set_error(c, r);
            } else {
                int ip = ncclInProgress;
                c->async.compare_exchange_strong(ip, ncclSuccess);
            }
        });
        ret = ncclInProgress;
    }
    units.clear();
    return ret;
}

/* ---- groups (per thread) ---- */

thread_local int t_depth = 0;
thread_local ncclResult_t t_group_error = ncclSuccess;
thread_local int t_group_blocking = -1;
thread_local std::vector<Op> t_group_ops;

void group_reset() {
    t_group_error = ncclSuccess;
    t_group_blocking = -1;
    t_group_ops.clear();
}

/* a failure of a call: inside a group it is the group's error; on a non-blocking
 * communicator it is also the communicator's asynchronous error */
ncclResult_t failed(ncclComm *c, ncclResult_t r) {
    if (r == ncclSuccess || r == ncclInProgress) return r;
    if (t_depth > 0) t_group_error = r;
    if (c && !c->blocking && !c->released) set_error(c, r);
    return r;
}

/* a group left open after a failure: NCCL would swallow every later call into it */
bool stale_group(const char *what) {
    if (t_depth == 0 || t_group_error == ncclSuccess) return false;
    note_error(true,
               "%s: called while a group (ncclGroupStart, depth %d) that failed (%s) is still open: the caller must "
               "end a group with ncclGroupEnd even after a failed call inside it",
               what, t_depth, ncclGetErrorString(t_group_error));
    return true;
}

ncclResult_t check_comm(ncclComm *c, const char *what) {
    if (!c) {
        note_error(true, "%s: communicator is NULL", what);
        return ncclInvalidArgument;
    }
    if (!known(c)) rt_emu_fatal("emulated NCCL: %s: %p is not a communicator", what, (void *)c);
    if (c->released) {
        note_error(true, "%s: the communicator was destroyed or aborted", what);
        return ncclInvalidArgument;
    }
    return ncclSuccess;
}

/* NCCL's ncclCommEnsureReady: a communicator still in progress may not be used */
ncclResult_t ensure_ready(ncclComm *c, const char *what) {
    if (c->abort_flag) return ncclInvalidUsage;
    int a = c->async.load();
    if (a == ncclInProgress) {
        note_error(true, "%s: Attempt to use communicator before the previous operation returned ncclSuccess "
                         "(poll ncclCommGetAsyncError)", what);
        return ncclInvalidArgument;
    }
    return (ncclResult_t)a;
}

ncclResult_t check_buffer(ncclComm *c, const void *p, size_t n, const char *what, const char *which) {
    if (n == 0) return ncclSuccess;
    if (!p) {
        note_error(true, "%s: %s is NULL", what, which);
        return ncclInvalidArgument;
    }
    int d = rt_emu_ptr_device(p);
    if (d >= 0 && d != c->dev) {
        note_error(true, "%s: %s %p is on device %d, the communicator on device %d", what, which, p, d, c->dev);
        return ncclInvalidArgument;
    }
    return ncclSuccess;
}

ncclResult_t validate(const Op &o) {
    ncclComm *c = o.comm;
    const char *what = kind_name(o.kind);
    if (type_size(o.dt) == 0) {
        note_error(true, "%s: data type %d is not emulated", what, (int)o.dt);
        return ncclInvalidArgument;
    }
    bool reduces = o.kind == kAllReduce || o.kind == kReduce || o.kind == kReduceScatter;
    if (reduces && (o.op < ncclSum || o.op > ncclAvg)) {
        note_error(true, "%s: reduction operation %d", what, (int)o.op);
        return ncclInvalidArgument;
    }
    if (o.root < 0 || o.root >= c->nranks) {
        note_error(true, "%s: %s %d of %d ranks", what, o.kind == kSend || o.kind == kRecv ? "peer" : "root", o.root,
                   c->nranks);
        return ncclInvalidArgument;
    }
    size_t nb = o.count * type_size(o.dt), n = (size_t)c->nranks;
    size_t in = o.kind == kReduceScatter ? nb * n : nb, out = o.kind == kAllGather ? nb * n : nb;
    bool reads = o.kind != kRecv && (o.kind != kBroadcast || c->rank == o.root);
    bool writes = o.kind != kSend && (o.kind != kReduce || c->rank == o.root);
    ncclResult_t r = reads ? check_buffer(c, o.send, in, what, "sendbuff") : ncclSuccess;
    if (r == ncclSuccess && writes) r = check_buffer(c, o.recv, out, what, "recvbuff");
    return r;
}

/* The ledger: one library call per operation (grouped or not), the device bytes of its
 * send buffer read and its receive buffer written on this rank (validate's sizes); no
 * FLOPs and no link time (the model knows no network). */
void record_cost(const Op &o) {
    ncclComm *c = o.comm;
    const double nb = (double)o.count * (double)type_size(o.dt), n = c->nranks;
    const double in = o.kind == kReduceScatter ? nb * n : nb, out = o.kind == kAllGather ? nb * n : nb;
    const bool reads = o.kind != kRecv && (o.kind != kBroadcast || c->rank == o.root);
    const bool writes = o.kind != kSend && (o.kind != kReduce || c->rank == o.root);
    const rt_emu_cost cost{reads ? in : 0.0, writes ? out : 0.0, 0.0, RT_COST_MATH_NONE};
    rt_emu_ledger_record(o.stream, RT_COST_NCCL, kind_name(o.kind), &cost);
}

/* Every operation: checks, then into the group, or (ungrouped) enqueued at once. */
ncclResult_t submit(Op o) {
    const char *what = kind_name(o.kind);
    ncclResult_t r = check_comm(o.comm, what);
    if (r != ncclSuccess) return failed(nullptr, r);
    ncclComm *c = o.comm;
    if (stale_group(what)) return ncclInvalidUsage;
    if ((r = ensure_ready(c, what)) != ncclSuccess) return failed(c, r);
    if (c->finalized) {
        note_error(true, "%s: the communicator was finalized", what);
        return failed(c, ncclInvalidUsage);
    }
    if (inject_fail(what)) return failed(c, ncclUnhandledCudaError);
    if ((r = validate(o)) != ncclSuccess) return failed(c, r);
    record_cost(o);
    if (t_depth > 0) {
        if (t_group_blocking == -1) {
            t_group_blocking = c->blocking;
        } else if (t_group_blocking != (int)c->blocking) {
            note_error(true, "%s: Blocking and nonblocking communicators are not allowed in the same group", what);
            return failed(c, ncclInvalidArgument);
        }
        t_group_ops.push_back(o);
        return ncclSuccess;
    }
    std::vector<Unit *> units{new Unit(c, {o})};
    return failed(c, launch_units(units));
}

/* ---- finalize / destroy / abort helpers ---- */

/* Waits on the calling thread until the communicator's enqueued work has executed
 * (or an error or abort ends it). */
void drain(ncclComm *c, const char *what) {
    if (c->pending.load() == 0) return;
    rt_emu_count_host_sync(what);
    Waiter w(c);
    while (c->pending.load() > 0)
        if (!w.pause()) break; /* broken: the queued units skip their work */
    while (c->pending.load() > 0) sched_yield();
}

/* after a drain: when every unit of ours executed fully (nothing broke or aborted it),
 * our exit from now on is a clean one for the peers (kRankDone, see probe_peers) */
void mark_done(ncclComm *c) {
    if (c->hdr && c->ready && comm_ok(c) && c->pending.load() == 0) {
        uint32_t st = kRankJoined;
        c->rec(c->rank).state.compare_exchange_strong(st, kRankDone);
    }
}

void release(ncclComm *c) {
    if (c->released.exchange(true)) return;
    stop_launcher(c);
    if (c->hdr && c->rec(c->rank).state.load() == kRankJoined && !c->ready) c->rec(c->rank).state.store(kRankLeft);
    unlink_files(c); /* an init that never completed */
    drop_user(c);    /* the mapping goes when the last queued unit has run */
}

ncclResult_t init_comm(ncclComm **out, int nranks, const ncclUniqueId &id, int rank, const ncclConfig_t *cfg) {
    read_env();
    const char *what = cfg ? "ncclCommInitRankConfig" : "ncclCommInitRank";
    if (!out) return ncclInvalidArgument;
    *out = nullptr;
    if (stale_group(what)) return ncclInvalidUsage;
    if (t_depth > 0) {
        note_error(true, "%s inside a group is not emulated", what);
        return failed(nullptr, ncclInvalidUsage);
    }
    if (inject_fail(what)) return ncclUnhandledCudaError;
    if (nranks < 1 || rank < 0 || rank >= nranks) {
        note_error(true, "%s: rank %d of %d ranks", what, rank, nranks);
        return ncclInvalidArgument;
    }
    if (id_word(id, 0) != kIdMagic) {
        note_error(true, "%s: the unique id was not made by ncclGetUniqueId", what);
        return ncclInvalidArgument;
    }
    if (cfg && cfg->magic != 0xcafebeef) {
        note_error(true, "%s: config not initialized with NCCL_CONFIG_INITIALIZER", what);
        return ncclInvalidArgument;
    }
    ncclComm *c = new ncclComm;
    c->rank = rank;
    c->nranks = nranks;
    c->dev = rt_emu_current_device();
    c->blocking = !(cfg && cfg->blocking == 0);
    if (cudaDeviceGetPCIBusId(c->bus, (int)sizeof c->bus, c->dev) != cudaSuccess) {
        (void)cudaGetLastError();
        note_error(true, "%s: no PCI bus id for device %d", what, c->dev);
        delete c;
        return ncclUnhandledCudaError;
    }
    snprintf(c->seg_path, sizeof c->seg_path, "/dev/shm/ringtrain-emu-nccl-%016llx%016llx",
             (unsigned long long)id_word(id, 1), (unsigned long long)id_word(id, 2));
    snprintf(c->lock_path, sizeof c->lock_path, "%s-lock", c->seg_path);
    {
        std::lock_guard<std::mutex> l(g_comms_mu);
        g_comms.push_back(c);
    }
    *out = c;
    if (c->blocking) {
        ncclResult_t r = rendezvous(c);
        if (r != ncclSuccess) {
            release(c);
            *out = nullptr;
            return r;
        }
        c->ready = true;
        return ncclSuccess;
    }
    c->async.store(ncclInProgress);
    c->launcher = std::thread(launcher_main, c);
    post_job(c, [c] {
        ncclResult_t r = rendezvous(c);
        if (r != ncclSuccess) {
            set_error(c, r);
            return;
        }
        c->ready = true;
        int ip = ncclInProgress;
        c->async.compare_exchange_strong(ip, ncclSuccess);
    });
    return ncclInProgress;
}

}  // namespace

/* ---- the API ------------------------------------------------------------------------- */

extern "C" {

ncclResult_t ncclGetVersion(int *version) {
    if (!version) return ncclInvalidArgument;
    *version = NCCL_VERSION_CODE;
    return ncclSuccess;
}

ncclResult_t ncclGetUniqueId(ncclUniqueId *uniqueId) {
    if (!uniqueId) return ncclInvalidArgument;
    read_env();
    if (inject_fail("ncclGetUniqueId")) return ncclUnhandledCudaError;
    memset(uniqueId, 0, sizeof *uniqueId);
    memcpy(uniqueId->internal, &kIdMagic, 8);
    uint8_t rnd[16];
    size_t got = 0;
    while (got < sizeof rnd) {
        ssize_t n = getrandom(rnd + got, sizeof rnd - got, 0);
        if (n < 0 && errno != EINTR) return ncclSystemError;
        if (n > 0) got += (size_t)n;
    }
    memcpy(uniqueId->internal + 8, rnd, sizeof rnd);
    return ncclSuccess;
}

ncclResult_t ncclCommInitRankConfig(ncclComm_t *comm, int nranks, ncclUniqueId commId, int rank,
                                    ncclConfig_t *config) {
    ncclConfig_t dflt = NCCL_CONFIG_INITIALIZER;
    return init_comm(comm, nranks, commId, rank, config ? config : &dflt);
}

ncclResult_t ncclCommInitRank(ncclComm_t *comm, int nranks, ncclUniqueId commId, int rank) {
    return init_comm(comm, nranks, commId, rank, nullptr);
}

ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t *asyncError) {
    ncclResult_t r = check_comm(comm, "ncclCommGetAsyncError");
    if (r != ncclSuccess) return r;
    if (!asyncError) return ncclInvalidArgument;
    /* work outstanding: a look at the peers now and then, so that a dead one is reported
     * even while nothing of ours is executing yet */
    if (comm_ok(comm) && comm->ready && comm->pending.load() > 0) {
        uint64_t t = now_ns(), last = comm->last_probe.load();
        if (t - last > 10000000ull && comm->last_probe.compare_exchange_strong(last, t)) (void)probe_peers(comm);
    }
    *asyncError = (ncclResult_t)comm->async.load();
    return ncclSuccess;
}

ncclResult_t ncclCommCount(const ncclComm_t comm, int *count) {
    ncclResult_t r = check_comm(comm, "ncclCommCount");
    if (r == ncclSuccess) r = ensure_ready(comm, "ncclCommCount");
    if (r != ncclSuccess) return r;
    if (!count) return ncclInvalidArgument;
    *count = comm->nranks;
    return ncclSuccess;
}

ncclResult_t ncclCommCuDevice(const ncclComm_t comm, int *device) {
    ncclResult_t r = check_comm(comm, "ncclCommCuDevice");
    if (r == ncclSuccess) r = ensure_ready(comm, "ncclCommCuDevice");
    if (r != ncclSuccess) return r;
    if (!device) return ncclInvalidArgument;
    *device = comm->dev;
    return ncclSuccess;
}

ncclResult_t ncclCommUserRank(const ncclComm_t comm, int *rank) {
    ncclResult_t r = check_comm(comm, "ncclCommUserRank");
    if (r == ncclSuccess) r = ensure_ready(comm, "ncclCommUserRank");
    if (r != ncclSuccess) return r;
    if (!rank) return ncclInvalidArgument;
    *rank = comm->rank;
    return ncclSuccess;
}

ncclResult_t ncclCommFinalize(ncclComm_t comm) {
    ncclResult_t r = check_comm(comm, "ncclCommFinalize");
    if (r != ncclSuccess) return r;
    if (stale_group("ncclCommFinalize")) return ncclInvalidUsage;
    if ((r = ensure_ready(comm, "ncclCommFinalize")) != ncclSuccess) return failed(comm, r);
    if (inject_fail("ncclCommFinalize")) return failed(comm, ncclUnhandledCudaError);
    comm->finalized = true;
    if (comm->blocking) {
        drain(comm, "ncclCommFinalize");
        mark_done(comm);
        int a = comm->async.load();
        return a == ncclInProgress ? ncclSuccess : (ncclResult_t)a;
    }
    comm->async.store(ncclInProgress);
    post_job(comm, [comm] {
        Waiter w(comm);
        while (comm->pending.load() > 0)
            if (!w.pause()) return; /* the error stays the asynchronous error */
        mark_done(comm);
        int ip = ncclInProgress;
        comm->async.compare_exchange_strong(ip, ncclSuccess);
    });
    return ncclInProgress;
}

ncclResult_t ncclCommDestroy(ncclComm_t comm) {
    if (!comm) return ncclSuccess;
    ncclResult_t r = check_comm(comm, "ncclCommDestroy");
    if (r != ncclSuccess) return r;
    if (inject_fail("ncclCommDestroy")) return failed(comm, ncclUnhandledCudaError);
    if (comm->async.load() == ncclInProgress && !comm->finalized) {
        note_error(true, "ncclCommDestroy: Attempt to use communicator before the previous operation returned "
                         "ncclSuccess (poll ncclCommGetAsyncError)");
        return ncclInvalidArgument;
    }
    stop_launcher(comm); /* finishes a finalize in progress */
    drain(comm, "ncclCommDestroy");
    mark_done(comm);
    release(comm);
    return ncclSuccess;
}

ncclResult_t ncclCommAbort(ncclComm_t comm) {
    if (!comm) return ncclSuccess;
    ncclResult_t r = check_comm(comm, "ncclCommAbort");
    if (r != ncclSuccess) return r;
    if (inject_fail("ncclCommAbort")) return failed(comm, ncclUnhandledCudaError);
    comm->abort_flag.store(true, std::memory_order_release); /* every wait of it ends */
    release(comm);
    return ncclSuccess;
}

const char *ncclGetErrorString(ncclResult_t code) {
    switch (code) {
    case ncclSuccess:
        return "no error";
    case ncclUnhandledCudaError:
        return "unhandled cuda error (run with NCCL_DEBUG=INFO for details)";
    case ncclSystemError:
        return "unhandled system error (run with NCCL_DEBUG=INFO for details)";
    case ncclInternalError:
        return "internal error - please report this issue to the NCCL developers";
    case ncclInvalidArgument:
        return "invalid argument (run with NCCL_DEBUG=WARN for details)";
    case ncclInvalidUsage:
        return "invalid usage (run with NCCL_DEBUG=WARN for details)";
    case ncclRemoteError:
        return "remote process exited or there was a network error";
    case ncclInProgress:
        return "NCCL operation in progress";
    default:
        return "unknown result code";
    }
}

const char *ncclGetLastError(ncclComm_t comm) {
    (void)comm;
    static thread_local std::string copy;
    std::lock_guard<std::mutex> l(g_err_mu);
    copy = g_last_error;
    return copy.c_str();
}

ncclResult_t ncclAllReduce(const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype,
                           ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream) {
    return submit(Op{kAllReduce, sendbuff, recvbuff, count, datatype, op, 0, comm, stream});
}

ncclResult_t ncclReduce(const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype, ncclRedOp_t op,
                        int root, ncclComm_t comm, cudaStream_t stream) {
    return submit(Op{kReduce, sendbuff, recvbuff, count, datatype, op, root, comm, stream});
}

ncclResult_t ncclBroadcast(const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype, int root,
                           ncclComm_t comm, cudaStream_t stream) {
    return submit(Op{kBroadcast, sendbuff, recvbuff, count, datatype, ncclSum, root, comm, stream});
}

ncclResult_t ncclBcast(void *buff, size_t count, ncclDataType_t datatype, int root, ncclComm_t comm,
                       cudaStream_t stream) {
    return submit(Op{kBroadcast, buff, buff, count, datatype, ncclSum, root, comm, stream});
}

ncclResult_t ncclAllGather(const void *sendbuff, void *recvbuff, size_t sendcount, ncclDataType_t datatype,
                           ncclComm_t comm, cudaStream_t stream) {
    return submit(Op{kAllGather, sendbuff, recvbuff, sendcount, datatype, ncclSum, 0, comm, stream});
}

ncclResult_t ncclReduceScatter(const void *sendbuff, void *recvbuff, size_t recvcount, ncclDataType_t datatype,
                               ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream) {
    return submit(Op{kReduceScatter, sendbuff, recvbuff, recvcount, datatype, op, 0, comm, stream});
}

ncclResult_t ncclSend(const void *sendbuff, size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm,
                      cudaStream_t stream) {
    return submit(Op{kSend, sendbuff, nullptr, count, datatype, ncclSum, peer, comm, stream});
}

ncclResult_t ncclRecv(void *recvbuff, size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm,
                      cudaStream_t stream) {
    return submit(Op{kRecv, nullptr, recvbuff, count, datatype, ncclSum, peer, comm, stream});
}

ncclResult_t ncclGroupStart(void) {
    read_env();
    if (inject_fail("ncclGroupStart")) return failed(nullptr, ncclUnhandledCudaError);
    t_depth++;
    return ncclSuccess;
}

/* The outermost end enqueues the group's work, one unit per communicator in the order of
 * their first operation; a group that failed drops its work and returns the error. */
ncclResult_t ncclGroupEnd(void) {
    if (t_depth == 0) {
        note_error(true, "ncclGroupEnd: not in a group call.");
        return ncclInvalidUsage;
    }
    if (--t_depth > 0) return ncclSuccess;
    ncclResult_t err = t_group_error;
    if (err == ncclSuccess && inject_fail("ncclGroupEnd")) err = ncclUnhandledCudaError;
    std::vector<Op> ops;
    ops.swap(t_group_ops);
    group_reset();
    if (err != ncclSuccess) {
        for (const Op &o : ops)
            if (!o.comm->blocking && !o.comm->released) set_error(o.comm, err);
        return err;
    }
    std::vector<Unit *> units;
    for (const Op &o : ops) {
        Unit *u = nullptr;
        for (Unit *x : units)
            if (x->comm == o.comm) u = x;
        if (!u) units.push_back(u = new Unit(o.comm, {}));
        u->ops.push_back(o);
    }
    return launch_units(units);
}

int rt_emu_nccl_group_depth(void) { return t_depth; }

int rt_emu_nccl_live_comms(void) { return live_comms(); }

}  // extern "C"
