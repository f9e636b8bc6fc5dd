/* The host emulation of the CUDA execution model (see include/cuda_runtime.h and
 * docs/cuda-emulation.md).
 *
 * A grid runs its blocks one after another on one thread: the launching thread in the
 * kernels-only build, the stream's worker thread with the full runtime
 * (RT_EMU_FULL_RUNTIME, runtime.cpp), where a launch is enqueued on its stream and
 * returns at once. The threads of a block run as fibers: each runs until it returns or
 * calls __syncthreads, and a barrier opens when every thread of the block that has not
 * returned has reached it (threads that returned early no longer count, as on the device
 * since Volta). So shared memory, the barrier and the tree reductions behave as on the
 * GPU, in one fixed interleaving: races that the memory model leaves open are not
 * explored. Every piece of state is per thread, so several workers run kernels at once.
 *
 * Fibers: one per thread slot of a block (up to 1024), each on its own mmap'd stack,
 * started once with makecontext/setcontext and then switched with the compiler's
 * __builtin_setjmp/__builtin_longjmp (swapcontext saves the signal mask with a system
 * call at every switch, and AddressSanitizer's longjmp interceptor makes another: a
 * 512-block reduction took seconds). A fiber loops: wait for a thread, run the kernel
 * body as that thread, mark it done. Switches are annotated for AddressSanitizer, and
 * the functions that switch are not instrumented by it.
 */
#include <cuda_runtime.h>
#ifdef RT_EMU_FULL_RUNTIME
#include "core/cost_ledger.h"
#include "emu_internal.h"
#endif

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <ucontext.h>
#include <time.h>
#include <unistd.h>

#if defined(__SANITIZE_ADDRESS__)
#define RT_EMU_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define RT_EMU_ASAN 1
#endif
#endif
#ifdef RT_EMU_ASAN
/* fiber switches annotated for AddressSanitizer (sanitizer/common_interface_defs.h) */
extern "C" void __sanitizer_start_switch_fiber(void **fake_stack_save, const void *bottom, size_t size);
extern "C" void __sanitizer_finish_switch_fiber(void *fake_stack_save, const void **bottom_old, size_t *size_old);
#endif

thread_local uint3 rt_emu_thread_idx, rt_emu_block_idx;
thread_local dim3 rt_emu_block_dim, rt_emu_grid_dim;

