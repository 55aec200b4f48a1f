// nccl.h - the emulated GPU's NCCL: collectives between processes on one machine.
//
// A drop-in for the part of NVIDIA's nccl.h that the course uses, with the
// same names, types and numbers (error codes, data types, reduction ops,
// the version formula), so the course's code compiles unchanged with
// CUDA=emu and means the same thing as on real GPUs. Plain C, usable from
// C++.
//
// Each rank is its own process with its own emulated GPU; the ranks meet in
// a POSIX shared-memory segment named by the ncclUniqueId. How that works,
// and what real NCCL does differently, is explained at the top of
// emu/src/nccl_comm.c.
#ifndef EMU_NCCL_H
#define EMU_NCCL_H

#include <limits.h>
#include <stddef.h>

#include "cuda_runtime_api.h"
#include "cuda_fp16.h" // as NVIDIA's nccl.h, which programs rely on for half and __nv_bfloat16
#include "cuda_bf16.h"

// Code that wants to know whether it talks to the emulator can test this.
#define COURSE_EMU_NCCL 1

// The version the emulator reports: the newest NCCL whose host API it
// implements (ncclAvg came in 2.10, ncclRedOpCreatePreMulSum in 2.11,
// non-blocking communicators in 2.14, ncclCommSplit in 2.18). Programs that
// look at the version to choose what to call - NVIDIA's nccl-tests does -
// then stay away from what came later and is not emulated (ncclMemAlloc and
// buffer registration in 2.19, the device API in 2.28).
#define NCCL_MAJOR 2
#define NCCL_MINOR 18
#define NCCL_PATCH 3
#define NCCL_SUFFIX ""

// NCCL's encoding of a version as one integer: before 2.9 it was
// X*1000 + Y*100 + Z, since then X*10000 + Y*100 + Z (so 2.28.3 is 22803).
#define NCCL_VERSION(X, Y, Z) \
    (((X) <= 2 && (Y) <= 8) ? (X) * 1000 + (Y) * 100 + (Z) : (X) * 10000 + (Y) * 100 + (Z))
#define NCCL_VERSION_CODE NCCL_VERSION(NCCL_MAJOR, NCCL_MINOR, NCCL_PATCH)

