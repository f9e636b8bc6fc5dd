/* The emulated NCCL of the test tree (tests/cuda_emu/nccl.cpp, docs/cuda-emulation.md):
 * the part of NCCL 2.28's API that ringtrain and its tests use, with the real header's
 * values and signatures (NCCL 2.28.9, /usr/local/cuda/include/nccl.h), so the project's
 * unchanged CUDA sources compile against it. Communicators work across processes on one
 * host; every operation runs on the stream it is given (the emulated runtime's stream
 * worker). Not NVIDIA's header: only what is declared here exists.
 *
 * Test-only additions (prefixed rt_emu_nccl_) are declared at the end. */
#ifndef NCCL_H_
#define NCCL_H_

#include <cuda_runtime.h>

#include <limits.h>
#include <stddef.h>

#define NCCL_MAJOR 2
#define NCCL_MINOR 28
#define NCCL_PATCH 9
#define NCCL_SUFFIX ""
#define NCCL_VERSION_CODE 22809
#define NCCL_VERSION(X, Y, Z) (((X) <= 2 && (Y) <= 8) ? (X) * 1000 + (Y) * 100 + (Z) : (X) * 10000 + (Y) * 100 + (Z))

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ncclComm *ncclComm_t;
#define NCCL_COMM_NULL NULL

#define NCCL_UNIQUE_ID_BYTES 128
typedef struct {
    char internal[NCCL_UNIQUE_ID_BYTES];
} ncclUniqueId;

typedef enum {
    ncclSuccess = 0,
    ncclUnhandledCudaError = 1,
    ncclSystemError = 2,
    ncclInternalError = 3,
    ncclInvalidArgument = 4,
    ncclInvalidUsage = 5,
    ncclRemoteError = 6,
    ncclInProgress = 7,
    ncclNumResults = 8
} ncclResult_t;

#define NCCL_CONFIG_UNDEF_INT INT_MIN
#define NCCL_CONFIG_UNDEF_PTR NULL
#define NCCL_SPLIT_NOCOLOR -1
#define NCCL_UNDEF_FLOAT -1.0f

/* ncclConfig_v22800: the same fields, in the same order, as NCCL 2.28 */
typedef struct ncclConfig_v22800 {
    /* attributes that users should never touch */
    size_t size;
    unsigned int magic;
    unsigned int version;
    /* attributes that users are able to customize */
    int blocking;
    int cgaClusterSize;
    int minCTAs;
    int maxCTAs;
    const char *netName;
    int splitShare;
    int trafficClass;
    const char *commName;
    int collnetEnable;
    int CTAPolicy;
    int shrinkShare;
    int nvlsCTAs;
    int nChannelsPerNetPeer;
    int nvlinkCentricSched;
} ncclConfig_t;

#define NCCL_CONFIG_INITIALIZER                                                                                        \
    {                                                                                                                  \
        sizeof(ncclConfig_t),                             /* size */                                                   \
            0xcafebeef,                                   /* magic */                                                  \
            NCCL_VERSION(NCCL_MAJOR, NCCL_MINOR, NCCL_PATCH), /* version */                                            \
            NCCL_CONFIG_UNDEF_INT,                        /* blocking */                                               \
            NCCL_CONFIG_UNDEF_INT,                        /* cgaClusterSize */                                         \
            NCCL_CONFIG_UNDEF_INT,                        /* minCTAs */                                                \
            NCCL_CONFIG_UNDEF_INT,                        /* maxCTAs */                                                \
            NCCL_CONFIG_UNDEF_PTR,                        /* netName */                                                \
            NCCL_CONFIG_UNDEF_INT,                        /* splitShare */                                             \
            NCCL_CONFIG_UNDEF_INT,                        /* trafficClass */                                           \
            NCCL_CONFIG_UNDEF_PTR,                        /* commName */                                               \
            NCCL_CONFIG_UNDEF_INT,                        /* collnetEnable */                                          \
            NCCL_CONFIG_UNDEF_INT,                        /* CTAPolicy */                                              \
            NCCL_CONFIG_UNDEF_INT,                        /* shrinkShare */                                            \
            NCCL_CONFIG_UNDEF_INT,                        /* nvlsCTAs */                                               \
            NCCL_CONFIG_UNDEF_INT,                        /* nChannelsPerNetPeer */                                    \
            NCCL_CONFIG_UNDEF_INT,                        /* nvlinkCentricSched */                                     \
    }

