// The NCCL (GPU) backend: Backend (backend.h) over the GPU plugin
// (worker/gpu/plugin_abi.h). This file and nccl_backend.cc never link CUDA or
// NCCL; every call goes through libshardline_gpu.so, dlopen()ed at run time,
// so one worker binary runs anywhere (with Gloo where there is no GPU).
//
//   auto group = PrefixStore(store, "gen3/dp0/");
//   auto nccl = CreateNcclBackend(group, rank, size, {});
//   if (absl::IsUnavailable(nccl.status())) nccl = CreateGlooBackend(group, rank, size, {});
//   (*nccl)->AllReduce(device_grads, n, DType::kBFloat16, ReduceOp::kAvg)->Wait();
//
// Differences from the conventions of backend.h:
//   * Every buffer is a DEVICE pointer on this rank's device (options.device);
//     host pointers fail inside NCCL (Unavailable naming the CUDA error) or
//     crash the kernel. Counts are elements, as everywhere.
//   * Operations are enqueued on the communicator's own CUDA stream and run
//     there in issue order; the issuing thread returns at once. Work::Wait
//     polls the operation's CUDA event and ncclCommGetAsyncError; it does not
//     synchronise any other stream. The caller orders its compute stream
//     against ours either on the host (synchronise the device before
//     issuing, wait on the Work before touching the buffer) or on the device
//     with stream_ordered(): OrderAfter(stream) makes the group's streams
//     (p2p channels included) wait for the compute stream's work so far, and
//     Work::OrderBefore(stream) makes the compute stream wait for the
//     operation (cudaEventRecord / cudaStreamWaitEvent; no host waits).
//   * Watchdog: the operations some stream waits for (OrderBefore) are
//     watched by a thread of the backend until each has a status, so that
//     one past options.timeout, or whose communicator reports an
//     asynchronous error, is aborted (which stops its kernels and frees the
//     waiting stream) even when no host thread waits for it, as torch's
//     ProcessGroupNCCL watchdog does. Every 10 ms it polls, per
//     communicator, the oldest watched operation still running (with its
//     communicator's asynchronous error): a communicator's operations finish
//     and reach their deadlines in issue order, which is the order the
//     trainer watches them in.
//   * 16-bit types are reduced by NCCL in its own precision (fp16 adds in
//     fp16, bf16 as NCCL does), not by fp32 accumulation; results may differ
//     from Gloo's in the last bit. kAvg is ncclAvg.
//   * A count of 0 is a no-op in NCCL: it does not synchronise the group.
//   * Send/Recv: NCCL has no tags; a pair's messages match in issue order. The
//     tag is accepted and ignored. They share the group's stream with its
//     collectives unless options.p2p_channels gives neighbours their own.
//   * ReduceScatter with uneven counts runs one ncclReduce per piece in one
//     NCCL group (no scratch memory); equal counts use ncclReduceScatter.
//   * AllToAll is ncclSend/ncclRecv per peer in one group; mismatched counts
//     between a pair are not detected locally and surface as DeadlineExceeded
//     (options.timeout) or an NCCL error.
//   * options.timeout counts from when the operation is issued (NCCL does not
//     say when it starts on the GPU); it is checked whenever the Work is
//     polled (IsCompleted / Wait, the watchdog), and when it passes the
//     communicator is aborted.
//
// Errors (through Work::Wait): as in backend.h, plus
//   Unavailable: NCCL reported an asynchronous error (ncclCommGetAsyncError;
//     e.g. a peer died or the network failed), or CUDA failed; the message has
//     NCCL's/CUDA's text. The communicator is aborted. NCCL promises nothing
//     about operations after such an error, so every Work not yet seen to
//     complete (by IsCompleted or Wait) before it was noticed reports it too.
//   DeadlineExceeded: the operation did not finish within options.timeout;
//     the communicator is aborted.
//   Aborted: Abort() was called (e.g. the worker's generation changed).
//   After any error other than InvalidArgument the group is unusable.
#ifndef SHARDLINE_WORKER_COMM_NCCL_BACKEND_H_
#define SHARDLINE_WORKER_COMM_NCCL_BACKEND_H_