namespace {

/* __builtin_setjmp's buffer: frame pointer, resume address, stack pointer (+ spare) */
typedef void *jump_buf[5];

/* the functions that switch stacks: not instrumented by AddressSanitizer (it would
 * unpoison the stack at every jump, with a system call; nothing is abandoned here) */
#define RT_EMU_SWITCHES __attribute__((no_sanitize_address, noinline))

/* resume where __builtin_setjmp(jb) was called, making it return 1; never inlined:
 * __builtin_setjmp and __builtin_longjmp must not be in the same function */
[[noreturn]] RT_EMU_SWITCHES void jump(jump_buf jb) { __builtin_longjmp(jb, 1); }

enum { MAX_THREADS = 1024, STACK_BYTES = 256 << 10 };

enum fiber_state { IDLE, RUNNABLE, AT_BARRIER, DONE };

struct fiber {
    jump_buf jb; /* where the fiber waits */
    void *stack; /* STACK_BYTES usable, above a guard page */
    fiber_state state;
    uint3 idx;
    void *fake; /* ASan's fake stack of the fiber while it is switched out */
};

struct emu_thread_state {
    cudaError_t last_error = cudaSuccess;
    fiber *fibers = nullptr;
    unsigned nfibers = 0;     /* fibers[0 .. nfibers) are started and wait */
    jump_buf sched;           /* where the scheduler waits */
    fiber *current = nullptr; /* the fiber running now; NULL outside a launch */
    fiber *starting = nullptr;
    void (*body)(void *) = nullptr;
    void *arg = nullptr;
    void *sched_fake = nullptr;
    const void *sched_bottom = nullptr;
    size_t sched_size = 0;
};

thread_local emu_thread_state T;
unsigned long long launches; /* all threads */
#ifndef RT_EMU_FULL_RUNTIME
size_t allocated; /* bytes from rt_emu_malloc */
#endif

[[noreturn]] void die(const char *what) {
    fprintf(stderr, "cuda emulation: %s\n", what);
    abort();
}

void *stack_alloc(void) {
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    char *p = (char *)mmap(nullptr, STACK_BYTES + page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) die("mmap of a fiber stack failed");
    if (mprotect(p, page, PROT_NONE) != 0) die("mprotect of a stack guard page failed");
    return p + page;
}

inline void before_switch_to_fiber(fiber *f) {
#ifdef RT_EMU_ASAN
    __sanitizer_start_switch_fiber(&T.sched_fake, f->stack, STACK_BYTES);
#else
    (void)f;
#endif
}
inline void after_switch_to_scheduler(void) {
#ifdef RT_EMU_ASAN
    __sanitizer_finish_switch_fiber(T.sched_fake, nullptr, nullptr);
#endif
}

/* from the running fiber f to the scheduler; returns when the scheduler resumes f */
RT_EMU_SWITCHES void fiber_wait(fiber *f) {
    if (!__builtin_setjmp(f->jb)) {
#ifdef RT_EMU_ASAN
        __sanitizer_start_switch_fiber(&f->fake, T.sched_bottom, T.sched_size);
#endif
        jump(T.sched);
    }
#ifdef RT_EMU_ASAN
    __sanitizer_finish_switch_fiber(f->fake, &T.sched_bottom, &T.sched_size);
#endif
}

void fiber_main(void) {
    fiber *f = T.starting;
#ifdef RT_EMU_ASAN
    __sanitizer_finish_switch_fiber(nullptr, &T.sched_bottom, &T.sched_size);
#endif
    for (;;) {
        fiber_wait(f); /* until given a thread */
        T.body(T.arg);
        f->state = DONE;
    }
}

/* start fiber slots up to n: each runs to its first wait */
RT_EMU_SWITCHES void fibers_reserve(unsigned n) {
    if (!T.fibers) {
        T.fibers = (fiber *)calloc(MAX_THREADS, sizeof(fiber));
        if (!T.fibers) die("out of memory");
    }
    for (; T.nfibers < n; T.nfibers++) {
        fiber *f = &T.fibers[T.nfibers];
        f->stack = stack_alloc();
        f->state = IDLE;
        static thread_local ucontext_t boot;
        if (getcontext(&boot) != 0) die("getcontext failed");
        boot.uc_stack.ss_sp = f->stack;
        boot.uc_stack.ss_size = STACK_BYTES;
        boot.uc_link = nullptr;
        makecontext(&boot, fiber_main, 0);
        T.starting = f;
        if (!__builtin_setjmp(T.sched)) {
            before_switch_to_fiber(f);
            setcontext(&boot);
            die("setcontext failed");
        }
        after_switch_to_scheduler();
    }
}

RT_EMU_SWITCHES void switch_to(fiber *f) {
    T.current = f;
    rt_emu_thread_idx = f->idx;
    if (!__builtin_setjmp(T.sched)) {
        before_switch_to_fiber(f);
        jump(f->jb);
    }
    after_switch_to_scheduler();
    T.current = nullptr;
}

void run_block(unsigned nthreads) {
    fibers_reserve(nthreads);
    const dim3 b = rt_emu_block_dim;
    for (unsigned t = 0; t < nthreads; t++) {
        fiber *f = &T.fibers[t];
        f->state = RUNNABLE;
        f->idx = uint3{t % b.x, (t / b.x) % b.y, t / (b.x * b.y)};
    }
    /* phases between barriers: run every runnable thread in order until it returns or
     * waits; when all live threads wait, open the barrier */
    for (;;) {
        unsigned waiting = 0;
        for (unsigned t = 0; t < nthreads; t++) {
            fiber *f = &T.fibers[t];
            if (f->state != RUNNABLE) continue;
            switch_to(f);
            if (f->state == AT_BARRIER)
                waiting++;
            else if (f->state != DONE)
                die("a thread neither returned nor waits at the barrier");
        }
        if (waiting == 0) break;
        for (unsigned t = 0; t < nthreads; t++)
            if (T.fibers[t].state == AT_BARRIER) T.fibers[t].state = RUNNABLE;
    }
    for (unsigned t = 0; t < nthreads; t++) T.fibers[t].state = IDLE;
}

bool config_ok(dim3 grid, dim3 block) {
    unsigned long long threads = (unsigned long long)block.x * block.y * block.z;
    if (block.x == 0 || block.y == 0 || block.z == 0 || block.x > 1024 || block.y > 1024 || block.z > 64 ||
        threads > MAX_THREADS)
        return false;
    if (grid.x == 0 || grid.y == 0 || grid.z == 0 || grid.x > 2147483647u || grid.y > 65535 || grid.z > 65535)
        return false;
    return true;
}

} // namespace

