/* Failures inside the nccl transport on emulated GPUs (label emu; issue 19, defect 6).
 *
 * A scatter over nccl is a group (ncclGroupStart, one ncclSend per peer at the root,
 * ncclGroupEnd). With the emulated NCCL's fault injection (RINGTRAIN_EMU_NCCL_FAIL) the
 * root's first ncclSend fails inside that group. Then:
 *  - the call returns an error naming the operation, and the group is ended: NCCL's group
 *    state is per thread, and a group left open turns this thread's every later NCCL call
 *    into a member of a dead group (rt_emu_nccl_group_depth() must be 0 again);
 *  - the communicator is aborted and the process group broken: the next collective fails
 *    at once with "broken by an earlier error", without waiting for any peer;
 *  - the peer, waiting in its receive, gets an error when the root's process is gone
 *    (the launcher's job in a real run), not a hang: it exits within the harness's limit.
 * Also: a rank killed while an all-reduce runs on the stream (RINGTRAIN_EMU_NCCL_KILL)
 * gives its peer an error naming the peer as gone, never a hang; and a CUDA call that
 * fails after the operation was handed to NCCL (rt_emu_fail_call) aborts the
 * communicator (before, the error was returned and the communicator kept going). */
#include "../test_util.h"
#include "dist/dist.h"
#include "emu_internal.h"
#include "mp.h"

#include <cuda_runtime.h>
#include <nccl.h>
#include <string.h>

static int g_gpus;

static int pg_on_own_gpu(int rank, int world, int port, rt_pg **pg, rt_device *dev) {
    char method[MP_METHOD_LEN];
    rt_pg_options o;
    mp_pg_options(&o, method, rank, world, port, RT_TRANSPORT_NCCL, 20);
    *dev = rt_device_cuda(rank);
    MP_OK(rt_device_set_current(*dev));
    o.device = *dev;
    MP_OK(rt_pg_init(&o, pg));
    MP_OK(rt_pg_set_buffer_device(*pg, *dev));
    return 0;
}

static int group_failure(int rank, int world, int port, void *arg) {
    (void)arg;
    if (rank == 0) setenv("RINGTRAIN_EMU_NCCL_FAIL", "ncclSend:1", 1); /* before the first NCCL call */
    rt_pg *pg;
    rt_device dev;
    if (pg_on_own_gpu(rank, world, port, &pg, &dev)) return 1;
    float *send = NULL, *recv = NULL;
    MP_OK(rt_malloc(dev, 2 * 16 * sizeof(float), (void **)&send));
    MP_OK(rt_malloc(dev, 16 * sizeof(float), (void **)&recv));
    MP_OK(rt_memset(dev, send, 0, 2 * 16 * sizeof(float), NULL));
    rt_status s = rt_scatter(pg, send, recv, 16, RT_F32, 0);
    MP_CHECK(s != RT_OK, "rank %d: the scatter succeeded", rank);
    if (rank == 0) {
        MP_CHECK(strstr(rt_error_message(), "scatter") != NULL, "the error does not name the operation: %s",
                 rt_error_message());
        MP_CHECK(rt_emu_nccl_group_depth() == 0, "the NCCL group is still open after the failure (depth %d)",
                 rt_emu_nccl_group_depth());
        s = rt_all_reduce(pg, recv, 16, RT_F32, RT_OP_SUM);
        MP_CHECK(s != RT_OK && strstr(rt_error_message(), "broken"), "after the failure: %s (%s)",
                 rt_status_name(s), rt_error_message());
        _exit(0); /* the launcher would now stop this rank: its peer must notice */
    }
    return 0; /* rank 1: an error (the root is gone), within the limit */
}

