/* The hang and desync diagnosis as a pure function (label unit): rt_flight_diagnose over
 * hand-made states of N ranks gives the exact text; the states' and fingerprints' text
 * forms survive a round trip (tags with spaces included); fingerprints that differ only
 * in their tag agree. docs/dist.md, "Hangs and desyncs". */
#include "../test_util.h"
#include "dist/internal/flight.h"
#include "dist/internal/names.h"
#include "dist/reduce.h"

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

static rt_flight_fp fp(uint32_t seq, int kind, int rop, rt_dtype dt, int root, uint64_t count, const char *tag) {
    rt_flight_fp f = {.seq = seq, .kind = kind, .rop = rop, .dtype = (int)dt, .root = root, .count = count};
    snprintf(f.tag, sizeof f.tag, "%s", tag);
    return f;
}

static rt_flight_state_rec waiting_in(rt_flight_fp p, double wait_s, rt_flight_fp done) {
    rt_flight_state_rec r = {.present = true, .npending = 1, .wait_s = wait_s, .last_done = done};
    r.pending[0] = p;
    return r;
}

/* the example: rank 2 is stopped before all_reduce #1532; 0, 1, 3 wait in it */
static void behind_names_the_rank(void **s) {
    (void)s;
    rt_flight_fp ar = fp(1532, RT_K_ALLREDUCE, RT_OP_AVG, RT_F32, 0, 524288, "bucket 3 of 6, step 212");
    rt_flight_fp bc = fp(1531, RT_K_BCAST, -1, RT_F32, 0, 16, "step 212");
    rt_flight_state_rec rec[4] = {waiting_in(ar, 12.0, bc), waiting_in(ar, 11.5, bc), {0}, waiting_in(ar, 3.2, bc)};
    char out[800];
    assert_int_equal(rt_flight_diagnose(rec, 4, out, sizeof out), 2);
    assert_string_equal(out, "rank 2 has not started all_reduce #1532 (f32 x 524288, 2.1 MB, avg, bucket 3 of 6, step "
                             "212); ranks 0,1,3 wait in it since 12.0 s; rank 2 published nothing (stopped, hung "
                             "outside the communicator, or dead)");
    /* read from its shared page on this host: its last completed operation too */
    rec[2].from_cell = true;
    rec[2].last_done = bc;
    rec[2].begun = bc;
    assert_int_equal(rt_flight_diagnose(rec, 4, out, sizeof out), 2);
    assert_string_equal(out, "rank 2 has not started all_reduce #1532 (f32 x 524288, 2.1 MB, avg, bucket 3 of 6, step "
                             "212); ranks 0,1,3 wait in it since 12.0 s; rank 2's last completed: broadcast #1531 "
                             "(f32 x 16, 64 B, root 0, step 212); rank 2 published nothing (stopped or hung outside "
                             "the communicator: read from its shared recorder page)");
    /* it began #1532 and never finished it: stuck inside, not behind */
    rec[2].begun = ar;
    assert_int_equal(rt_flight_diagnose(rec, 4, out, sizeof out), 2);
    assert_non_null(strstr(out, "rank 2 began but has not completed all_reduce #1532 ("));
}

/* a rank that completed the operation the others wait in is not behind; when every rank
 * waits in it (or completed it), there is nothing to say */
static void nobody_behind(void **s) {
    (void)s;
    rt_flight_fp ar = fp(9, RT_K_ALLREDUCE, RT_OP_SUM, RT_F64, 0, 3, "");
    rt_flight_fp none = {0};
    rt_flight_state_rec done = {.present = true, .last_done = ar};
    rt_flight_state_rec rec[3] = {waiting_in(ar, 2, none), waiting_in(ar, 2, none), done};
    char out[400] = "x";
    assert_int_equal(rt_flight_diagnose(rec, 3, out, sizeof out), 0);
    assert_string_equal(out, "");
    /* two ranks behind */
    rt_flight_state_rec rec2[3] = {waiting_in(ar, 5, none), {0}, {0}};
    assert_int_equal(rt_flight_diagnose(rec2, 3, out, sizeof out), 2);
    assert_non_null(strstr(out, "ranks 1,2 have not started all_reduce #9 (f64 x 3, 24 B, sum); rank 0 waits in it "
                                "since 5.0 s"));
}

