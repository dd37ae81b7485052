// The C ABI between shardline-worker and its GPU plugin
// (libshardline_gpu.so). Everything that links CUDA or NCCL lives in the
// plugin; the worker dlopen()s it at run time, so one worker binary runs on
// machines with and without CUDA and falls back to Gloo when the plugin or a
// GPU is missing (docs/ARCHITECTURE.md, docs/BUILDING.md).
//
// Plain C types only, so the two sides may come from different compilers.
// Bump SHARDLINE_GPU_ABI_VERSION on any change to these structs or symbols.
//
// Three entry points: shardline_gpu_probe (versions and devices; also how the
// loader checks the ABI version), shardline_gpu_api (the NCCL communicator,
// collective, event and device-memory functions below) and, optionally,
// shardline_gpu_train_api (the trainer's fp32 math on device buffers: cuBLAS
// and the plugin's own CUDA kernels; the fake plugin has none).
//
// ABI history: 2 = probe + NCCL table; 3 = adds shardline_gpu_train_api;
// 8 = stream ordering between a training context and the communicators
// (train_stream, comm_order_after_stream, stream_wait_event) and the
// gradient norm in one read-back (masked_sum_squares_many).
#ifndef SHARDLINE_WORKER_GPU_PLUGIN_ABI_H_
#define SHARDLINE_WORKER_GPU_PLUGIN_ABI_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define SHARDLINE_GPU_ABI_VERSION 8
#define SHARDLINE_GPU_MAX_DEVICES 64

typedef struct {
  int32_t index;                 // CUDA device ordinal
  char name[256];                // NUL-terminated, e.g. "NVIDIA H200"
  uint64_t total_memory_bytes;   // device memory, bytes
  int32_t compute_capability_major;
  int32_t compute_capability_minor;
} ShardlineGpuDevice;

typedef struct {
  int32_t abi_version;           // SHARDLINE_GPU_ABI_VERSION of the plugin
  int32_t cuda_runtime_version;  // e.g. 13000 for CUDA 13.0 (cudaRuntimeGetVersion)
  int32_t cuda_driver_version;   // 0 when no driver is installed
  int32_t nccl_version;          // ncclGetVersion, e.g. 22805 for 2.28.5
  int32_t device_count;          // devices filled in `devices` (<= max)
  ShardlineGpuDevice devices[SHARDLINE_GPU_MAX_DEVICES];
} ShardlineGpuInfo;

// Status codes returned by plugin functions: the numbers of the
// absl::StatusCode of the same name, so the worker converts them 1:1.
#define SHARDLINE_GPU_OK 0
#define SHARDLINE_GPU_INVALID_ARGUMENT 3
#define SHARDLINE_GPU_DEADLINE_EXCEEDED 4
#define SHARDLINE_GPU_RESOURCE_EXHAUSTED 8
#define SHARDLINE_GPU_FAILED_PRECONDITION 9
#define SHARDLINE_GPU_ABORTED 10
#define SHARDLINE_GPU_INTERNAL 13
#define SHARDLINE_GPU_UNAVAILABLE 14

// Fills `info`. Versions are filled even when no GPU is usable; then it
// returns SHARDLINE_GPU_UNAVAILABLE with the CUDA error text in `error`
// (NUL-terminated, at most error_len bytes). Thread-safe.
typedef int (*ShardlineGpuProbeFn)(ShardlineGpuInfo* info, char* error, size_t error_len);
#define SHARDLINE_GPU_PROBE_SYMBOL "shardline_gpu_probe"

// ---------------------------------------------------------------------------
// NCCL communicators, collectives and device memory.
//
// Conventions for every function below:
//   * Returns one of the codes above. On failure, `error` receives a
//     NUL-terminated message of at most error_len bytes naming the NCCL/CUDA
//     call and its error text (ncclGetErrorString + ncclGetLastError).
//   * Counts are ELEMENTS of `dtype`, never bytes. Buffers are DEVICE pointers
//     on the communicator's device (cudaMalloc'ed, or managed memory).
//   * A collective returns once it is enqueued on the communicator's own CUDA
//     stream (one stream per communicator, so operations run in issue order)
//     and gives back an event recorded after it; poll the event with
//     event_query and the communicator with comm_status. Waiting for the
//     enqueue itself (NCCL's non-blocking mode may return ncclInProgress) is
//     bounded by `timeout_ms`; past it the call returns DEADLINE_EXCEEDED.
//   * Calls on one communicator are serialised by the plugin (thread-safe);
//     comm_abort may be called from any thread at any time and makes a
//     concurrent call on the same communicator return ABORTED promptly.
// ---------------------------------------------------------------------------

