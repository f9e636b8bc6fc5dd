/* The emulated machine's topology (RINGTRAIN_EMU_TOPOLOGY, tests/cuda_emu/topology.cpp):
 * the peer-access calls answer from it with CUDA's errors (an invalid device, a device
 * with itself, an unsupported pair, enabling twice), and events time copies by the
 * model exactly (the emulated clock), across streams joined by an event wait. Runs as
 * 4 physical GPUs with CUDA_VISIBLE_DEVICES=3,0,1 (device 0 is physical 3), set in main
 * before the runtime starts. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <cmocka.h>

#include <cuda_runtime.h>

#define assert_cuda(expr) assert_int_equal((expr), cudaSuccess)

/* physical: 0-1 NVLink, 3>0 PCIe one way at 10 GB/s; visible: 0 = phys 3, 1 = phys 0, 2 = phys 1 */
static const char *const k_topology = "0-1=nvlink,100,1;3>0=pcie,10,5;host=20,4;pageable=5,8";

static void test_peer_answers(void **state) {
    (void)state;
    int v = -1;
    assert_cuda(cudaDeviceCanAccessPeer(&v, 1, 2)); /* physical 0 - 1: NVLink */
    assert_int_equal(v, 1);
    assert_cuda(cudaDeviceCanAccessPeer(&v, 0, 1)); /* physical 3 -> 0: PCIe */
    assert_int_equal(v, 1);
    assert_cuda(cudaDeviceCanAccessPeer(&v, 1, 0)); /* physical 0 -> 3: not listed */
    assert_int_equal(v, 0);
    assert_cuda(cudaDeviceCanAccessPeer(&v, 1, 1)); /* a device with itself: 0, no error */
    assert_int_equal(v, 0);
    assert_cuda(cudaDeviceGetP2PAttribute(&v, cudaDevP2PAttrNativeAtomicSupported, 1, 2));
    assert_int_equal(v, 1);
    assert_cuda(cudaDeviceGetP2PAttribute(&v, cudaDevP2PAttrNativeAtomicSupported, 0, 1));
    assert_int_equal(v, 0);
    assert_cuda(cudaDeviceGetP2PAttribute(&v, cudaDevP2PAttrPerformanceRank, 0, 1));
    assert_int_equal(v, 1);
    /* CUDA's refusals */
    assert_int_equal(cudaDeviceCanAccessPeer(&v, 0, 3), cudaErrorInvalidDevice);
    assert_int_equal(cudaDeviceCanAccessPeer(&v, -1, 0), cudaErrorInvalidDevice);
    assert_int_equal(cudaDeviceGetP2PAttribute(&v, cudaDevP2PAttrAccessSupported, 1, 1), cudaErrorInvalidDevice);
    assert_int_equal(cudaDeviceGetP2PAttribute(&v, cudaDevP2PAttrAccessSupported, 0, 3), cudaErrorInvalidDevice);
    assert_int_equal(cudaDeviceGetP2PAttribute(NULL, cudaDevP2PAttrAccessSupported, 0, 1), cudaErrorInvalidValue);
    assert_cuda(cudaSetDevice(1));
    assert_int_equal(cudaDeviceEnablePeerAccess(0, 0), cudaErrorPeerAccessUnsupported);
    assert_int_equal(cudaDeviceEnablePeerAccess(1, 0), cudaErrorInvalidDevice);
    assert_int_equal(cudaDeviceEnablePeerAccess(3, 0), cudaErrorInvalidDevice);
    assert_int_equal(cudaDeviceEnablePeerAccess(2, 1), cudaErrorInvalidValue);
    assert_int_equal(cudaDeviceDisablePeerAccess(2), cudaErrorPeerAccessNotEnabled);
    assert_cuda(cudaDeviceEnablePeerAccess(2, 0));
    assert_int_equal(cudaDeviceEnablePeerAccess(2, 0), cudaErrorPeerAccessAlreadyEnabled);
    assert_cuda(cudaDeviceDisablePeerAccess(2));
    (void)cudaGetLastError();
}

