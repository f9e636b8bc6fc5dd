/* A checkpoint writer killed with SIGKILL at points spread over a whole write (a
 * ResNet18 of width 32 with Adam + amsgrad: ~45 MB per checkpoint) never leaves a
 * ckpt-* that is not complete: after every kill each ckpt-* directory verifies, find()
 * returns one, and the first checkpoint still loads bitwise. The temporaries the killed
 * writers left are ignored by find() and removed by the next successful write.
 *
 * The kill points are fractions of the duration of one full write measured here (no
 * wall-clock threshold is asserted: a slow machine only moves where the kills land). */
#include "ckpt_test_util.h"

#include "core/timer.h"

#include <dirent.h>
#include <signal.h>
#include <sys/wait.h>
#include <time.h>

/* every ckpt-* of dir verifies; returns how many */
static int all_complete(const char *dir) {
    DIR *d = opendir(dir);
    assert_non_null(d);
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (strncmp(e->d_name, "ckpt-", 5) != 0) continue;
        char p[1024];
        snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
        if (rt_ckpt_verify(p, NULL) != RT_OK) fail_msg("%s is visible but incomplete: %s", p, rt_error_message());
        n++;
    }
    closedir(d);
    return n;
}

static void test_kill_during_write(void **state) {
    (void)state;
    char dir[256];
    ct_tmpdir(dir, sizeof dir, "kill");
    ct_run r, b;
    ct_build(&r, RT_ARCH_RESNET18, 32, RT_OPTIM_ADAM, 1);
    ct_train(&r, 1, 3);
    rt_ckpt_meta m;
    ct_meta(&m, 0);
    char first[RT_CKPT_PATH_MAX];
    rt_timer t;
    rt_timer_start(&t);
    assert_rt_ok(rt_ckpt_write(dir, 1, r.model, &r.opt, &m, 0, first, sizeof first));
    double full = rt_timer_elapsed_s(&t);
    print_message("one write: %.3f s\n", full);

    enum { KILLS = 12 };
    int completed = 0;
    uint64_t jitter = 0x9E3779B97F4A7C15ull;
    for (int k = 0; k < KILLS; k++) {
        jitter = jitter * 6364136223846793005ull + 1442695040888963407ull;
        double frac = ((double)k + (double)(jitter >> 11) / 9007199254740992.0) / KILLS; /* spread over [0, 1) */
        double delay = full * 1.1 * frac;
        fflush(NULL);
        pid_t pid = fork();
        assert_true(pid >= 0);
        if (pid == 0) {
            rt_status s = rt_ckpt_write(dir, 100 + k, r.model, &r.opt, &m, 0, NULL, 0);
            _exit(s == RT_OK ? 0 : 1);
        }
        struct timespec ts = {.tv_sec = (time_t)delay, .tv_nsec = (long)((delay - (double)(time_t)delay) * 1e9)};
        nanosleep(&ts, NULL);
        kill(pid, SIGKILL);
        int ws;
        assert_int_equal(waitpid(pid, &ws, 0), pid);
        if (WIFEXITED(ws)) {
            assert_int_equal(WEXITSTATUS(ws), 0);
            completed++;
        }
        int n = all_complete(dir);
        assert_true(n >= 1);
        rt_ckpt_found f;
        assert_rt_ok(rt_ckpt_find(dir, &f));
        assert_int_equal(f.n_skipped, 0);
        print_message("kill %2d after %.3f s (%.0f%%): %s, %d checkpoints, %d temporaries, newest %s\n", k, delay,
                      100 * delay / full, WIFEXITED(ws) ? "finished" : "killed", n, ct_count_prefix(dir, ".ckpt-"),
                      f.path);
    }
    print_message("%d of %d writers finished before the kill\n", completed, KILLS);
    /* the first checkpoint still loads, bitwise */
    ct_build(&b, RT_ARCH_RESNET18, 32, RT_OPTIM_ADAM, 7);
    assert_rt_ok(rt_ckpt_load(first, b.model, &b.opt, NULL));
    ct_assert_same(&r, &b);
    /* the next successful write clears what the killed writers left */
    assert_rt_ok(rt_ckpt_write(dir, 1000, r.model, &r.opt, &m, 0, NULL, 0));
    assert_int_equal(ct_count_prefix(dir, ".ckpt-"), 0);
    rt_ckpt_meta_free(&m);
    ct_free(&r);
    ct_free(&b);
    ct_rmrf(dir);
}

int main(void) {
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_kill_during_write)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