namespace {
/* clock64(): the grid's threads run one after another here, while on the device they
 * start together. So each thread's first reading is the grid's start, and later
 * readings are the real time since then (at 2 GHz): a thread that spins N cycles keeps
 * the grid busy for about N cycles of real time in all, not N per thread. */
thread_local uint64_t clk_start_ns;     /* the grid running on this thread: its start */
thread_local unsigned long long clk_key; /* the (grid, block, thread) of the last reading */
thread_local unsigned long long clk_grid;
unsigned long long clk_grids; /* all threads */

uint64_t mono_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

} // namespace

long long rt_emu_clock64(void) {
    const dim3 g = rt_emu_grid_dim, b = rt_emu_block_dim;
    const uint3 bi = rt_emu_block_idx, ti = rt_emu_thread_idx;
    unsigned long long block = ((unsigned long long)bi.z * g.y + bi.y) * g.x + bi.x;
    unsigned long long thread = ((unsigned long long)ti.z * b.y + ti.y) * b.x + ti.x;
    unsigned long long key = (clk_grid << 42) ^ (block << 10) ^ thread;
    if (key != clk_key) { /* this thread's first reading: the grid's start */
        clk_key = key;
        return 0;
    }
    return (long long)((mono_ns() - clk_start_ns) * 2);
}

void __syncthreads(void) {
    if (!T.current) die("__syncthreads called outside a kernel");
    T.current->state = AT_BARRIER;
    fiber_wait(T.current);
}

namespace {

/* run the whole grid now, on this thread */
void run_grid_now(dim3 grid, dim3 block, void (*body)(void *), void *arg) {
    const unsigned nthreads = block.x * block.y * block.z;
    clk_grid = __atomic_add_fetch(&clk_grids, 1, __ATOMIC_RELAXED);
    clk_start_ns = mono_ns();
    const dim3 saved_grid = rt_emu_grid_dim, saved_block = rt_emu_block_dim;
    rt_emu_grid_dim = grid;
    rt_emu_block_dim = block;
    T.body = body;
    T.arg = arg;
    for (unsigned z = 0; z < grid.z; z++)
        for (unsigned y = 0; y < grid.y; y++)
            for (unsigned x = 0; x < grid.x; x++) {
                rt_emu_block_idx = uint3{x, y, z};
                run_block(nthreads);
            }
    T.body = nullptr;
    T.arg = nullptr;
    rt_emu_grid_dim = saved_grid;
    rt_emu_block_dim = saved_block;
}

#ifdef RT_EMU_FULL_RUNTIME

void set_launch_error(cudaError_t e) { rt_emu_set_last_error(e); }

/* a launch waiting in its stream's queue: the grid and the copied arguments */
struct grid_op {
    dim3 grid, block;
    void (*body)(void *);
    void *arg;
    void (*cleanup)(void *);
};

void grid_op_run(void *p) {
    grid_op *g = static_cast<grid_op *>(p);
    if (rt_emu_ledger_count_only()) return; /* RINGTRAIN_EMU_LEDGER=count: recorded, not run */
    run_grid_now(g->grid, g->block, g->body, g->arg);
}

void grid_op_cleanup(void *p) {
    grid_op *g = static_cast<grid_op *>(p);
    if (g->cleanup) g->cleanup(g->arg);
    delete g;
}

#else

void set_launch_error(cudaError_t e) { T.last_error = e; }

#endif

} // namespace