#define SHARDLINE_NCCL_UNIQUE_ID_BYTES 128  // == NCCL_UNIQUE_ID_BYTES

// Element types (values are this ABI's, not NCCL's).
#define SHARDLINE_GPU_FLOAT32 0
#define SHARDLINE_GPU_FLOAT16 1
#define SHARDLINE_GPU_BFLOAT16 2

// Reduction ops (values are this ABI's, not NCCL's). AVG is ncclAvg.
#define SHARDLINE_GPU_SUM 0
#define SHARDLINE_GPU_AVG 1
#define SHARDLINE_GPU_MAX 2
#define SHARDLINE_GPU_MIN 3

typedef struct ShardlineNcclComm ShardlineNcclComm;  // opaque: ncclComm_t + stream + device
typedef struct ShardlineGpuEvent ShardlineGpuEvent;  // opaque: cudaEvent_t + device

typedef struct {
  int32_t abi_version;  // SHARDLINE_GPU_ABI_VERSION

  // Number of CUDA devices (0 on a machine without one: then returns
  // UNAVAILABLE with the CUDA error text).
  int (*device_count)(int32_t* count, char* error, size_t error_len);

  // ncclGetUniqueId: the 128 bytes rank 0 hands to every rank out of band
  // (through the coordinator's store). Also starts NCCL's bootstrap listener.
  int (*get_unique_id)(uint8_t id[SHARDLINE_NCCL_UNIQUE_ID_BYTES], char* error, size_t error_len);

  // Creates this rank's communicator on CUDA device `device`:
  // ncclCommInitRankConfig with config.blocking = 0, then polls
  // ncclCommGetAsyncError until ncclSuccess, an error, or `timeout_ms`.
  // Errors: DEADLINE_EXCEEDED (some rank did not join in time; the half-made
  // communicator is aborted), INVALID_ARGUMENT (bad rank/size/device),
  // UNAVAILABLE (NCCL or CUDA failed; text in `error`).
  int (*comm_init)(const uint8_t id[SHARDLINE_NCCL_UNIQUE_ID_BYTES], int32_t nranks,
                   int32_t rank, int32_t device, int64_t timeout_ms, ShardlineNcclComm** comm,
                   char* error, size_t error_len);

  // The communicator's asynchronous state (ncclCommGetAsyncError): OK while
  // healthy (also while an operation is in progress), UNAVAILABLE with NCCL's
  // text after an asynchronous error (e.g. a peer's connection broke),
  // ABORTED after comm_abort. Never blocks on the network.
  int (*comm_status)(ShardlineNcclComm* comm, char* error, size_t error_len);

  // ncclCommAbort: stops the communicator's kernels and frees its NCCL
  // resources; returns in bounded time even if peers are dead. Idempotent.
  // The handle stays valid (every later call returns ABORTED) until
  // comm_destroy.
  void (*comm_abort)(ShardlineNcclComm* comm);

  // Aborts if still live, then frees the stream and the handle.
  void (*comm_destroy)(ShardlineNcclComm* comm);

  // Collectives; `*event` is set on OK and must be freed with event_destroy.
  //   all_reduce: in place, data[0..count).
  int (*all_reduce)(ShardlineNcclComm* comm, void* data, size_t count, int32_t dtype, int32_t op,
                    int64_t timeout_ms, ShardlineGpuEvent** event, char* error, size_t error_len);
  //   all_gather: out holds nranks*count; in may be out + rank*count.
  int (*all_gather)(ShardlineNcclComm* comm, const void* in, size_t count, void* out,
                    int32_t dtype, int64_t timeout_ms, ShardlineGpuEvent** event, char* error,
                    size_t error_len);
  //   reduce_scatter: `in` holds nranks pieces, piece r of counts[r]; out
  //   receives piece `rank` reduced. Equal counts: one ncclReduceScatter.
  //   Uneven counts: one ncclReduce per piece (root = that piece's rank) in
  //   one ncclGroupStart/End, no scratch memory; slower than the equal case.
  int (*reduce_scatter)(ShardlineNcclComm* comm, const void* in, void* out, const size_t* counts,
                        int32_t dtype, int32_t op, int64_t timeout_ms, ShardlineGpuEvent** event,
                        char* error, size_t error_len);
  //   all_to_all: ncclSend/ncclRecv per peer (pieces of 0 are skipped) in one
  //   group; in and out must not overlap.
  int (*all_to_all)(ShardlineNcclComm* comm, const void* in, const size_t* send_counts, void* out,
                    const size_t* recv_counts, int32_t dtype, int64_t timeout_ms,
                    ShardlineGpuEvent** event, char* error, size_t error_len);
  //   broadcast: in place from `root`.
  int (*broadcast)(ShardlineNcclComm* comm, void* data, size_t count, int32_t dtype, int32_t root,
                   int64_t timeout_ms, ShardlineGpuEvent** event, char* error, size_t error_len);
  //   send / recv: matched in issue order per peer (NCCL has no tags).
  int (*send)(ShardlineNcclComm* comm, const void* data, size_t count, int32_t dtype, int32_t peer,
              int64_t timeout_ms, ShardlineGpuEvent** event, char* error, size_t error_len);
  int (*recv)(ShardlineNcclComm* comm, void* data, size_t count, int32_t dtype, int32_t peer,
              int64_t timeout_ms, ShardlineGpuEvent** event, char* error, size_t error_len);
  //   barrier: an all_reduce of one float in a scratch buffer the plugin owns.
  int (*barrier)(ShardlineNcclComm* comm, int64_t timeout_ms, ShardlineGpuEvent** event,
                 char* error, size_t error_len);

  // cudaEventQuery: sets *done to 1 once the operation finished on the GPU,
  // 0 while pending. UNAVAILABLE on a CUDA error (the device is unusable).
  int (*event_query)(ShardlineGpuEvent* event, int32_t* done, char* error, size_t error_len);
  void (*event_destroy)(ShardlineGpuEvent* event);

  // Device memory, for tests and the benchmark (the trainer owns the real
  // buffers). Copies are synchronous.
  int (*device_alloc)(int32_t device, size_t bytes, void** ptr, char* error, size_t error_len);
  void (*device_free)(int32_t device, void* ptr);
  int (*copy_to_device)(int32_t device, void* dst, const void* src, size_t bytes, char* error,
                        size_t error_len);
  int (*copy_to_host)(int32_t device, void* dst, const void* src, size_t bytes, char* error,
                      size_t error_len);

  // Stream ordering against another CUDA stream of this process (`stream`
  // is a cudaStream_t, e.g. a training context's: train_stream), so that
  // neither side's host waits for the other:
  //   comm_order_after_stream: operations enqueued on `comm` from now on
  //   start after everything enqueued on `stream` so far (cudaEventRecord on
  //   `stream`, cudaStreamWaitEvent on the communicator's stream). Serialised
  //   with the communicator's other calls; ABORTED after comm_abort.
  int (*comm_order_after_stream)(ShardlineNcclComm* comm, void* stream, char* error,
                                 size_t error_len);
  //   stream_wait_event: work enqueued on `stream` from now on starts after
  //   `event`'s operation (cudaStreamWaitEvent); returns at once. An operation
  //   that never finishes holds `stream` until its communicator is aborted
  //   (comm_abort stops the kernels, and the event then fires), so the
  //   caller must watch such operations (the worker's NcclBackend does). The
  //   fake plugin, whose "streams" run on the host as they are enqueued,
  //   blocks here instead until the event fires.
  int (*stream_wait_event)(void* stream, ShardlineGpuEvent* event, char* error,
                           size_t error_len);
} ShardlineGpuApi;