#ifdef __cplusplus
extern "C" {
#endif

// A communicator: one rank's view of a group of ranks. Opaque.
typedef struct ncclComm *ncclComm_t;
#define NCCL_COMM_NULL NULL

// What rank 0 makes and hands to every other rank out of band (a store, a
// pipe, a file). Here it carries the name of the shared-memory segment.
#define NCCL_UNIQUE_ID_BYTES 128
typedef struct {
    char internal[NCCL_UNIQUE_ID_BYTES];
} ncclUniqueId;

// Results, with NVIDIA's numbers.
typedef enum {
    ncclSuccess = 0,
    ncclUnhandledCudaError = 1,
    ncclSystemError = 2,
    ncclInternalError = 3,
    ncclInvalidArgument = 4,
    ncclInvalidUsage = 5,
    ncclRemoteError = 6,   // another rank failed, aborted or exited
    ncclInProgress = 7,    // a non-blocking communicator is still working on the call
    ncclNumResults = 8
} ncclResult_t;

// Element types, with NVIDIA's numbers. The two fp8 types exist so that
// code naming them compiles; the emulator rejects them (ncclInvalidArgument).
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

// Reductions, with NVIDIA's numbers. ncclAvg is the sum divided by the
// number of ranks (integer division for integer types).
typedef enum {
    ncclSum = 0,
    ncclProd = 1,
    ncclMax = 2,
    ncclMin = 3,
    ncclAvg = 4,
    ncclNumOps = 5,
    ncclMaxRedOp = 0x7fffffff   // keeps the enum as wide as an int, as NVIDIA's is
} ncclRedOp_t;

// Where the scalar of ncclRedOpCreatePreMulSum lives.
typedef enum {
    ncclScalarDevice = 0,        // in device memory, read when the collective runs
    ncclScalarHostImmediate = 1  // in host memory, read at the call
} ncclScalarResidence_t;

// Options for ncclCommInitRankConfig. Start from NCCL_CONFIG_INITIALIZER
// and change what you need; the emulator honours `blocking` (0: every call
// returns at once, possibly ncclInProgress) and ignores the tuning fields.
#define NCCL_CONFIG_UNDEF_INT INT_MIN
#define NCCL_CONFIG_UNDEF_PTR NULL
#define NCCL_CONFIG_MAGIC 0xcafebeef

typedef struct ncclConfig_v22800 {
    size_t size;            // sizeof(ncclConfig_t): which version of the struct
    unsigned int magic;     // NCCL_CONFIG_MAGIC: proves it was initialised
    unsigned int version;   // NCCL_VERSION_CODE of the header it was compiled with
    int blocking;           // 1 (default) or 0
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

// Positional, so that it compiles as C and as C++ before C++20.
#define NCCL_CONFIG_INITIALIZER                                                        \
    {                                                                                  \
        sizeof(ncclConfig_t), NCCL_CONFIG_MAGIC, NCCL_VERSION_CODE,                    \
        NCCL_CONFIG_UNDEF_INT, NCCL_CONFIG_UNDEF_INT, NCCL_CONFIG_UNDEF_INT,           \
        NCCL_CONFIG_UNDEF_INT, NCCL_CONFIG_UNDEF_PTR, NCCL_CONFIG_UNDEF_INT,           \
        NCCL_CONFIG_UNDEF_INT, NCCL_CONFIG_UNDEF_PTR, NCCL_CONFIG_UNDEF_INT,           \
        NCCL_CONFIG_UNDEF_INT, NCCL_CONFIG_UNDEF_INT, NCCL_CONFIG_UNDEF_INT,           \
        NCCL_CONFIG_UNDEF_INT, NCCL_CONFIG_UNDEF_INT                                   \
    }

// ---------------------------------------------------------------- versions, ids, errors
ncclResult_t ncclGetVersion(int *version);
ncclResult_t ncclGetUniqueId(ncclUniqueId *uniqueId);
const char *ncclGetErrorString(ncclResult_t result);
// The text of the last error, with what went wrong in words. `comm` may be NULL.
const char *ncclGetLastError(ncclComm_t comm);

// ---------------------------------------------------------------- communicators
// Every rank calls this once, with the same id and nranks and its own rank,
// after cudaSetDevice: one rank per (emulated) GPU.
ncclResult_t ncclCommInitRank(ncclComm_t *comm, int nranks, ncclUniqueId commId, int rank);
ncclResult_t ncclCommInitRankConfig(ncclComm_t *comm, int nranks, ncclUniqueId commId, int rank,
                                    ncclConfig_t *config);
// Several GPUs driven by one process: the emulator supports ndev == 1 only.
ncclResult_t ncclCommInitAll(ncclComm_t *comm, int ndev, const int *devlist);
ncclResult_t ncclCommFinalize(ncclComm_t comm);
ncclResult_t ncclCommDestroy(ncclComm_t comm);
ncclResult_t ncclCommAbort(ncclComm_t comm);
ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t *asyncError);
ncclResult_t ncclCommCount(const ncclComm_t comm, int *count);
ncclResult_t ncclCommCuDevice(const ncclComm_t comm, int *device);
ncclResult_t ncclCommUserRank(const ncclComm_t comm, int *rank);
// Every rank of comm calls it: the ranks with the same color form a new
// communicator, ranked by key (ties: by their rank in comm); a rank with
// NCCL_SPLIT_NOCOLOR gets NULL. config NULL: the parent's blocking mode.
#define NCCL_SPLIT_NOCOLOR -1
ncclResult_t ncclCommSplit(ncclComm_t comm, int color, int key, ncclComm_t *newcomm, ncclConfig_t *config);

// ---------------------------------------------------------------- collectives
// Counts are in elements. Each call is queued on `stream` and happens when
// the stream gets there, like a kernel.
ncclResult_t ncclAllReduce(const void *sendbuff, void *recvbuff, size_t count,
                           ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                           cudaStream_t stream);
ncclResult_t ncclBroadcast(const void *sendbuff, void *recvbuff, size_t count,
                           ncclDataType_t datatype, int root, ncclComm_t comm,
                           cudaStream_t stream);
ncclResult_t ncclReduce(const void *sendbuff, void *recvbuff, size_t count,
                        ncclDataType_t datatype, ncclRedOp_t op, int root, ncclComm_t comm,
                        cudaStream_t stream);
// sendcount per rank; recvbuff holds nranks * sendcount elements.
ncclResult_t ncclAllGather(const void *sendbuff, void *recvbuff, size_t sendcount,
                           ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream);
// recvcount per rank; sendbuff holds nranks * recvcount elements.
ncclResult_t ncclReduceScatter(const void *sendbuff, void *recvbuff, size_t recvcount,
                               ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                               cudaStream_t stream);

// The reduction "sum of each rank's input times that rank's scalar": its
// op, for the collectives of `comm` only, until ncclRedOpDestroy.
ncclResult_t ncclRedOpCreatePreMulSum(ncclRedOp_t *op, void *scalar, ncclDataType_t datatype,
                                      ncclScalarResidence_t residence, ncclComm_t comm);
ncclResult_t ncclRedOpDestroy(ncclRedOp_t op, ncclComm_t comm);
// NCCL 1's in-place broadcast.
ncclResult_t ncclBcast(void *buff, size_t count, ncclDataType_t datatype, int root, ncclComm_t comm,
                       cudaStream_t stream);

// ---------------------------------------------------------------- point-to-point
ncclResult_t ncclSend(const void *sendbuff, size_t count, ncclDataType_t datatype, int peer,
                      ncclComm_t comm, cudaStream_t stream);
ncclResult_t ncclRecv(void *recvbuff, size_t count, ncclDataType_t datatype, int peer,
                      ncclComm_t comm, cudaStream_t stream);

// ---------------------------------------------------------------- groups
// Calls between these two are collected and queued together at the
// outermost ncclGroupEnd, so sends and receives that need each other
// progress together.
ncclResult_t ncclGroupStart(void);
ncclResult_t ncclGroupEnd(void);

#ifdef __cplusplus
}  // extern "C"
#endif

#endif
