// Part of libshardline_gpu.so, the only object that links CUDA and NCCL: the
// NCCL communicator, collective, event and device-memory functions of
// plugin_abi.h (ShardlineGpuApi). The worker side is
// worker/comm/nccl_backend.cc.
//
// Communicators are created in NCCL's non-blocking mode (config.blocking = 0)
// so that neither init nor an enqueue can hang a worker thread: every NCCL
// call that returns ncclInProgress is followed by polling
// ncclCommGetAsyncError until it settles, a deadline passes, or comm_abort is
// requested from another thread.
#include <cuda_runtime_api.h>
#include <nccl.h>

#include <atomic>
#include <chrono>
#include <cstdarg>
#include <cstdio>
#include <cstring>
#include <thread>

#include "absl/synchronization/mutex.h"
#include "worker/gpu/plugin_abi.h"

static_assert(SHARDLINE_NCCL_UNIQUE_ID_BYTES == NCCL_UNIQUE_ID_BYTES,
              "plugin_abi.h's unique id size must match nccl.h");
static_assert(sizeof(ncclUniqueId) == NCCL_UNIQUE_ID_BYTES, "ncclUniqueId is its bytes");

struct ShardlineNcclComm {
  ncclComm_t comm = nullptr;
  cudaStream_t stream = nullptr;
  float* scratch = nullptr;  // one float on the device, for barrier
  cudaEvent_t mark = nullptr;  // comm_order_after_stream's point on the other stream
  int device = 0;
  int nranks = 0;
  int rank = 0;
  // Set by comm_abort before it takes `mu`, so a call polling for an enqueue
  // gives up promptly instead of holding `mu` until its deadline.
  std::atomic<bool> abort_requested{false};
  absl::Mutex mu;  // serialises every NCCL call on `comm`
  bool aborted ABSL_GUARDED_BY(mu) = false;  // `comm` is freed once true
};

struct ShardlineGpuEvent {
  cudaEvent_t event = nullptr;
  int device = 0;
};