static int killed_in_allreduce(int rank, int world, int port, void *arg) {
    (void)arg;
    if (rank == 1) setenv("RINGTRAIN_EMU_NCCL_KILL", "ncclAllReduce:2", 1);
    rt_pg *pg;
    rt_device dev;
    if (pg_on_own_gpu(rank, world, port, &pg, &dev)) return 1;
    float *d = NULL;
    MP_OK(rt_malloc(dev, 1024 * sizeof(float), (void **)&d));
    MP_OK(rt_memset(dev, d, 0, 1024 * sizeof(float), NULL));
    MP_OK(rt_all_reduce(pg, d, 1024, RT_F32, RT_OP_SUM));
    rt_request *q = NULL;
    rt_status s = rt_iall_reduce(pg, d, 1024, RT_F32, RT_OP_SUM, &q); /* rank 1 dies in it */
    if (s == RT_OK) { /* (the enqueue itself may already see the dead peer: an error too) */
        /* wait until the operation has ended on the device (cut short by the dead peer),
         * so that rt_wait sees a completed operation: completion alone is no success */
        MP_CHECK(cudaDeviceSynchronize() == cudaSuccess, "cudaDeviceSynchronize");
        s = rt_wait(q);
    }
    MP_CHECK(s != RT_OK, "rank %d: the all-reduce with a dead peer succeeded", rank);
    MP_CHECK(s == RT_ERR_PEER, "rank %d: %s: %s (expected a peer error)", rank, rt_status_name(s), rt_error_message());
    return 0;
}

/* A CUDA call that fails after the operation was handed to NCCL (the completion event's
 * record): the peers are in the collective already, so the communicator must be aborted
 * and the group broken, not left for the next call to run as if nothing happened. */
static int cuda_failure_after_enqueue(int rank, int world, int port, void *arg) {
    (void)arg;
    rt_pg *pg;
    rt_device dev;
    if (pg_on_own_gpu(rank, world, port, &pg, &dev)) return 1;
    float *d = NULL;
    MP_OK(rt_malloc(dev, 256 * sizeof(float), (void **)&d));
    MP_OK(rt_memset(dev, d, 0, 256 * sizeof(float), NULL));
    MP_OK(rt_all_reduce(pg, d, 256, RT_F32, RT_OP_SUM));
    if (rank == 0) {
        /* no stream set on the group: the operation's only event record is its completion */
        rt_emu_fail_call("cudaEventRecord", 1, cudaErrorLaunchFailure);
        rt_status s = rt_all_reduce(pg, d, 256, RT_F32, RT_OP_SUM);
        MP_CHECK(s != RT_OK, "the all-reduce whose completion record failed succeeded");
        s = rt_all_reduce(pg, d, 256, RT_F32, RT_OP_SUM);
        MP_CHECK(s != RT_OK && strstr(rt_error_message(), "broken"),
                 "the next all-reduce after a CUDA failure in one: %s (%s): the communicator was not aborted",
                 rt_status_name(s), rt_error_message());
        _exit(0);
    }
    (void)rt_all_reduce(pg, d, 256, RT_F32, RT_OP_SUM); /* rank 0's part was enqueued */
    rt_status s = rt_all_reduce(pg, d, 256, RT_F32, RT_OP_SUM);  /* rank 0 is gone */
    MP_CHECK(s != RT_OK, "rank 1: an all-reduce with a dead peer succeeded");
    return 0;
}

static void test_cuda_failure_after_enqueue(void **st) {
    (void)st;
    int codes[2];
    mp_run(2, cuda_failure_after_enqueue, NULL, 120, codes);
    assert_int_equal(codes[0], 0);
    assert_int_equal(codes[1], 0);
}

static void test_group_failure(void **st) {
    (void)st;
    int codes[2];
    mp_run(2, group_failure, NULL, 120, codes);
    assert_int_equal(codes[0], 0);
    assert_int_equal(codes[1], 0);
}

static void test_killed_in_allreduce(void **st) {
    (void)st;
    int codes[2];
    mp_run(2, killed_in_allreduce, NULL, 120, codes);
    assert_int_equal(codes[0], 0);
    assert_int_equal(codes[1], 128 + 9); /* it killed itself inside the operation */
}

int main(void) {
    int rc = 0;
    g_gpus = rt_test_probe_gpus(&rc);
    if (rc != 0) return rc;
    if (g_gpus < 2) {
        printf("FAIL: needs 2 emulated GPUs (RINGTRAIN_EMU_GPUS)\n");
        return 1;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_group_failure),
        cmocka_unit_test(test_killed_in_allreduce),
        cmocka_unit_test(test_cuda_failure_after_enqueue),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