// Returns the plugin's function table (static storage, never null).
typedef const ShardlineGpuApi* (*ShardlineGpuApiFn)(void);
#define SHARDLINE_GPU_API_SYMBOL "shardline_gpu_api"

// ---------------------------------------------------------------------------
// Training math: device versions of every kernel of worker/train/ops.h, with
// the same contracts (read that header), on DEVICE buffers.
//
// Conventions for every function below:
//   * A context (train_ctx_create) owns one CUDA stream on one device, a
//     cuBLAS handle bound to it, and a scratch buffer. Every kernel is
//     enqueued on that stream and returns once enqueued: kernels of one
//     context run in issue order, and host-visible results need
//     train_synchronize or a copy_to_host (which waits for the stream).
//   * Returns one of the codes above. On failure the message (naming the
//     CUDA/cuBLAS call and its error text) is kept in the context; read it
//     with train_last_error. Launch errors are reported by the call itself;
//     errors while a kernel runs surface at the next synchronising call.
//   * Sizes are ELEMENTS (int64_t); byte counts are size_t and named bytes.
//     Matrix dimensions of one cuBLAS call must fit in int32
//     (INVALID_ARGUMENT otherwise).
//   * Parameter gradients accumulate (+=), activation gradients are
//     overwritten, exactly as in ops.h. Products use fp32 cuBLAS with
//     CUBLAS_DEFAULT_MATH (no TF32); reductions of the plugin's own kernels
//     accumulate in double like the CPU kernels. Atomic scatters
//     (embedding_backward) are not bit-deterministic.
//   * A context is not thread-safe: one thread at a time per context.
// ---------------------------------------------------------------------------