namespace {

using Clock = std::chrono::steady_clock;

int Fail(int code, char* error, size_t error_len, const char* format, ...)
    __attribute__((format(printf, 4, 5)));
int Fail(int code, char* error, size_t error_len, const char* format, ...) {
  if (error != nullptr && error_len > 0) {
    va_list args;
    va_start(args, format);
    std::vsnprintf(error, error_len, format, args);
    va_end(args);
  }
  return code;
}

// "ncclX: <result text> (<last error>)".
int FailNccl(int code, char* error, size_t error_len, const char* call, ncclResult_t result,
             ncclComm_t comm) {
  const char* last = ncclGetLastError(comm);
  return Fail(code, error, error_len, "%s: %s%s%s%s", call, ncclGetErrorString(result),
              last != nullptr && last[0] != '\0' ? " (" : "", last != nullptr ? last : "",
              last != nullptr && last[0] != '\0' ? ")" : "");
}

int FailCuda(char* error, size_t error_len, const char* call, cudaError_t e) {
  return Fail(SHARDLINE_GPU_UNAVAILABLE, error, error_len, "%s: %s (%s)", call,
              cudaGetErrorString(e), cudaGetErrorName(e));
}

// NCCL result -> plugin code. Usage errors are the caller's bug; the rest mean
// the communicator (or a peer, or the network) is broken.
int CodeOf(ncclResult_t r) {
  switch (r) {
    case ncclSuccess:
      return SHARDLINE_GPU_OK;
    case ncclInvalidArgument:
    case ncclInvalidUsage:
      return SHARDLINE_GPU_INVALID_ARGUMENT;
    default:
      return SHARDLINE_GPU_UNAVAILABLE;
  }
}

bool ToNccl(int32_t dtype, ncclDataType_t* out, size_t* element_size) {
  switch (dtype) {
    case SHARDLINE_GPU_FLOAT32:
      *out = ncclFloat32;
      *element_size = 4;
      return true;
    case SHARDLINE_GPU_FLOAT16:
      *out = ncclFloat16;
      *element_size = 2;
      return true;
    case SHARDLINE_GPU_BFLOAT16:
      *out = ncclBfloat16;
      *element_size = 2;
      return true;
  }
  return false;
}

bool ToNcclOp(int32_t op, ncclRedOp_t* out) {
  switch (op) {
    case SHARDLINE_GPU_SUM:
      *out = ncclSum;
      return true;
    case SHARDLINE_GPU_AVG:
      *out = ncclAvg;
      return true;
    case SHARDLINE_GPU_MAX:
      *out = ncclMax;
      return true;
    case SHARDLINE_GPU_MIN:
      *out = ncclMin;
      return true;
  }
  return false;
}

// Polls ncclCommGetAsyncError on a non-blocking communicator until it leaves
// ncclInProgress. Returns the settled result, or ncclInProgress if `deadline`
// passed or `abort_requested` was set first.
ncclResult_t Settle(ncclComm_t comm, Clock::time_point deadline,
                    const std::atomic<bool>* abort_requested) {
  auto sleep = std::chrono::microseconds(1);
  while (true) {
    ncclResult_t state = ncclSuccess;
    const ncclResult_t r = ncclCommGetAsyncError(comm, &state);
    if (r != ncclSuccess) return r;
    if (state != ncclInProgress) return state;
    if (Clock::now() >= deadline) return ncclInProgress;
    if (abort_requested != nullptr && abort_requested->load()) return ncclInProgress;
    std::this_thread::sleep_for(sleep);
    if (sleep < std::chrono::milliseconds(1)) sleep *= 2;
  }
}

Clock::time_point DeadlineAfter(int64_t timeout_ms) {
  if (timeout_ms <= 0 || timeout_ms > int64_t{1} << 40) return Clock::time_point::max();
  return Clock::now() + std::chrono::milliseconds(timeout_ms);
}

// Runs `enqueue` (NCCL calls on comm->stream) under comm->mu, waits for the
// enqueue to settle, and records an event after it.
template <typename F>
int Enqueue(ShardlineNcclComm* c, const char* what, int64_t timeout_ms, ShardlineGpuEvent** event,
            char* error, size_t error_len, F enqueue) {
  if (c == nullptr || event == nullptr)
    return Fail(SHARDLINE_GPU_INVALID_ARGUMENT, error, error_len, "%s: null comm or event", what);
  *event = nullptr;
  const Clock::time_point deadline = DeadlineAfter(timeout_ms);
  absl::MutexLock lock(&c->mu);
  if (c->aborted || c->abort_requested.load())
    return Fail(SHARDLINE_GPU_ABORTED, error, error_len, "%s: communicator was aborted", what);
  cudaError_t e = cudaSetDevice(c->device);
  if (e != cudaSuccess) return FailCuda(error, error_len, "cudaSetDevice", e);
  ncclResult_t r = enqueue();
  if (r == ncclInProgress) r = Settle(c->comm, deadline, &c->abort_requested);
  if (r == ncclInProgress) {
    if (c->abort_requested.load())
      return Fail(SHARDLINE_GPU_ABORTED, error, error_len, "%s: communicator was aborted", what);
    return Fail(SHARDLINE_GPU_DEADLINE_EXCEEDED, error, error_len,
                "%s: NCCL did not finish enqueueing within %lld ms", what,
                static_cast<long long>(timeout_ms));
  }
  if (r != ncclSuccess) return FailNccl(CodeOf(r), error, error_len, what, r, c->comm);
  auto* ev = new ShardlineGpuEvent;
  ev->device = c->device;
  e = cudaEventCreateWithFlags(&ev->event, cudaEventDisableTiming);
  if (e != cudaSuccess) {
    delete ev;
    return FailCuda(error, error_len, "cudaEventCreateWithFlags", e);
  }
  e = cudaEventRecord(ev->event, c->stream);
  if (e != cudaSuccess) {
    cudaEventDestroy(ev->event);
    delete ev;
    return FailCuda(error, error_len, "cudaEventRecord", e);
  }
  *event = ev;
  return SHARDLINE_GPU_OK;
}

// Checks dtype (and op when `op` >= 0) and fills the NCCL equivalents.
int Types(int32_t dtype, int32_t op, ncclDataType_t* t, size_t* size, ncclRedOp_t* o,
          const char* what, char* error, size_t error_len) {
  if (!ToNccl(dtype, t, size))
    return Fail(SHARDLINE_GPU_INVALID_ARGUMENT, error, error_len, "%s: unknown dtype %d", what,
                dtype);
  if (o != nullptr && !ToNcclOp(op, o))
    return Fail(SHARDLINE_GPU_INVALID_ARGUMENT, error, error_len, "%s: unknown reduce op %d", what,
                op);
  return SHARDLINE_GPU_OK;
}

const char* Bytes(const void* p, size_t elements, size_t element_size) {
  return static_cast<const char*>(p) + elements * element_size;
}
char* Bytes(void* p, size_t elements, size_t element_size) {
  return static_cast<char*>(p) + elements * element_size;
}

// --- The ABI functions ---

int DeviceCount(int32_t* count, char* error, size_t error_len) {
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  *count = e == cudaSuccess ? n : 0;
  if (e != cudaSuccess) return FailCuda(error, error_len, "cudaGetDeviceCount", e);
  if (n == 0)
    return Fail(SHARDLINE_GPU_UNAVAILABLE, error, error_len, "cudaGetDeviceCount: 0 devices");
  return SHARDLINE_GPU_OK;
}

int GetUniqueId(uint8_t id[SHARDLINE_NCCL_UNIQUE_ID_BYTES], char* error, size_t error_len) {
  ncclUniqueId uid;
  const ncclResult_t r = ncclGetUniqueId(&uid);
  if (r != ncclSuccess)
    return FailNccl(SHARDLINE_GPU_UNAVAILABLE, error, error_len, "ncclGetUniqueId", r, nullptr);
  std::memcpy(id, uid.internal, NCCL_UNIQUE_ID_BYTES);
  return SHARDLINE_GPU_OK;
}

int CommInit(const uint8_t id[SHARDLINE_NCCL_UNIQUE_ID_BYTES], int32_t nranks, int32_t rank,
             int32_t device, int64_t timeout_ms, ShardlineNcclComm** out, char* error,
             size_t error_len) {
  if (out == nullptr) return Fail(SHARDLINE_GPU_INVALID_ARGUMENT, error, error_len, "comm is null");
  *out = nullptr;
  if (nranks < 1 || rank < 0 || rank >= nranks) {
    return Fail(SHARDLINE_GPU_INVALID_ARGUMENT, error, error_len, "rank=%d out of range [0,%d)",
                rank, nranks);
  }
  int devices = 0;
  cudaError_t e = cudaGetDeviceCount(&devices);
  if (e != cudaSuccess) return FailCuda(error, error_len, "cudaGetDeviceCount", e);
  if (device < 0 || device >= devices) {
    return Fail(SHARDLINE_GPU_INVALID_ARGUMENT, error, error_len, "device=%d out of range [0,%d)",
                device, devices);
  }
  e = cudaSetDevice(device);
  if (e != cudaSuccess) return FailCuda(error, error_len, "cudaSetDevice", e);

  ncclUniqueId uid;
  std::memcpy(uid.internal, id, NCCL_UNIQUE_ID_BYTES);
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;  // init and every later call return ncclInProgress instead of blocking
  ncclComm_t comm = nullptr;
  ncclResult_t r = ncclCommInitRankConfig(&comm, nranks, uid, rank, &config);
  if (r == ncclInProgress) r = Settle(comm, DeadlineAfter(timeout_ms), nullptr);
  if (r == ncclInProgress) {
    ncclCommAbort(comm);
    return Fail(SHARDLINE_GPU_DEADLINE_EXCEEDED, error, error_len,
                "ncclCommInitRankConfig: rank %d of %d on device %d: not every rank joined "
                "within %lld ms",
                rank, nranks, device, static_cast<long long>(timeout_ms));
  }
  if (r != ncclSuccess) {
    const int code = FailNccl(CodeOf(r), error, error_len, "ncclCommInitRankConfig", r, comm);
    if (comm != nullptr) ncclCommAbort(comm);
    return code;
  }
  auto* c = new ShardlineNcclComm;
  c->comm = comm;
  c->device = device;
  c->nranks = nranks;
  c->rank = rank;
  e = cudaStreamCreateWithFlags(&c->stream, cudaStreamNonBlocking);
  if (e == cudaSuccess) e = cudaMalloc(&c->scratch, sizeof(float));
  if (e == cudaSuccess) e = cudaMemset(c->scratch, 0, sizeof(float));
  if (e == cudaSuccess) e = cudaEventCreateWithFlags(&c->mark, cudaEventDisableTiming);
  if (e != cudaSuccess) {
    const int code =
        FailCuda(error, error_len, "creating the communicator's stream/scratch/event", e);
    ncclCommAbort(comm);
    if (c->stream != nullptr) cudaStreamDestroy(c->stream);
    if (c->scratch != nullptr) cudaFree(c->scratch);
    if (c->mark != nullptr) cudaEventDestroy(c->mark);
    delete c;
    return code;
  }
  *out = c;
  return SHARDLINE_GPU_OK;
}

int CommStatus(ShardlineNcclComm* c, char* error, size_t error_len) {
  if (c->abort_requested.load())
    return Fail(SHARDLINE_GPU_ABORTED, error, error_len, "communicator was aborted");
  absl::MutexLock lock(&c->mu);
  if (c->aborted) return Fail(SHARDLINE_GPU_ABORTED, error, error_len, "communicator was aborted");
  ncclResult_t state = ncclSuccess;
  const ncclResult_t r = ncclCommGetAsyncError(c->comm, &state);
  if (r != ncclSuccess)
    return FailNccl(SHARDLINE_GPU_UNAVAILABLE, error, error_len, "ncclCommGetAsyncError", r,
                    c->comm);
  if (state == ncclSuccess || state == ncclInProgress) return SHARDLINE_GPU_OK;
  return FailNccl(SHARDLINE_GPU_UNAVAILABLE, error, error_len, "NCCL asynchronous error", state,
                  c->comm);
}

void CommAbort(ShardlineNcclComm* c) {
  if (c == nullptr) return;
  c->abort_requested.store(true);
  absl::MutexLock lock(&c->mu);
  if (c->aborted) return;
  c->aborted = true;
  cudaSetDevice(c->device);
  ncclCommAbort(c->comm);  // stops the kernels; blocks only for local teardown
  c->comm = nullptr;
}

void CommDestroy(ShardlineNcclComm* c) {
  if (c == nullptr) return;
  CommAbort(c);
  cudaSetDevice(c->device);
  // Neither call waits for the stream: resources are released once it drains,
  // which it does promptly now that the NCCL kernels are aborted.
  if (c->scratch != nullptr) cudaFree(c->scratch);
  if (c->mark != nullptr) cudaEventDestroy(c->mark);
  if (c->stream != nullptr) cudaStreamDestroy(c->stream);
  delete c;
}

int CommOrderAfterStream(ShardlineNcclComm* c, void* stream, char* error, size_t error_len) {
  if (c == nullptr || stream == nullptr)
    return Fail(SHARDLINE_GPU_INVALID_ARGUMENT, error, error_len,
                "comm_order_after_stream: null comm or stream");
  absl::MutexLock lock(&c->mu);
  if (c->aborted || c->abort_requested.load())
    return Fail(SHARDLINE_GPU_ABORTED, error, error_len, "communicator was aborted");
  cudaError_t e = cudaSetDevice(c->device);
  if (e != cudaSuccess) return FailCuda(error, error_len, "cudaSetDevice", e);
  // One event serves every call: cudaStreamWaitEvent waits for the work the
  // event's latest record captured, whatever is recorded on it later.
  e = cudaEventRecord(c->mark, static_cast<cudaStream_t>(stream));
  if (e != cudaSuccess) return FailCuda(error, error_len, "cudaEventRecord (on the compute stream)", e);
  e = cudaStreamWaitEvent(c->stream, c->mark, 0);
  if (e != cudaSuccess) return FailCuda(error, error_len, "cudaStreamWaitEvent (communicator)", e);
  return SHARDLINE_GPU_OK;
}

int StreamWaitEvent(void* stream, ShardlineGpuEvent* ev, char* error, size_t error_len) {
  if (stream == nullptr || ev == nullptr)
    return Fail(SHARDLINE_GPU_INVALID_ARGUMENT, error, error_len,
                "stream_wait_event: null stream or event");
  cudaError_t e = cudaSetDevice(ev->device);
  if (e != cudaSuccess) return FailCuda(error, error_len, "cudaSetDevice", e);
  e = cudaStreamWaitEvent(static_cast<cudaStream_t>(stream), ev->event, 0);
  if (e != cudaSuccess) return FailCuda(error, error_len, "cudaStreamWaitEvent", e);
  return SHARDLINE_GPU_OK;
}

int AllReduce(ShardlineNcclComm* c, void* data, size_t count, int32_t dtype, int32_t op,
              int64_t timeout_ms, ShardlineGpuEvent** event, char* error, size_t error_len) {
  ncclDataType_t t;
  size_t es;
  ncclRedOp_t o;
  if (int s = Types(dtype, op, &t, &es, &o, "ncclAllReduce", error, error_len)) return s;
  return Enqueue(c, "ncclAllReduce", timeout_ms, event, error, error_len,
                 [&] { return ncclAllReduce(data, data, count, t, o, c->comm, c->stream); });
}

int AllGather(ShardlineNcclComm* c, const void* in, size_t count, void* out, int32_t dtype,
              int64_t timeout_ms, ShardlineGpuEvent** event, char* error, size_t error_len) {
  ncclDataType_t t;
  size_t es;
  if (int s = Types(dtype, 0, &t, &es, nullptr, "ncclAllGather", error, error_len)) return s;
  return Enqueue(c, "ncclAllGather", timeout_ms, event, error, error_len,
                 [&] { return ncclAllGather(in, out, count, t, c->comm, c->stream); });
}

int ReduceScatter(ShardlineNcclComm* c, const void* in, void* out, const size_t* counts,
                  int32_t dtype, int32_t op, int64_t timeout_ms, ShardlineGpuEvent** event,
                  char* error, size_t error_len) {
  ncclDataType_t t;
  size_t es;
  ncclRedOp_t o;
  if (int s = Types(dtype, op, &t, &es, &o, "reduce_scatter", error, error_len)) return s;
  bool equal = true;
  for (int r = 1; r < c->nranks; ++r) equal = equal && counts[r] == counts[0];
  if (equal) {
    return Enqueue(c, "ncclReduceScatter", timeout_ms, event, error, error_len,
                   [&] { return ncclReduceScatter(in, out, counts[0], t, o, c->comm, c->stream); });
  }
  // Uneven pieces: piece r is reduced onto rank r. recvbuff is only written
  // on the root, so `out` is passed on every rank.
  return Enqueue(
      c, "reduce_scatter (grouped ncclReduce)", timeout_ms, event, error, error_len, [&] {
        ncclResult_t r = ncclGroupStart();
        if (r != ncclSuccess) return r;
        size_t offset = 0;
        for (int p = 0; p < c->nranks; ++p) {
          if (counts[p] > 0) {
            r = ncclReduce(Bytes(in, offset, es), out, counts[p], t, o, p, c->comm, c->stream);
            if (r != ncclSuccess && r != ncclInProgress) break;
          }
          offset += counts[p];
        }
        const ncclResult_t end = ncclGroupEnd();
        return r != ncclSuccess && r != ncclInProgress ? r : end;
      });
}

int AllToAll(ShardlineNcclComm* c, const void* in, const size_t* send_counts, void* out,
             const size_t* recv_counts, int32_t dtype, int64_t timeout_ms,
             ShardlineGpuEvent** event, char* error, size_t error_len) {
  ncclDataType_t t;
  size_t es;
  if (int s = Types(dtype, 0, &t, &es, nullptr, "all_to_all", error, error_len)) return s;
  return Enqueue(
      c, "all_to_all (grouped ncclSend/ncclRecv)", timeout_ms, event, error, error_len, [&] {
        ncclResult_t r = ncclGroupStart();
        if (r != ncclSuccess) return r;
        size_t send_offset = 0, recv_offset = 0;
        for (int p = 0; p < c->nranks; ++p) {
          if (send_counts[p] > 0) {
            r = ncclSend(Bytes(in, send_offset, es), send_counts[p], t, p, c->comm, c->stream);
            if (r != ncclSuccess && r != ncclInProgress) break;
          }
          if (recv_counts[p] > 0) {
            r = ncclRecv(Bytes(out, recv_offset, es), recv_counts[p], t, p, c->comm, c->stream);
            if (r != ncclSuccess && r != ncclInProgress) break;
          }
          send_offset += send_counts[p];
          recv_offset += recv_counts[p];
        }
        const ncclResult_t end = ncclGroupEnd();
        return r != ncclSuccess && r != ncclInProgress ? r : end;
      });
}

int Broadcast(ShardlineNcclComm* c, void* data, size_t count, int32_t dtype, int32_t root,
              int64_t timeout_ms, ShardlineGpuEvent** event, char* error, size_t error_len) {
  ncclDataType_t t;
  size_t es;
  if (int s = Types(dtype, 0, &t, &es, nullptr, "ncclBroadcast", error, error_len)) return s;
  return Enqueue(c, "ncclBroadcast", timeout_ms, event, error, error_len,
                 [&] { return ncclBroadcast(data, data, count, t, root, c->comm, c->stream); });
}

int Send(ShardlineNcclComm* c, const void* data, size_t count, int32_t dtype, int32_t peer,
         int64_t timeout_ms, ShardlineGpuEvent** event, char* error, size_t error_len) {
  ncclDataType_t t;
  size_t es;
  if (int s = Types(dtype, 0, &t, &es, nullptr, "ncclSend", error, error_len)) return s;
  return Enqueue(c, "ncclSend", timeout_ms, event, error, error_len,
                 [&] { return ncclSend(data, count, t, peer, c->comm, c->stream); });
}

int Recv(ShardlineNcclComm* c, void* data, size_t count, int32_t dtype, int32_t peer,
         int64_t timeout_ms, ShardlineGpuEvent** event, char* error, size_t error_len) {
  ncclDataType_t t;
  size_t es;
  if (int s = Types(dtype, 0, &t, &es, nullptr, "ncclRecv", error, error_len)) return s;
  return Enqueue(c, "ncclRecv", timeout_ms, event, error, error_len,
                 [&] { return ncclRecv(data, count, t, peer, c->comm, c->stream); });
}

int Barrier(ShardlineNcclComm* c, int64_t timeout_ms, ShardlineGpuEvent** event, char* error,
            size_t error_len) {
  return Enqueue(c, "barrier (ncclAllReduce of 1 float)", timeout_ms, event, error, error_len, [&] {
    return ncclAllReduce(c->scratch, c->scratch, 1, ncclFloat32, ncclSum, c->comm, c->stream);
  });
}

int EventQuery(ShardlineGpuEvent* ev, int32_t* done, char* error, size_t error_len) {
  *done = 0;
  cudaSetDevice(ev->device);
  const cudaError_t e = cudaEventQuery(ev->event);
  if (e == cudaSuccess) {
    *done = 1;
    return SHARDLINE_GPU_OK;
  }
  if (e == cudaErrorNotReady) return SHARDLINE_GPU_OK;
  return FailCuda(error, error_len, "cudaEventQuery", e);
}

void EventDestroy(ShardlineGpuEvent* ev) {
  if (ev == nullptr) return;
  cudaSetDevice(ev->device);
  cudaEventDestroy(ev->event);
  delete ev;
}

int DeviceAlloc(int32_t device, size_t bytes, void** ptr, char* error, size_t error_len) {
  *ptr = nullptr;
  cudaError_t e = cudaSetDevice(device);
  if (e != cudaSuccess) return FailCuda(error, error_len, "cudaSetDevice", e);
  e = cudaMalloc(ptr, bytes == 0 ? 1 : bytes);
  if (e == cudaErrorMemoryAllocation) {
    return Fail(SHARDLINE_GPU_RESOURCE_EXHAUSTED, error, error_len,
                "cudaMalloc(%zu bytes) on device %d: out of memory", bytes, device);
  }
  if (e != cudaSuccess) return FailCuda(error, error_len, "cudaMalloc", e);
  return SHARDLINE_GPU_OK;
}

void DeviceFree(int32_t device, void* ptr) {
  cudaSetDevice(device);
  cudaFree(ptr);
}

int Copy(int32_t device, void* dst, const void* src, size_t bytes, cudaMemcpyKind kind, char* error,
         size_t error_len) {
  cudaError_t e = cudaSetDevice(device);
  if (e != cudaSuccess) return FailCuda(error, error_len, "cudaSetDevice", e);
  if (bytes == 0) return SHARDLINE_GPU_OK;
  e = cudaMemcpy(dst, src, bytes, kind);
  if (e != cudaSuccess) return FailCuda(error, error_len, "cudaMemcpy", e);
  return SHARDLINE_GPU_OK;
}

int CopyToDevice(int32_t device, void* dst, const void* src, size_t bytes, char* error,
                 size_t error_len) {
  return Copy(device, dst, src, bytes, cudaMemcpyHostToDevice, error, error_len);
}

int CopyToHost(int32_t device, void* dst, const void* src, size_t bytes, char* error,
               size_t error_len) {
  return Copy(device, dst, src, bytes, cudaMemcpyDeviceToHost, error, error_len);
}

const ShardlineGpuApi kApi = {
    SHARDLINE_GPU_ABI_VERSION,
    DeviceCount,
    GetUniqueId,
    CommInit,
    CommStatus,
    CommAbort,
    CommDestroy,
    AllReduce,
    AllGather,
    ReduceScatter,
    AllToAll,
    Broadcast,
    Send,
    Recv,
    Barrier,
    EventQuery,
    EventDestroy,
    DeviceAlloc,
    DeviceFree,
    CopyToDevice,
    CopyToHost,
    CommOrderAfterStream,
    StreamWaitEvent,
};

}  // namespace

extern "C" __attribute__((visibility("default"))) const ShardlineGpuApi* shardline_gpu_api(void) {
  return &kApi;
}