#include <cstddef>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "worker/comm/backend.h"
#include "worker/comm/store.h"

namespace shardline::worker {

struct NcclOptions {
  // The GPU plugin to load; empty = GpuPlugin::DefaultPath() (next to the
  // running executable), or none when CUDA is compiled out (--config=nocuda).
  // An explicit path is loaded in every build (tests pass a fake plugin).
  std::string plugin_path;
  // CUDA device ordinal of this rank; -1 = rank % (number of devices). NCCL
  // does not allow two ranks of one communicator on the same device.
  int device = -1;
  // Deadline for each operation, from when it is issued (see above).
  absl::Duration timeout = absl::Minutes(5);
  // Deadline for bootstrapping: waiting for rank 0's unique id in the store,
  // and NCCL's non-blocking communicator init (every rank joining).
  absl::Duration connect_timeout = absl::Minutes(5);
  // For pipeline groups: one more communicator per direction between ring
  // neighbours (group ranks r and r + 1 mod size), 2 ranks each with its own
  // CUDA stream, carrying Send/Recv between them (other pairs use the main
  // communicator). Without them a send shares the group's one stream with
  // everything else, and NCCL holds a send larger than its buffers on the
  // stream until the peer receives it: 1F1B and interleaved 1F1B have
  // neighbours that each send to the other before receiving, and those
  // would wait on each other forever (worker/gpu:nccl_trainer_loopback_test
  // shows it with sends that always wait). torch's ProcessGroupNCCL makes a
  // communicator per pair of ranks for the same reason; one per direction
  // also keeps a send from holding up a receive from the same peer. Made
  // while bootstrapping (2 more communicators per rank when size is 2, 4
  // when more), pair by pair in one global order.
  bool p2p_channels = false;
};

// Creates this rank's NCCL communicator. Rank 0 makes the NCCL unique id and
// sets it under `store` (key "nccl_unique_id"); the others wait for it for up
// to connect_timeout. Blocks until every one of `size` ranks has joined, or
// connect_timeout passes. Scope groups with PrefixStore (one id per group and
// generation). Possible errors:
//   InvalidArgument: store null, size < 1, rank outside [0,size), device out
//     of range, non-positive timeouts (message names the field).
//   Unavailable: no GPU plugin (CUDA compiled out and no explicit
//     plugin_path, or libshardline_gpu.so or the CUDA/NCCL libraries
//     missing), no usable GPU, or NCCL init failed; the message says which. A caller
//     that can may fall back to Gloo on this code (the worker with --backend nccl does
//     not: its trainer keeps its state on the GPU for NCCL).
//   FailedPrecondition: the plugin was built from another tree (ABI version).
//   DeadlineExceeded: the unique id did not arrive, or some rank did not join
//     NCCL's init, within connect_timeout (the half-made communicator is
//     aborted).
//   Aborted: the store's generation ended.
absl::StatusOr<std::unique_ptr<Backend>> CreateNcclBackend(std::shared_ptr<Store> store, int rank,
                                                           int size, NcclOptions options);

// Device memory through the same plugin, for tests and the benchmark (the
// trainer owns the real buffers). Thread-safe. Errors: Unavailable (no plugin
// or no GPU; or a CUDA error, named), ResourceExhausted (out of memory).
class DeviceMemory {
 public:
  // Loads the plugin (see NcclOptions::plugin_path).
  static absl::StatusOr<DeviceMemory> Load(const std::string& plugin_path);

  // Number of CUDA devices; Unavailable (with CUDA's reason) when there are none.
  absl::StatusOr<int> DeviceCount() const;
  absl::StatusOr<void*> Alloc(int device, size_t bytes) const;
  void Free(int device, void* ptr) const;
  // Synchronous copies of `bytes` bytes.
  absl::Status CopyToDevice(int device, void* dst, const void* src, size_t bytes) const;
  absl::Status CopyToHost(int device, void* dst, const void* src, size_t bytes) const;

 private:
  explicit DeviceMemory(const void* api) : api_(api) {}
  const void* api_;  // const ShardlineGpuApi*, static storage in the plugin
};

}  // namespace shardline::worker

#endif  // SHARDLINE_WORKER_COMM_NCCL_BACKEND_H_