/* ranks at one sequence number in different calls: a desync naming both calls */
static void desync_names_both_calls(void **s) {
    (void)s;
    rt_flight_fp none = {0};
    rt_flight_fp a = fp(14, RT_K_ALLREDUCE, RT_OP_AVG, RT_F32, 0, 5312, "bucket 2 of 2, step 3");
    rt_flight_fp b = fp(14, RT_K_ALLREDUCE, RT_OP_AVG, RT_F32, 0, 5311, "bucket 2 of 2, step 3");
    rt_flight_state_rec rec[3] = {waiting_in(a, 1, none), waiting_in(b, 1, none), waiting_in(a, 1, none)};
    char out[800];
    assert_int_equal(rt_flight_diagnose(rec, 3, out, sizeof out), 1);
    assert_string_equal(out, "desync at #14: ranks 0,2 called all_reduce #14 (f32 x 5312, 21.2 kB, avg, bucket 2 of "
                             "2, step 3) but rank 1 called all_reduce #14 (f32 x 5311, 21.2 kB, avg, bucket 2 of 2, "
                             "step 3)");
    /* the disagreement at a later pending operation of one rank (its older one agrees) */
    rt_flight_fp older = fp(13, RT_K_ALLREDUCE, RT_OP_AVG, RT_F32, 0, 16586, "bucket 1 of 2, step 3");
    rt_flight_state_rec r0 = waiting_in(older, 1, none);
    r0.pending[r0.npending++] = a;
    rt_flight_state_rec r1 = waiting_in(b, 1, none);
    rt_flight_state_rec rec2[2] = {r0, r1};
    assert_int_equal(rt_flight_diagnose(rec2, 2, out, sizeof out), 1);
    assert_non_null(strstr(out, "desync at #14: rank 0 called all_reduce #14 (f32 x 5312"));
    /* another operation, another root, another dtype, another reduce op: each a desync */
    rt_flight_fp variants[4] = {
        fp(14, RT_K_BCAST, -1, RT_F32, 0, 5312, ""), fp(14, RT_K_ALLREDUCE, RT_OP_AVG, RT_F32, 1, 5312, ""),
        fp(14, RT_K_ALLREDUCE, RT_OP_AVG, RT_F64, 0, 5312, ""), fp(14, RT_K_ALLREDUCE, RT_OP_SUM, RT_F32, 0, 5312, "")};
    for (int k = 0; k < 4; k++) {
        rt_flight_state_rec rec3[2] = {waiting_in(a, 1, none), waiting_in(variants[k], 1, none)};
        assert_int_equal(rt_flight_diagnose(rec3, 2, out, sizeof out), 1);
    }
    /* a tag is context only: the same call with other tags agrees */
    rt_flight_fp c = a;
    snprintf(c.tag, sizeof c.tag, "elsewhere");
    assert_false(rt_flight_fp_differ(&a, &c));
}

