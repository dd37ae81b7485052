// libshardline_gpu_fake.so: a stand-in for the GPU plugin with no CUDA, so
// the worker side of the NCCL backend (bootstrap through the store, Work
// polling, op timeout, asynchronous errors, abort) is tested on machines
// without a GPU. "Device" memory is host memory; communicators of any size
// exist only locally and every collective leaves the buffers as they are.
//
// A test dlopen()s the same path the backend loads (so both see one copy of
// the state below) and steers it through the shardline_fake_* functions.
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "worker/gpu/plugin_abi.h"

// What the next operations do (shardline_fake_set_mode).
#define SHARDLINE_FAKE_COMPLETE 0     // finish at once
#define SHARDLINE_FAKE_HANG 1         // never finish (a silent peer) until aborted
#define SHARDLINE_FAKE_ASYNC_ERROR 2  // never finish; the communicator reports an error
#define SHARDLINE_FAKE_INIT_HANG 3    // comm_init waits out its deadline

struct ShardlineNcclComm {
  int nranks = 0;
  int rank = 0;
  std::atomic<bool> aborted{false};
  std::atomic<bool> failed{false};
};

struct ShardlineGpuEvent {
  ShardlineNcclComm* comm;  // outlives the event (the worker keeps it alive)
  bool done;                // finished at issue
};

namespace {

ABSL_CONST_INIT absl::Mutex mu(absl::kConstInit);
int mode ABSL_GUARDED_BY(mu) = SHARDLINE_FAKE_COMPLETE;
int aborts ABSL_GUARDED_BY(mu) = 0;
std::vector<std::string> init_ids ABSL_GUARDED_BY(mu);  // one per comm_init, in call order

int Mode() {
  absl::MutexLock lock(&mu);
  return mode;
}

int Fail(int code, char* error, size_t error_len, const char* text) {
  if (error != nullptr && error_len > 0) std::snprintf(error, error_len, "%s", text);
  return code;
}

int DeviceCount(int32_t* count, char*, size_t) {
  *count = 1;
  return SHARDLINE_GPU_OK;
}

int GetUniqueId(uint8_t id[SHARDLINE_NCCL_UNIQUE_ID_BYTES], char*, size_t) {
  static std::atomic<int> next{1};
  const int n = next++;
  for (int i = 0; i < SHARDLINE_NCCL_UNIQUE_ID_BYTES; ++i) id[i] = static_cast<uint8_t>(n * 31 + i);
  return SHARDLINE_GPU_OK;
}

int CommInit(const uint8_t id[SHARDLINE_NCCL_UNIQUE_ID_BYTES], int32_t nranks, int32_t rank,
             int32_t, int64_t, ShardlineNcclComm** comm, char* error, size_t error_len) {
  {
    absl::MutexLock lock(&mu);
    init_ids.emplace_back(reinterpret_cast<const char*>(id), SHARDLINE_NCCL_UNIQUE_ID_BYTES);
  }
  if (Mode() == SHARDLINE_FAKE_INIT_HANG) {
    return Fail(SHARDLINE_GPU_DEADLINE_EXCEEDED, error, error_len,
                "ncclCommInitRankConfig: not every rank joined (fake)");
  }
  *comm = new ShardlineNcclComm;
  (*comm)->nranks = nranks;
  (*comm)->rank = rank;
  return SHARDLINE_GPU_OK;
}

int CommStatus(ShardlineNcclComm* c, char* error, size_t error_len) {
  if (c->aborted) return Fail(SHARDLINE_GPU_ABORTED, error, error_len, "communicator was aborted");
  if (c->failed) {
    return Fail(SHARDLINE_GPU_UNAVAILABLE, error, error_len,
                "NCCL asynchronous error: remote process exited or there was a network error "
                "(fake)");
  }
  return SHARDLINE_GPU_OK;
}

void CommAbort(ShardlineNcclComm* c) {
  if (c->aborted.exchange(true)) return;
  absl::MutexLock lock(&mu);
  ++aborts;
}

void CommDestroy(ShardlineNcclComm* c) {
  CommAbort(c);
  delete c;
}

int Issue(ShardlineNcclComm* c, ShardlineGpuEvent** event, char* error, size_t error_len) {
  if (c->aborted) return Fail(SHARDLINE_GPU_ABORTED, error, error_len, "communicator was aborted");
  const int m = Mode();
  if (m == SHARDLINE_FAKE_ASYNC_ERROR) c->failed = true;
  *event = new ShardlineGpuEvent{c, m == SHARDLINE_FAKE_COMPLETE};
  return SHARDLINE_GPU_OK;
}

int AllReduce(ShardlineNcclComm* c, void*, size_t, int32_t, int32_t, int64_t,
              ShardlineGpuEvent** event, char* error, size_t error_len) {
  return Issue(c, event, error, error_len);
}
int AllGather(ShardlineNcclComm* c, const void* in, size_t count, void* out, int32_t dtype, int64_t,
              ShardlineGpuEvent** event, char* error, size_t error_len) {
  const size_t e = dtype == SHARDLINE_GPU_FLOAT32 ? 4 : 2;
  if (c->nranks == 1 && in != out && count > 0) std::memmove(out, in, count * e);
  return Issue(c, event, error, error_len);
}
int ReduceScatter(ShardlineNcclComm* c, const void*, void*, const size_t*, int32_t, int32_t,
                  int64_t, ShardlineGpuEvent** event, char* error, size_t error_len) {
  return Issue(c, event, error, error_len);
}
int AllToAll(ShardlineNcclComm* c, const void*, const size_t*, void*, const size_t*, int32_t,
             int64_t, ShardlineGpuEvent** event, char* error, size_t error_len) {
  return Issue(c, event, error, error_len);
}
int Broadcast(ShardlineNcclComm* c, void*, size_t, int32_t, int32_t, int64_t,
              ShardlineGpuEvent** event, char* error, size_t error_len) {
  return Issue(c, event, error, error_len);
}
int SendRecv(ShardlineNcclComm* c, const void*, size_t, int32_t, int32_t, int64_t,
             ShardlineGpuEvent** event, char* error, size_t error_len) {
  return Issue(c, event, error, error_len);
}
int Recv(ShardlineNcclComm* c, void*, size_t, int32_t, int32_t, int64_t, ShardlineGpuEvent** event,
         char* error, size_t error_len) {
  return Issue(c, event, error, error_len);
}
int Barrier(ShardlineNcclComm* c, int64_t, ShardlineGpuEvent** event, char* error,
            size_t error_len) {
  return Issue(c, event, error, error_len);
}

int EventQuery(ShardlineGpuEvent* ev, int32_t* done, char*, size_t) {
  // Aborted kernels stop, so their events fire (the worker reports Aborted).
  *done = ev->done || ev->comm->aborted ? 1 : 0;
  return SHARDLINE_GPU_OK;
}
void EventDestroy(ShardlineGpuEvent* ev) { delete ev; }

int DeviceAlloc(int32_t, size_t bytes, void** ptr, char*, size_t) {
  *ptr = std::malloc(bytes == 0 ? 1 : bytes);
  return SHARDLINE_GPU_OK;
}
void DeviceFree(int32_t, void* ptr) { std::free(ptr); }
int CopyBytes(int32_t, void* dst, const void* src, size_t bytes, char*, size_t) {
  if (bytes > 0) std::memcpy(dst, src, bytes);
  return SHARDLINE_GPU_OK;
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
    SendRecv,
    Recv,
    Barrier,
    EventQuery,
    EventDestroy,
    DeviceAlloc,
    DeviceFree,
    CopyBytes,
    CopyBytes,
};

}  // namespace