void rt_emu_run_grid(const char *name, dim3 grid, dim3 block, size_t smem, cudaStream_t stream, void (*body)(void *),
                     void *arg, void (*cleanup)(void *), int nargs, const rt_emu_karg *args) {
    if (T.current) die("kernel launched from inside a kernel (dynamic parallelism is not emulated)");
    if (!config_ok(grid, block)) {
        set_launch_error(cudaErrorInvalidConfiguration);
        if (cleanup) cleanup(arg);
        return;
    }
    if (smem != 0) die("dynamic shared memory (the third <<<>>> argument) is not emulated");
#ifdef RT_EMU_FULL_RUNTIME
    /* the cost from the parameters before the launch is enqueued (they live in arg) */
    rt_emu_cost cost{}; /* always: a capture keeps it for the ledger of the graph's launches */
    const bool known = rt_emu_kernel_cost(name, grid, block, nargs, args, &cost);
    grid_op *g = new grid_op{grid, block, body, arg, cleanup};
    cudaError_t e = rt_emu_stream_enqueue(stream, name, grid_op_run, g, grid_op_cleanup);
    if (e != cudaSuccess) {
        grid_op_cleanup(g);
        set_launch_error(e);
        return;
    }
    __atomic_add_fetch(&launches, 1, __ATOMIC_RELAXED);
    if (known)
        rt_emu_ledger_record(stream, RT_COST_KERNEL, name, &cost);
    else
        rt_emu_ledger_unknown_kernel(stream, name);
#else
    (void)name;
    (void)nargs;
    (void)args;
    (void)stream; /* runs now: every stream is in order with itself and with the host */
    __atomic_add_fetch(&launches, 1, __ATOMIC_RELAXED);
    run_grid_now(grid, block, body, arg);
    if (cleanup) cleanup(arg);
#endif
}

extern "C" {

unsigned long long rt_emu_launch_count(void) { return __atomic_load_n(&launches, __ATOMIC_RELAXED); }

#ifdef RT_EMU_FULL_RUNTIME

/* runtime.cpp refers to it: linking the full runtime with a kernels-only emu.cpp (or the
 * other way round) fails at link time instead of misbehaving */
extern const int rt_emu_kernels_with_full_runtime = 1;

#else /* kernels only: "device" memory is host memory, pointers are passed as they are */

void *rt_emu_kernel_arg(const void *p, const char *kernel, int index, cudaStream_t stream) {
    (void)kernel;
    (void)index;
    (void)stream;
    return const_cast<void *>(p);
}

cudaError_t rt_emu_get_last_error(int clear) {
    cudaError_t e = T.last_error;
    if (clear) T.last_error = cudaSuccess;
    return e;
}

#define RT_EMU_ERROR_NAME(name, number, text)                                                                          \
    case name:                                                                                                         \
        return #name;
#define RT_EMU_ERROR_TEXT(name, number, text)                                                                          \
    case name:                                                                                                         \
        return text;

const char *rt_emu_error_name(cudaError_t e) {
    switch (e) { RT_EMU_CUDA_ERRORS(RT_EMU_ERROR_NAME) }
    return "unrecognized error code";
}

const char *rt_emu_error_string(cudaError_t e) {
    switch (e) { RT_EMU_CUDA_ERRORS(RT_EMU_ERROR_TEXT) }
    return "unrecognized error code";
}

/* device memory is host memory; a size header keeps the count for cudaMemGetInfo */
cudaError_t rt_emu_malloc(void **p, size_t n) {
    size_t *h = (size_t *)malloc(n + 16);
    if (!h) {
        *p = nullptr;
        return cudaErrorMemoryAllocation;
    }
    h[0] = n;
    __atomic_add_fetch(&allocated, n, __ATOMIC_RELAXED);
    *p = (char *)h + 16;
    return cudaSuccess;
}

cudaError_t rt_emu_free(void *p) {
    if (!p) return cudaSuccess;
    size_t *h = (size_t *)((char *)p - 16);
    __atomic_sub_fetch(&allocated, h[0], __ATOMIC_RELAXED);
    free(h);
    return cudaSuccess;
}

cudaError_t rt_emu_mem_get_info(size_t *free_b, size_t *total_b) {
    const size_t total = (size_t)16 << 30;
    size_t used = __atomic_load_n(&allocated, __ATOMIC_RELAXED);
    *total_b = total;
    *free_b = used < total ? total - used : 0;
    return cudaSuccess;
}

#endif

} // extern "C"