typedef enum {
    ncclSum = 0,
    ncclProd = 1,
    ncclMax = 2,
    ncclMin = 3,
    ncclAvg = 4,
    ncclNumOps = 5,
    ncclMaxRedOp = 0x7fffffff
} ncclRedOp_t;

typedef enum {
    ncclInt8 = 0,
    ncclChar = 0,
    ncclUint8 = 1,
    ncclInt32 = 2,
    ncclInt = 2,
    ncclUint32 = 3,
    ncclInt64 = 4,
    ncclUint64 = 5,
    ncclFloat16 = 6,
    ncclHalf = 6,
    ncclFloat32 = 7,
    ncclFloat = 7,
    ncclFloat64 = 8,
    ncclDouble = 8,
    ncclBfloat16 = 9,
    ncclFloat8e4m3 = 10,
    ncclFloat8e5m2 = 11,
    ncclNumTypes = 12
} ncclDataType_t;

ncclResult_t ncclGetVersion(int *version);
ncclResult_t ncclGetUniqueId(ncclUniqueId *uniqueId);
ncclResult_t ncclCommInitRankConfig(ncclComm_t *comm, int nranks, ncclUniqueId commId, int rank,
                                    ncclConfig_t *config);
ncclResult_t ncclCommInitRank(ncclComm_t *comm, int nranks, ncclUniqueId commId, int rank);
ncclResult_t ncclCommFinalize(ncclComm_t comm);
ncclResult_t ncclCommDestroy(ncclComm_t comm);
ncclResult_t ncclCommAbort(ncclComm_t comm);
const char *ncclGetErrorString(ncclResult_t result);
const char *ncclGetLastError(ncclComm_t comm);
ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t *asyncError);
ncclResult_t ncclCommCount(const ncclComm_t comm, int *count);
ncclResult_t ncclCommCuDevice(const ncclComm_t comm, int *device);
ncclResult_t ncclCommUserRank(const ncclComm_t comm, int *rank);

ncclResult_t ncclReduce(const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype, ncclRedOp_t op,
                        int root, ncclComm_t comm, cudaStream_t stream);
ncclResult_t ncclBcast(void *buff, size_t count, ncclDataType_t datatype, int root, ncclComm_t comm,
                       cudaStream_t stream);
ncclResult_t ncclBroadcast(const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype, int root,
                           ncclComm_t comm, cudaStream_t stream);
ncclResult_t ncclAllReduce(const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype,
                           ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream);
ncclResult_t ncclReduceScatter(const void *sendbuff, void *recvbuff, size_t recvcount, ncclDataType_t datatype,
                               ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream);
ncclResult_t ncclAllGather(const void *sendbuff, void *recvbuff, size_t sendcount, ncclDataType_t datatype,
                           ncclComm_t comm, cudaStream_t stream);
ncclResult_t ncclSend(const void *sendbuff, size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm,
                      cudaStream_t stream);
ncclResult_t ncclRecv(void *recvbuff, size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm,
                      cudaStream_t stream);
ncclResult_t ncclGroupStart(void);
ncclResult_t ncclGroupEnd(void);

/* ---- test-only (not NCCL) ---- */

/* The calling thread's ncclGroupStart nesting depth: 0 when every group was ended. */
int rt_emu_nccl_group_depth(void);

/* Number of communicators of this process that were created and not yet destroyed or
 * aborted (a test can tell that a caller leaked one). */
int rt_emu_nccl_live_comms(void);

#ifdef __cplusplus
}
#endif

#endif