#define EXPORT extern "C" __attribute__((visibility("default")))

EXPORT int shardline_gpu_probe(ShardlineGpuInfo* info, char*, size_t) {
  std::memset(info, 0, sizeof(*info));
  info->abi_version = SHARDLINE_GPU_ABI_VERSION;
  info->device_count = 1;
  std::snprintf(info->devices[0].name, sizeof(info->devices[0].name), "fake GPU");
  return SHARDLINE_GPU_OK;
}

EXPORT const ShardlineGpuApi* shardline_gpu_api(void) { return &kApi; }

// --- Test controls ---

EXPORT void shardline_fake_set_mode(int m) {
  absl::MutexLock lock(&mu);
  mode = m;
}

// comm_abort calls that aborted a live communicator, since the last reset.
EXPORT int shardline_fake_aborts(void) {
  absl::MutexLock lock(&mu);
  return aborts;
}

// How many comm_init calls since the last reset used the unique id `id`.
EXPORT int shardline_fake_inits_with_id(const uint8_t* id) {
  absl::MutexLock lock(&mu);
  int n = 0;
  for (const std::string& s : init_ids)
    n += std::memcmp(s.data(), id, SHARDLINE_NCCL_UNIQUE_ID_BYTES) == 0;
  return n;
}

EXPORT void shardline_fake_reset(void) {
  absl::MutexLock lock(&mu);
  mode = SHARDLINE_FAKE_COMPLETE;
  aborts = 0;
  init_ids.clear();
}
