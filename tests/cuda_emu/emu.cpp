/* The host emulation of the CUDA execution model (see include/cuda_runtime.h and
 * docs/cuda-emulation.md).
 *
 * A launch runs its blocks one after another on the calling thread. The threads of a
 * block run as fibers: each runs until it returns or calls __syncthreads, and a barrier
 * opens when every thread of the block that has not returned has reached it (threads
 * that returned early no longer count, as on the device since Volta). So shared memory,
 * the barrier and the tree reductions behave as on the GPU, in one fixed interleaving:
 * races that the memory model leaves open are not explored.
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

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <ucontext.h>
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
size_t allocated;            /* bytes from rt_emu_malloc */

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

void __syncthreads(void) {
    if (!T.current) die("__syncthreads called outside a kernel");
    T.current->state = AT_BARRIER;
    fiber_wait(T.current);
}

void rt_emu_run_grid(dim3 grid, dim3 block, size_t smem, cudaStream_t stream, void (*body)(void *), void *arg) {
    (void)stream; /* runs now: every stream is in order with itself and with the host */
    if (T.current) die("kernel launched from inside a kernel (dynamic parallelism is not emulated)");
    if (!config_ok(grid, block)) {
        T.last_error = cudaErrorInvalidConfiguration;
        return;
    }
    if (smem != 0) die("dynamic shared memory (the third <<<>>> argument) is not emulated");
    __atomic_add_fetch(&launches, 1, __ATOMIC_RELAXED);
    const unsigned nthreads = block.x * block.y * block.z;
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

extern "C" {

cudaError_t rt_emu_get_last_error(int clear) {
    cudaError_t e = T.last_error;
    if (clear) T.last_error = cudaSuccess;
    return e;
}

const char *rt_emu_error_name(cudaError_t e) {
    switch (e) {
    case cudaSuccess:
        return "cudaSuccess";
    case cudaErrorInvalidValue:
        return "cudaErrorInvalidValue";
    case cudaErrorMemoryAllocation:
        return "cudaErrorMemoryAllocation";
    case cudaErrorInvalidConfiguration:
        return "cudaErrorInvalidConfiguration";
    case cudaErrorInsufficientDriver:
        return "cudaErrorInsufficientDriver";
    case cudaErrorNoDevice:
        return "cudaErrorNoDevice";
    case cudaErrorNotSupported:
        return "cudaErrorNotSupported";
    }
    return "cudaErrorUnknown";
}

const char *rt_emu_error_string(cudaError_t e) {
    switch (e) {
    case cudaSuccess:
        return "no error";
    case cudaErrorInvalidConfiguration:
        return "invalid configuration argument";
    default:
        return rt_emu_error_name(e);
    }
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

unsigned long long rt_emu_launch_count(void) { return __atomic_load_n(&launches, __ATOMIC_RELAXED); }

} // extern "C"