static void text_round_trip(void **s) {
    (void)s;
    rt_flight_state_rec st = {.present = true, .npending = 2, .wait_s = 2.5};
    st.pending[0] = fp(13, RT_K_ALLREDUCE, RT_OP_AVG, RT_F32, 0, 16586, "bucket 1 of 2, step 3");
    st.pending[1] = fp(14, RT_K_BCAST, -1, RT_I64, 1, 7, "");
    st.last_done = fp(12, RT_K_ALLREDUCE, RT_OP_SUM, RT_F64, 0, 3, "step 2");
    char buf[1024];
    rt_flight_state_format(&st, buf, sizeof buf);
    rt_flight_state_rec back;
    assert_true(rt_flight_state_parse(buf, &back));
    assert_true(back.present);
    assert_int_equal(back.npending, 2);
    assert_true(back.wait_s > 2.49 && back.wait_s < 2.51);
    for (int i = 0; i < 2; i++) {
        assert_false(rt_flight_fp_differ(&back.pending[i], &st.pending[i]));
        assert_string_equal(back.pending[i].tag, st.pending[i].tag);
    }
    assert_false(rt_flight_fp_differ(&back.last_done, &st.last_done));
    assert_string_equal(back.last_done.tag, "step 2");
    rt_flight_fp f = fp(7, RT_K_REDUCE, RT_OP_MAX, RT_I32, 2, 99, "a tag\nwith a newline");
    rt_flight_fp_format(&f, buf, sizeof buf);
    rt_flight_fp g;
    assert_true(rt_flight_fp_parse(buf, &g));
    assert_false(rt_flight_fp_differ(&f, &g));
    assert_string_equal(g.tag, "a tag with a newline");
    assert_false(rt_flight_state_parse("garbage", &back));
    assert_false(rt_flight_state_parse("1.0 9\n", &back)); /* more pending than kept */
}

/* a peer's page through /proc/<pid>/fd/<n>: what a reused pid can point at is refused
 * without blocking (a FIFO) and without a SIGBUS later (an empty file) */
static void cell_open_checks_the_file(void **s) {
    (void)s;
    char dir[] = "/tmp/rt_cellXXXXXX", path[128];
    assert_non_null(mkdtemp(dir));
    /* a FIFO nobody writes: a blocking open would hang here */
    snprintf(path, sizeof path, "%s/fifo", dir);
    assert_int_equal(mkfifo(path, 0600), 0);
    assert_int_equal(rt_flight_cell_open(path), -1);
    unlink(path);
    /* an empty regular file, and one of a page that is no memfd */
    snprintf(path, sizeof path, "%s/empty", dir);
    int fd = open(path, O_CREAT | O_RDWR | O_CLOEXEC, 0600);
    assert_true(fd >= 0);
    char proc[64];
    snprintf(proc, sizeof proc, "/proc/self/fd/%d", fd);
    assert_int_equal(rt_flight_cell_open(proc), -1);
    assert_int_equal(ftruncate(fd, RT_FLIGHT_CELL_BYTES), 0);
    assert_int_equal(rt_flight_cell_open(proc), -1);
    close(fd);
    unlink(path);
    rmdir(dir);
    /* memfds: another name, one too short, then a real cell */
    fd = memfd_create("ringtrain-flightx", MFD_CLOEXEC);
    assert_true(fd >= 0);
    assert_int_equal(ftruncate(fd, RT_FLIGHT_CELL_BYTES), 0);
    snprintf(proc, sizeof proc, "/proc/self/fd/%d", fd);
    assert_int_equal(rt_flight_cell_open(proc), -1);
    close(fd);
    fd = memfd_create(RT_FLIGHT_CELL_NAME, MFD_CLOEXEC);
    assert_true(fd >= 0);
    snprintf(proc, sizeof proc, "/proc/self/fd/%d", fd);
    assert_int_equal(rt_flight_cell_open(proc), -1); /* empty */
    assert_int_equal(ftruncate(fd, RT_FLIGHT_CELL_BYTES), 0);
    int g = rt_flight_cell_open(proc);
    assert_true(g >= 0);
    close(g);
    close(fd);
    assert_int_equal(rt_flight_cell_open("/proc/self/fd/987654"), -1);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(behind_names_the_rank),     cmocka_unit_test(nobody_behind),
        cmocka_unit_test(desync_names_both_calls),   cmocka_unit_test(text_round_trip),
        cmocka_unit_test(cell_open_checks_the_file),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
