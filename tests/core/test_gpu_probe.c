/* What `device: auto` does when the CUDA runtime cannot count the GPUs (issue 19,
 * defect 3): only "no device" (and no driver) lets auto use the CPU; a driver updated
 * without a reboot (cudaErrorSystemDriverMismatch, 803), GPUs busy in exclusive-process
 * mode (cudaErrorDevicesUnavailable, 46) and a failed initialisation
 * (cudaErrorInitializationError, 3) are errors (RT_ERR_CUDA) that name the cause, from
 * rt_cuda_device_count and from rt_device_select("auto") (what the trainer calls).
 *
 * Label gpu. The failures are injected by the emulated runtime (RINGTRAIN_CUDA=EMU:
 * RINGTRAIN_EMU_FAIL_INIT=<error> makes cudaGetDeviceCount fail with it,
 * RINGTRAIN_EMU_GPUS=0 gives cudaErrorNoDevice); a process initialises CUDA once, so
 * each case runs in a process of its own (this program again, with the variable set
 * before its first CUDA call). On a real GPU only the healthy case runs (auto picks the
 * GPU); without a GPU the test is skipped (77). */
#include "test_util.h"

#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

typedef struct probe_case {
    const char *name;
    const char *fail_init; /* RINGTRAIN_EMU_FAIL_INIT, or NULL */
    const char *gpus;      /* RINGTRAIN_EMU_GPUS, or NULL */
    rt_status want;        /* of rt_cuda_device_count and rt_device_select("auto") */
    const char *cause;     /* in both messages */
} probe_case;

static const probe_case k_cases[] = {
    {"driver-mismatch", "803", NULL, RT_ERR_CUDA, "updated without a reboot"},
    {"devices-unavailable", "46", NULL, RT_ERR_CUDA, "exclusive-process"},
    {"init-error", "3", NULL, RT_ERR_CUDA, "failed to initialise"},
    {"no-device", NULL, "0", RT_ERR_NODEVICE, "no GPU"},
};
enum { NCASES = sizeof k_cases / sizeof k_cases[0] };

#define CHECK(cond, ...)                                                                                               \
    do {                                                                                                               \
        if (!(cond)) {                                                                                                 \
            printf("FAIL [%s]: ", c->name);                                                                            \
            printf(__VA_ARGS__);                                                                                       \
            printf("\n");                                                                                              \
            return 1;                                                                                                  \
        }                                                                                                              \
    } while (0)

/* one case, in its own process: the environment is set before the first CUDA call */
static int run_case(const probe_case *c) {
    int n = -1;
    rt_status st = rt_cuda_device_count(&n);
    char msg[2048];
    snprintf(msg, sizeof msg, "%s", rt_error_message());
    printf("[%s] rt_cuda_device_count -> %s: %s\n", c->name, rt_status_name(st), msg);
    CHECK(st == c->want, "rt_cuda_device_count returned %s, expected %s", rt_status_name(st), rt_status_name(c->want));
    CHECK(n == 0, "count %d after a failure", n);
    CHECK(strstr(msg, c->cause), "the message does not name the cause ('%s')", c->cause);
    if (c->want != RT_ERR_NODEVICE) CHECK(!strstr(msg, "no GPU"), "an unusable GPU reported as 'no GPU'");
    rt_error_clear();

    rt_device d = rt_device_cuda(7);
    st = rt_device_select("auto", 0, &d);
    snprintf(msg, sizeof msg, "%s", rt_error_message());
    printf("[%s] rt_device_select(auto) -> %s (%s): %s\n", c->name, rt_status_name(st),
           rt_device_is_cuda(d) ? "cuda" : "cpu", msg);
    if (c->want == RT_ERR_NODEVICE) {
        CHECK(st == RT_OK && d.kind == RT_DEVICE_CPU, "auto without a GPU: expected the CPU");
    } else {
        CHECK(st == c->want, "auto returned %s (device %s): it must not fall back to the CPU", rt_status_name(st),
              rt_device_is_cuda(d) ? "cuda" : "cpu");
        CHECK(strstr(msg, c->cause), "auto's error does not name the cause ('%s')", c->cause);
        CHECK(strstr(msg, "device: cpu"), "auto's error does not say that device: cpu trains on the CPU");
    }
    rt_error_clear();
    st = rt_device_select("cuda", 0, &d);
    CHECK(st == c->want, "device cuda returned %s, expected %s", rt_status_name(st), rt_status_name(c->want));
    CHECK(strstr(rt_error_message(), c->cause), "device cuda's error does not name the cause ('%s')", c->cause);
    rt_error_clear();
    /* the CPU asks no driver */
    st = rt_device_select("cpu", 0, &d);
    CHECK(st == RT_OK && d.kind == RT_DEVICE_CPU, "device cpu failed: %s", rt_error_message());
    printf("[%s] ok\n", c->name);
    return 0;
}

#ifdef RT_EMU_FULL_RUNTIME
static void injected_failures(void **s) {
    (void)s;
    int failed = 0;
    for (int i = 0; i < NCASES; i++) {
        const probe_case *c = &k_cases[i];
        fflush(NULL);
        pid_t p = fork();
        assert_true(p >= 0);
        if (p == 0) {
            if (c->fail_init) setenv("RINGTRAIN_EMU_FAIL_INIT", c->fail_init, 1);
            if (c->gpus) setenv("RINGTRAIN_EMU_GPUS", c->gpus, 1);
            char idx[16];
            snprintf(idx, sizeof idx, "%d", i);
            execl("/proc/self/exe", "test_gpu_probe", "--case", idx, (char *)NULL);
            _exit(126);
        }
        int ws = 0;
        assert_int_equal(waitpid(p, &ws, 0), p);
        if (!WIFEXITED(ws) || WEXITSTATUS(ws) != 0) {
            printf("case %s: the child %s %d\n", c->name, WIFEXITED(ws) ? "exited" : "was killed by signal",
                   WIFEXITED(ws) ? WEXITSTATUS(ws) : WTERMSIG(ws));
            failed++;
        }
    }
    assert_int_equal(failed, 0);
}
#endif

/* a healthy GPU: auto picks it */
static void healthy_gpu(void **s) {
    (void)s;
    rt_device d;
    assert_rt_ok(rt_device_select("auto", 0, &d));
    assert_int_equal(d.kind, RT_DEVICE_CUDA);
}

int main(int argc, char **argv) {
    if (argc == 3 && strcmp(argv[1], "--case") == 0) {
        int i = atoi(argv[2]);
        return i >= 0 && i < NCASES ? run_case(&k_cases[i]) : 2;
    }
#ifdef RT_EMU_FULL_RUNTIME
    /* the emulated runtime injects the failures; probe each in a child before this
     * process touches CUDA itself */
    const struct CMUnitTest emu[] = {cmocka_unit_test(injected_failures)};
    int rc = cmocka_run_group_tests(emu, NULL, NULL);
    if (rc != 0) return rc;
#endif
    RT_SKIP_WITHOUT_GPU();
    const struct CMUnitTest tests[] = {cmocka_unit_test(healthy_gpu)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
