/* What the ranks exchange besides the gradients: a few host values (the loss, evaluation
 * sums, checksums, the stop flag), rank 0's bytes (its checkpoint choice), rank 0's state
 * (parameters at the start, batch-norm buffers before evaluation and checkpoints), and
 * the check that every rank holds the same parameters. Each is a no-op with one rank. */
#include "train/internal/run.h"

#include <stdlib.h>

/* All-reduce of a few host values (the loss, evaluation sums, checksums); a no-op with
 * one rank. The group's buffers live on the training device, so on a GPU the values go
 * through a small device buffer. */
rt_status rt_run_all_reduce_host(run *r, void *v, size_t n, rt_dtype t, rt_reduce_op op) {
    if (!r->pg) return RT_OK;
    if (!rt_device_is_cuda(r->dev)) return rt_all_reduce(r->pg, v, n, t, op);
    size_t bytes = n * rt_dtype_size(t);
    RT_REQUIRE(bytes <= RUN_SCRATCH_BYTES, RT_ERR_INTERNAL, "all_reduce_host: %zu bytes", bytes);
    RT_CHECK(rt_memcpy(r->bufs.scratch_dev, r->dev, v, rt_device_cpu(), bytes, r->ctx->stream));
    RT_CHECK(rt_all_reduce(r->pg, r->bufs.scratch_dev, n, t, op)); /* ordered after the copy (the group's stream) */
    RT_CHECK(rt_memcpy(v, rt_device_cpu(), r->bufs.scratch_dev, r->dev, bytes, r->ctx->stream));
    return rt_model_ctx_sync(r->ctx);
}

/* Every rank's outcome `st` of a step some ranks take alone (rank 0's files, one rank's
 * load): the job goes on only if every rank succeeded; otherwise each fails, the one that
 * could not with its own error, the others naming the first rank that could not `what`.
 * Without it, a rank that failed alone leaves the others in their next collective until
 * dist.timeout_s. */
rt_status rt_run_agree(run *r, rt_status st, const char *what) {
    if (!r->pg) return st;
    rt_error_record err;
    if (st != RT_OK) rt_error_save(&err);
    int64_t first_bad = st == RT_OK ? r->who.world_size : r->who.rank;
    RT_CHECK(rt_run_all_reduce_host(r, &first_bad, 1, RT_I64, RT_OP_MIN));
    if (st != RT_OK) return rt_error_restore(&err);
    RT_REQUIRE(first_bad >= r->who.world_size, RT_ERR_IO, "rank %lld could not %s (its error says why)",
               (long long)first_bad, what);
    return RT_OK;
}

rt_status rt_run_all_reduce_f64(run *r, double *v, size_t n, rt_reduce_op op) {
    return rt_run_all_reduce_host(r, v, n, RT_F64, op);
}

/* Rank 0's bytes to every rank (the group's buffers live on the training device). */
rt_status rt_run_broadcast_bytes(run *r, void *p, size_t bytes) {
    if (!r->pg) return RT_OK;
    RT_REQUIRE(bytes % sizeof(int32_t) == 0, RT_ERR_INTERNAL, "broadcast_bytes: %zu bytes", bytes);
    if (!rt_device_is_cuda(r->dev)) return rt_broadcast(r->pg, p, bytes / sizeof(int32_t), RT_I32, 0);
    void *buf = NULL;
    RT_CHECK(rt_malloc(r->dev, bytes, &buf));
    rt_status st = rt_memcpy(buf, r->dev, p, rt_device_cpu(), bytes, r->ctx->stream);
    if (st == RT_OK) st = rt_model_ctx_sync(r->ctx);
    if (st == RT_OK) st = rt_broadcast(r->pg, buf, bytes / sizeof(int32_t), RT_I32, 0);
    if (st == RT_OK) st = rt_memcpy(p, rt_device_cpu(), buf, r->dev, bytes, r->ctx->stream);
    if (st == RT_OK) st = rt_model_ctx_sync(r->ctx);
    rt_free(r->dev, buf);
    return st;
}

/* FNV-1a over the parameters, and the buffers with `buffers` (host copies on a GPU).
 * Batch-norm buffers differ between ranks during training (each rank's own batch
 * statistics, as in DDP): they are compared only after rank 0's were broadcast. */
static rt_status param_checksum(run *r, bool buffers, uint64_t *out) {
    uint64_t h = 1469598103934665603ull;
    rt_arena *arenas[2] = {rt_model_params(r->model), rt_model_buffers(r->model)};
    for (int a = 0; a < (buffers ? 2 : 1); a++) {
        size_t n = arenas[a]->size;
        const unsigned char *p = arenas[a]->base;
        unsigned char *host = NULL;
        if (rt_device_is_cuda(r->dev)) {
            host = malloc(n);
            RT_CHECK_ALLOC(host, n);
            RT_CHECK(rt_model_ctx_sync(r->ctx));
            rt_status s = rt_memcpy(host, rt_device_cpu(), p, r->dev, n, NULL);
            if (s != RT_OK) {
                free(host);
                return s;
            }
            p = host;
        }
        for (size_t i = 0; i < n; i++) h = (h ^ p[i]) * 1099511628211ull;
        free(host);
    }
    *out = h;
    return RT_OK;
}

/* Every rank holds identical parameters (and buffers): min and max of the checksum agree. */
rt_status rt_run_check_in_sync(run *r, bool buffers, const char *when) {
    if (!r->pg) return RT_OK;
    uint64_t h = 0;
    RT_CHECK(param_checksum(r, buffers, &h));
    int64_t lo = (int64_t)(h >> 1), hi = lo;
    RT_CHECK(rt_run_all_reduce_host(r, &lo, 1, RT_I64, RT_OP_MIN));
    RT_CHECK(rt_run_all_reduce_host(r, &hi, 1, RT_I64, RT_OP_MAX));
    RT_REQUIRE(lo == hi, RT_ERR_INTERNAL,
               "%s: the ranks' parameters differ (checksums from %llx to %llx; this rank %llx): a rank diverged", when,
               (unsigned long long)lo, (unsigned long long)hi, (unsigned long long)(h >> 1));
    return RT_OK;
}

/* Rank 0's buffers (batch-norm running statistics, the only state the ranks' steps
 * leave different) and, with `params`, its parameters (at the start; afterwards they are
 * identical by construction and check_in_sync verifies it) to every rank. */
rt_status rt_run_broadcast_state(run *r, bool params) {
    if (!r->pg) return RT_OK;
    RT_CHECK(rt_model_ctx_sync(r->ctx));
    rt_arena *p = rt_model_params(r->model), *b = rt_model_buffers(r->model);
    if (params) RT_CHECK(rt_broadcast(r->pg, p->base, p->size / sizeof(float), RT_F32, 0));
    if (b->size) RT_CHECK(rt_broadcast(r->pg, b->base, b->size / sizeof(float), RT_F32, 0));
    return RT_OK;
}