typedef struct ShardlineGpuTrainCtx ShardlineGpuTrainCtx;  // opaque: stream + cuBLAS handle
// A point on a context's copy stream (host_copies_record).
typedef struct ShardlineGpuHostCopies ShardlineGpuHostCopies;  // opaque: cudaEvent_t + device

// AdamW's per-step constants (worker/train/adamw.h AdamWScalars, same
// fields, same meaning), computed by the caller.
typedef struct {
  float step_size, inv_sqrt_bc2, b1, b2, one_minus_b1, one_minus_b2, eps, decay;
} ShardlineAdamWScalars;

typedef struct {
  int32_t abi_version;  // SHARDLINE_GPU_ABI_VERSION

  // Creates a context on CUDA device `device`. UNAVAILABLE without a usable
  // device (the CUDA error text is in `error`), INVALID_ARGUMENT for a bad
  // ordinal.
  int (*train_ctx_create)(int32_t device, ShardlineGpuTrainCtx** ctx, char* error,
                          size_t error_len);
  // Waits for the stream, then frees everything the context owns.
  void (*train_ctx_destroy)(ShardlineGpuTrainCtx* ctx);
  // The message of the last failed call on `ctx` ("" if none). Valid until
  // the next call on `ctx`.
  const char* (*train_last_error)(const ShardlineGpuTrainCtx* ctx);

  // Device memory on the context's device. alloc/free are synchronous
  // (cudaMalloc/cudaFree); copies are enqueued on the stream and waited for,
  // so they are ordered after earlier kernels and return with the data in
  // place. zero is enqueued (cudaMemsetAsync).
  int (*train_alloc)(ShardlineGpuTrainCtx* ctx, size_t bytes, void** ptr);
  void (*train_free)(ShardlineGpuTrainCtx* ctx, void* ptr);
  int (*train_copy_to_device)(ShardlineGpuTrainCtx* ctx, void* dst, const void* src,
                              size_t bytes);
  int (*train_copy_to_host)(ShardlineGpuTrainCtx* ctx, void* dst, const void* src,
                            size_t bytes);
  int (*train_zero)(ShardlineGpuTrainCtx* ctx, void* ptr, size_t bytes);
  // cudaStreamSynchronize: returns the first error of an enqueued kernel.
  int (*train_synchronize)(ShardlineGpuTrainCtx* ctx);

  // ops.h, one for one (bool arguments are int32_t 0/1).
  int (*gemm)(ShardlineGpuTrainCtx* ctx, int32_t trans_a, int32_t trans_b, int64_t m, int64_t n,
              int64_t k, float alpha, const float* a, const float* b, float beta, float* c);
  int (*linear_forward)(ShardlineGpuTrainCtx* ctx, const float* x, const float* w,
                        const float* b, float* y, int64_t rows, int64_t in, int64_t out);
  int (*linear_backward)(ShardlineGpuTrainCtx* ctx, const float* x, const float* w,
                         const float* dy, float* dx, float* dw, float* db, int64_t rows,
                         int64_t in, int64_t out);
  int (*layer_norm_forward)(ShardlineGpuTrainCtx* ctx, const float* x, const float* gamma,
                            const float* beta, float* y, float* mean, float* rstd, int64_t rows,
                            int64_t width);
  int (*layer_norm_backward)(ShardlineGpuTrainCtx* ctx, const float* x, const float* gamma,
                             const float* mean, const float* rstd, const float* dy, float* dx,
                             float* dgamma, float* dbeta, int64_t rows, int64_t width);
  int (*gelu_forward)(ShardlineGpuTrainCtx* ctx, const float* x, float* y, int64_t n);
  int (*gelu_backward)(ShardlineGpuTrainCtx* ctx, const float* x, const float* dy, float* dx,
                       int64_t n);
  // Backward uses the context's scratch (batch*heads*seq*seq floats, grown
  // on demand, which synchronises the device once). bf16 != 0: ops.h's bf16
  // attention (probabilities and score gradients rounded to bf16, every
  // product on the bf16 tensor cores with fp32 accumulation,
  // CUBLAS_COMPUTE_32F_FAST_16BF); 0: fp32 products, no TF32.
  int (*attention_forward)(ShardlineGpuTrainCtx* ctx, const float* qkv, float* probs, float* y,
                           int64_t batch, int64_t seq, int64_t heads, int64_t head_dim,
                           int32_t bf16);
  int (*attention_backward)(ShardlineGpuTrainCtx* ctx, const float* qkv, const float* probs,
                            const float* dy, float* dqkv, int64_t batch, int64_t seq,
                            int64_t heads, int64_t head_dim, int32_t bf16);
  int (*embedding_forward)(ShardlineGpuTrainCtx* ctx, const int32_t* tokens, const float* table,
                           float* y, int64_t rows, int64_t width, int64_t vocab_begin,
                           int64_t vocab_local);
  int (*embedding_backward)(ShardlineGpuTrainCtx* ctx, const int32_t* tokens, const float* dy,
                            float* dtable, int64_t rows, int64_t width, int64_t vocab_begin,
                            int64_t vocab_local);
  int (*add_position_forward)(ShardlineGpuTrainCtx* ctx, const float* pos_table, float* y,
                              int64_t rows, int64_t seq, int64_t width);
  int (*add_position_backward)(ShardlineGpuTrainCtx* ctx, const float* dy, float* dpos,
                               int64_t rows, int64_t seq, int64_t width);
  int (*local_row_max)(ShardlineGpuTrainCtx* ctx, const float* logits, float* row_max,
                       int64_t rows, int64_t vocab_local);
  int (*local_sum_exp_and_target)(ShardlineGpuTrainCtx* ctx, const float* logits,
                                  const float* row_max, const int32_t* targets, float* sum_exp,
                                  float* target_logit, int64_t rows, int64_t vocab_begin,
                                  int64_t vocab_local);
  int (*token_loss)(ShardlineGpuTrainCtx* ctx, const float* row_max, const float* sum_exp,
                    const float* target_logit, float* loss, int64_t rows);
  int (*cross_entropy_backward)(ShardlineGpuTrainCtx* ctx, const float* logits,
                                const float* row_max, const float* sum_exp,
                                const int32_t* targets, float scale, float* dlogits,
                                int64_t rows, int64_t vocab_begin, int64_t vocab_local);
  int (*add_in_place)(ShardlineGpuTrainCtx* ctx, const float* x, float* y, int64_t n);

  // The optimizer's state on the device (worker/train/device.h):
  //   copy: dst = src, bytes, device to device, enqueued (no overlap).
  int (*copy_device)(ShardlineGpuTrainCtx* ctx, void* dst, const void* src, size_t bytes);
  //   scale: x[i] *= alpha.
  int (*scale)(ShardlineGpuTrainCtx* ctx, float* x, float alpha, int64_t n);
  //   adamw_step: adamw.h's per-element update with the caller's constants;
  //   decay_mask (n bytes, device) may be null (every element decays).
  int (*adamw_step)(ShardlineGpuTrainCtx* ctx, const ShardlineAdamWScalars* scalars, float* param,
                    const float* grad, float* exp_avg, float* exp_avg_sq,
                    const uint8_t* decay_mask, int64_t n);
  //   masked_sum_squares: *sum (HOST) += sum of x[i]^2 where mask[i] != 0,
  //   in double (per-block partial sums, then added in block order on the
  //   host). Waits for the stream.
  int (*masked_sum_squares)(ShardlineGpuTrainCtx* ctx, const float* x, const uint8_t* mask,
                            int64_t n, double* sum);
  // round_bf16: x[i] rounded to the nearest bfloat16 (ties to even, NaN kept
  // NaN: worker/comm/float16.h's rule), stored as fp32, in place.
  int (*round_bf16)(ShardlineGpuTrainCtx* ctx, float* x, int64_t n);
  // set_bf16_products: from now on gemm, linear_forward and linear_backward
  // (attention has its own bf16 argument) read their inputs as bf16 and run on the bf16 tensor
  // cores with fp32 accumulation (cublasGemmEx, CUBLAS_COMPUTE_32F_FAST_16BF);
  // the caller hands in bf16-exact operands (worker/train/bf16_device.h:
  // activations are bf16 outputs, weights rounded copies), so the result is
  // the fp32 product's up to summation order whatever cuBLAS's conversion.
  // 0 turns it off (the default: fp32 products, no TF32).
  int (*set_bf16_products)(ShardlineGpuTrainCtx* ctx, int32_t on);
  // host_alloc: `bytes` of page-locked host memory (cudaHostAlloc), which
  // copies to and from the device read and write directly; host_free frees
  // it (cudaFreeHost; synchronous). For the trainer's checkpoint copies.
  int (*host_alloc)(ShardlineGpuTrainCtx* ctx, size_t bytes, void** ptr);
  void (*host_free)(ShardlineGpuTrainCtx* ctx, void* ptr);

  // Device -> host copies beside the math (the trainer's checkpoint copies,
  // worker/train/device.h CopyToHostAsync):
  //   copy_to_host_async: enqueues dst (host, host_alloc memory) = src
  //   (device), `bytes`, on the context's copy stream (a second stream, made
  //   at first use), after everything enqueued on the context's stream so
  //   far (cudaEventRecord + cudaStreamWaitEvent); returns once enqueued.
  int (*copy_to_host_async)(ShardlineGpuTrainCtx* ctx, void* dst, const void* src,
                            size_t bytes);
  //   host_copies_record: *copies = an event recorded on the copy stream
  //   after every copy_to_host_async so far (done at once if there was
  //   none); free it with host_copies_destroy.
  int (*host_copies_record)(ShardlineGpuTrainCtx* ctx, ShardlineGpuHostCopies** copies);
  //   host_copies_wait: blocks until those copies are done
  //   (cudaEventSynchronize); the error text goes to `error`. Unlike every
  //   other function of this table it may run on any thread while another
  //   uses the context: it touches only the event.
  int (*host_copies_wait)(ShardlineGpuHostCopies* copies, char* error, size_t error_len);
  void (*host_copies_destroy)(ShardlineGpuHostCopies* copies);
  //   order_after_host_copies: what is enqueued on the context's stream from
  //   now on runs after every copy_to_host_async so far has finished
  //   (cudaStreamWaitEvent); the host does not wait.
  int (*order_after_host_copies)(ShardlineGpuTrainCtx* ctx);

  // ops.h's BiasGeluForward / BiasGeluBackward (one kernel each: the bias
  // add, and with bf16 != 0 the bf16 rounding of pre, y and dx, inside).
  int (*bias_gelu_forward)(ShardlineGpuTrainCtx* ctx, const float* x, const float* b, float* y,
                           int64_t rows, int64_t width, int32_t bf16);
  int (*bias_gelu_backward)(ShardlineGpuTrainCtx* ctx, const float* x, const float* b,
                            const float* dy, float* dx, int64_t rows, int64_t width,
                            int32_t bf16);

  // The context's stream (a cudaStream_t), for the NCCL table's stream
  // ordering (comm_order_after_stream, stream_wait_event). Valid until
  // train_ctx_destroy; never null on OK.
  int (*train_stream)(ShardlineGpuTrainCtx* ctx, void** stream);
  // masked_sum_squares over `pieces` pieces in order (x[i], mask[i]: n[i]
  // elements and bytes on the device; the three arrays are HOST memory):
  // *sum (HOST) gets exactly what one masked_sum_squares call per piece
  // would add, with one wait for the stream instead of one per piece.
  int (*masked_sum_squares_many)(ShardlineGpuTrainCtx* ctx, int64_t pieces,
                                 const float* const* x, const uint8_t* const* mask,
                                 const int64_t* n, double* sum);
} ShardlineGpuTrainApi;

// Returns the plugin's training table (static storage, never null). Optional:
// a plugin without this symbol has no GPU math (GpuPlugin::train_api() is
// then null).
typedef const ShardlineGpuTrainApi* (*ShardlineGpuTrainApiFn)(void);
#define SHARDLINE_GPU_TRAIN_API_SYMBOL "shardline_gpu_train_api"

#ifdef __cplusplus
}  // extern "C"
#endif

#endif  // SHARDLINE_WORKER_GPU_PLUGIN_ABI_H_
