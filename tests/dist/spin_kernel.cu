// A long-running producer for test_dist_stream_gpu: every thread spins `cycles` clock
// ticks, then writes its elements p[i] = scale * (i % 17). Enqueued on the model
// stream, it keeps the gradient unwritten for a long time after the host has moved on.
#include <cuda_runtime.h>
#include <stddef.h>

__global__ static void spin_fill(float *p, size_t n, float scale, long long cycles) {
    long long t0 = clock64();
    while (clock64() - t0 < cycles) {
    }
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        p[i] = scale * (float)(i % 17);
}

extern "C" int test_spin_fill(float *p, size_t n, float scale, long long cycles, void *stream) {
    spin_fill<<<128, 256, 0, (cudaStream_t)stream>>>(p, n, scale, cycles);
    return (int)cudaGetLastError();
}
