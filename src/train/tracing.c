/* log.trace (docs/debugging.md): the timeline recorder on, to RUN_DIR/trace-rank<r>.jsonl,
 * with this rank's clock offset to rank 0's measured by ping-pong, so that `ringtrain
 * trace` can merge the ranks' files on one clock. */
#include "train/internal/run.h"

#include "core/file.h"
#include "core/log.h"
#include "core/timer.h"
#include "core/trace.h"

enum { TRACE_SPANS = 1 << 16, CLOCK_ROUNDS = 32 };

/* One 8-byte value to or from group rank `peer`: host memory, or through the device
 * scratch buffer when the transport takes device buffers only (nccl). */
static rt_status clock_xfer(run *r, bool send, int64_t *v, int peer, bool via_dev) {
    if (!via_dev) return send ? rt_send(r->pg, v, 1, RT_I64, peer) : rt_recv(r->pg, v, 1, RT_I64, peer);
    if (send) RT_CHECK(rt_memcpy(r->bufs.scratch_dev, r->dev, v, rt_device_cpu(), sizeof *v, NULL));
    RT_CHECK(send ? rt_send(r->pg, r->bufs.scratch_dev, 1, RT_I64, peer)
                  : rt_recv(r->pg, r->bufs.scratch_dev, 1, RT_I64, peer));
    if (!send) RT_CHECK(rt_memcpy(v, rt_device_cpu(), r->bufs.scratch_dev, r->dev, sizeof *v, NULL));
    return RT_OK;
}

/* This rank's clock offset to rank 0's (t_rank0 = t + *off), by ping-pong with rank 0:
 * CLOCK_ROUNDS rounds, each a send of this rank's time and rank 0's reply with its own;
 * the round with the smallest round trip counts: rank 0 read its clock between this
 * rank's send and receive, so the offset is t0 - (t_send + t_recv) / 2 within half that
 * round trip (*err). Rank 0 answers the others one after another. */
static rt_status clock_offset(run *r, int64_t *off, int64_t *err, int64_t *rtt) {
    *off = *err = *rtt = 0;
    bool cuda = rt_device_is_cuda(r->dev);
    bool via_dev = cuda && rt_pg_transport(r->pg) == RT_TRANSPORT_NCCL;
    if (cuda && !via_dev) RT_CHECK(rt_pg_set_buffer_device(r->pg, rt_device_cpu())); /* host buffers below */
    rt_status st = RT_OK;
    if (is_root(r)) {
        for (int peer = 1; peer < r->who.world_size && st == RT_OK; peer++)
            for (int k = 0; k < CLOCK_ROUNDS && st == RT_OK; k++) {
                int64_t v = 0;
                st = clock_xfer(r, false, &v, peer, via_dev);
                v = (int64_t)rt_now_ns();
                if (st == RT_OK) st = clock_xfer(r, true, &v, peer, via_dev);
            }
    } else {
        int64_t best = INT64_MAX;
        for (int k = 0; k < CLOCK_ROUNDS && st == RT_OK; k++) {
            int64_t ts = (int64_t)rt_now_ns(), v = ts;
            st = clock_xfer(r, true, &v, 0, via_dev);
            if (st == RT_OK) st = clock_xfer(r, false, &v, 0, via_dev);
            int64_t tr = (int64_t)rt_now_ns();
            if (st == RT_OK && tr - ts < best) {
                best = tr - ts;
                *off = v - (ts + (tr - ts) / 2);
                *rtt = best;
                *err = (best + 1) / 2;
            }
        }
    }
    if (cuda && !via_dev) {
        rt_status s2 = rt_pg_set_buffer_device(r->pg, r->dev);
        if (st == RT_OK) st = s2;
    }
    if (st != RT_OK) rt_error_trace(__FILE__, __LINE__, "log.trace: measuring the clock offset to rank 0");
    return st;
}

/* log.trace: the recorder on, to RUN_DIR/trace-rank<r>.jsonl, with this rank's clock
 * offset to rank 0's in its header (written now, so even a run that fails early leaves
 * a file that says how its clock relates). */
rt_status rt_run_setup_trace(run *r) {
    if (!r->cfg->log.trace) return RT_OK;
    char path[RT_CONFIG_PATH_MAX + 32];
    RT_CHECK(rt_file_mkdirs(r->run_dir, "run directory"));
    snprintf(path, sizeof path, "%s/trace-rank%d.jsonl", r->run_dir, r->who.rank);
    RT_CHECK(rt_trace_start(path, TRACE_SPANS));
    int64_t off = 0, err = 0, rtt = 0;
    uint64_t t = rt_now_ns();
    if (r->pg) RT_CHECK(clock_offset(r, &off, &err, &rtt));
    rt_trace_span(RT_TRACK_MAIN, "clock alignment", t, rt_now_ns());
    rt_trace_set_header(r->who.rank, r->who.world_size, off, err, rtt);
    if (r->pg)
        RT_LOG_DEBUG("trace: clock offset to rank 0 %lld ns (error bound %lld ns)", (long long)off, (long long)err);
    return rt_trace_flush();
}

rt_status rt_run_traced_barrier(run *r) {
    if (!r->pg) return RT_OK;
    uint64_t t = rt_trace_now();
    RT_CHECK(rt_barrier(r->pg));
    rt_trace_end(RT_TRACK_MAIN, "barrier", t);
    return RT_OK;
}
