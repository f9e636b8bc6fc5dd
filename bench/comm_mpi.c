/* Reference for bench/comm.sh: Open MPI's MPI_Allreduce (f32, SUM) at the sizes and
 * iteration counts `ringtrain bench comm` uses, timed the same way (barrier, mean of
 * the timed iterations, slowest rank), printed as JSON rows by rank 0.
 *
 *   mpicc -O2 -o comm_mpi bench/comm_mpi.c
 *   mpirun --allow-run-as-root --oversubscribe -np 2 ./comm_mpi MIN_BYTES MAX_BYTES
 */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    int rank, n;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &n);
    size_t min = argc > 1 ? strtoull(argv[1], NULL, 10) : 8, max = argc > 2 ? strtoull(argv[2], NULL, 10) : 64u << 20;
    float *a = malloc(max + 64);
    if (!a) MPI_Abort(MPI_COMM_WORLD, 1);
    memset(a, 0, max + 64);
    if (rank == 0) printf("[\n");
    int first = 1;
    for (size_t size = min; size <= max; size *= 2) {
        int count = (int)(size / sizeof(float));
        double it = (double)(64u << 20) / (double)size;
        int iters = it > 200 ? 200 : it < 5 ? 5 : (int)it;
        for (int i = 0; i < count; i++) a[i] = (float)((rank + 1) * (i % 7 + 1));
        for (int w = 0; w < 2; w++) MPI_Allreduce(MPI_IN_PLACE, a, count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
        MPI_Barrier(MPI_COMM_WORLD);
        double t0 = MPI_Wtime();
        for (int i = 0; i < iters; i++) MPI_Allreduce(MPI_IN_PLACE, a, count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
        double us = (MPI_Wtime() - t0) * 1e6 / iters, worst;
        MPI_Allreduce(&us, &worst, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
        for (int i = 0; i < count; i++) a[i] = (float)((rank + 1) * (i % 7 + 1));
        MPI_Allreduce(MPI_IN_PLACE, a, count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
        long long wrong = 0, total;
        float tri = (float)(n * (n + 1) / 2);
        for (int i = 0; i < count; i++) wrong += a[i] != (float)(i % 7 + 1) * tri;
        MPI_Allreduce(&wrong, &total, 1, MPI_LONG_LONG, MPI_SUM, MPI_COMM_WORLD);
        double algbw = (double)count * sizeof(float) / (worst * 1e-6) / 1e9;
        if (rank == 0) {
            printf("%s  {\"size\": %zu, \"count\": %d, \"time_us\": %.3f, \"algbw_GBps\": %.4f, \"busbw_GBps\": %.4f, "
                   "\"wrong\": %lld}",
                   first ? "" : ",\n", (size_t)count * sizeof(float), count, worst, algbw, algbw * 2.0 * (n - 1) / n,
                   total);
            first = 0;
        }
    }
    if (rank == 0) printf("\n]\n");
    free(a);
    MPI_Finalize();
    return 0;
}