/* ms between events around one copy of n bytes from device sd to device dd on stream s (of sd) */
static float timed_peer_copy(cudaStream_t s, void *dst, int dd, const void *src, int sd, size_t n) {
    cudaEvent_t a, b;
    float ms = -1;
    assert_cuda(cudaSetDevice(sd));
    assert_cuda(cudaEventCreate(&a));
    assert_cuda(cudaEventCreate(&b));
    assert_cuda(cudaEventRecord(a, s));
    assert_cuda(cudaMemcpyPeerAsync(dst, dd, src, sd, n, s));
    assert_cuda(cudaEventRecord(b, s));
    assert_cuda(cudaEventSynchronize(b));
    assert_cuda(cudaEventElapsedTime(&ms, a, b));
    assert_cuda(cudaEventDestroy(a));
    assert_cuda(cudaEventDestroy(b));
    return ms;
}

static void test_modelled_times(void **state) {
    (void)state;
    const size_t n = 1000000;
    void *buf[3];
    cudaStream_t s[3];
    for (int d = 0; d < 3; d++) {
        assert_cuda(cudaSetDevice(d));
        assert_cuda(cudaMalloc(&buf[d], n));
        assert_cuda(cudaStreamCreateWithFlags(&s[d], cudaStreamNonBlocking));
    }
    /* a pointer on another device than the one named: refused */
    assert_int_equal(cudaMemcpyPeerAsync(buf[2], 1, buf[1], 1, n, s[1]), cudaErrorInvalidValue);
    assert_int_equal(cudaMemcpyPeerAsync(buf[2], 7, buf[1], 1, n, s[1]), cudaErrorInvalidDevice);
    (void)cudaGetLastError();
    /* NVLink without peer access: staged through host memory, 2 x (4 us + 1e6 B / 20 GB/s) */
    assert_float_equal(timed_peer_copy(s[1], buf[2], 2, buf[1], 1, n), 0.108, 1e-5);
    assert_cuda(cudaSetDevice(1));
    assert_cuda(cudaDeviceEnablePeerAccess(2, 0));
    /* now over the link: 1 us + 1e6 B / 100 GB/s; the other direction too (either device enabled) */
    assert_float_equal(timed_peer_copy(s[1], buf[2], 2, buf[1], 1, n), 0.011, 1e-5);
    assert_float_equal(timed_peer_copy(s[2], buf[1], 1, buf[2], 2, n), 0.011, 1e-5);
    /* physical 3 -> 0 one way over PCIe once enabled: 5 us + 1e6 B / 10 GB/s */
    assert_cuda(cudaSetDevice(0));
    assert_cuda(cudaDeviceEnablePeerAccess(1, 0));
    assert_float_equal(timed_peer_copy(s[0], buf[1], 1, buf[0], 0, n), 0.105, 1e-5);
    /* an event wait carries the clock across streams: stream 2 waits for stream 1's copy */
    cudaEvent_t start, mid, end;
    float ms = -1;
    assert_cuda(cudaSetDevice(1));
    assert_cuda(cudaEventCreate(&start));
    assert_cuda(cudaEventCreate(&mid));
    assert_cuda(cudaEventRecord(start, s[1]));
    assert_cuda(cudaMemcpyPeerAsync(buf[2], 2, buf[1], 1, n, s[1]));
    assert_cuda(cudaEventRecord(mid, s[1]));
    assert_cuda(cudaSetDevice(2));
    assert_cuda(cudaEventCreate(&end));
    assert_cuda(cudaStreamWaitEvent(s[2], mid, 0));
    assert_cuda(cudaMemcpyPeerAsync(buf[1], 1, buf[2], 2, n, s[2]));
    assert_cuda(cudaEventRecord(end, s[2]));
    assert_cuda(cudaEventSynchronize(end));
    assert_cuda(cudaEventElapsedTime(&ms, start, end));
    assert_float_equal(ms, 0.022, 1e-5);
}

int main(void) {
    setenv("RINGTRAIN_EMU_GPUS", "4", 1);
    setenv("CUDA_VISIBLE_DEVICES", "3,0,1", 1);
    setenv("RINGTRAIN_EMU_TOPOLOGY", k_topology, 1);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_peer_answers),
        cmocka_unit_test(test_modelled_times),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
