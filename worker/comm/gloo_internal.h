// Internals of the Gloo backend (gloo_backend.cc), apart so that file stays
// readable: our Store as Gloo's rendezvous store, the names Gloo gives peers
// in its error messages, and the fp32 reduction and 16-bit conversion
// helpers. Only gloo_backend.cc includes this.
//
// Thread-safety: StoreAdapter is used by one bootstrapping thread; the
// functions are thread-safe.
#ifndef SHARDLINE_WORKER_COMM_GLOO_INTERNAL_H_
#define SHARDLINE_WORKER_COMM_GLOO_INTERNAL_H_

#include <sys/socket.h>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/time/time.h"
#include "gloo/rendezvous/context.h"
#include "gloo/rendezvous/store.h"
#include "worker/comm/backend.h"
#include "worker/comm/store.h"

namespace shardline::worker::gloo_internal {

// `d` in milliseconds, at least 1 (Gloo treats 0 as no timeout).
inline std::chrono::milliseconds ToMs(absl::Duration d) {
  return std::chrono::milliseconds(std::max<int64_t>(1, absl::ToInt64Milliseconds(d)));
}

// Thrown by StoreAdapter so that a store failure unwinds out of Gloo's
// connectFullMesh; caught in CreateGlooBackend and turned back into a status.
struct StoreError : public std::exception {
  explicit StoreError(absl::Status s) : status(std::move(s)) {}
  const char* what() const noexcept override { return "store error"; }
  absl::Status status;
};

// Our Store as seen by Gloo's rendezvous. Every blocking call is bounded by
// the connect timeout.
class StoreAdapter : public gloo::rendezvous::Store {
 public:
  StoreAdapter(std::shared_ptr<worker::Store> store, absl::Duration timeout)
      : store_(std::move(store)), timeout_(timeout) {}

  void set(const std::string& key, const std::vector<char>& data) override {
    absl::Status s = store_->Set(key, std::string(data.begin(), data.end()));
    if (!s.ok()) throw StoreError(s);
  }
  std::vector<char> get(const std::string& key) override {
    absl::StatusOr<std::string> v = store_->Get(key, timeout_);
    if (!v.ok()) throw StoreError(v.status());
    seen_[key] = *v;
    return std::vector<char>(v->begin(), v->end());
  }
  void wait(const std::vector<std::string>& keys) override { wait(keys, ToMs(timeout_)); }
  void wait(const std::vector<std::string>& keys,
            const std::chrono::milliseconds& timeout) override {
    absl::Duration t = std::min(timeout_, absl::Milliseconds(timeout.count()));
    absl::Status s = store_->Wait(keys, t);
    if (!s.ok()) throw StoreError(s);
  }

 public:
  // Values read during rendezvous, by key (only read on the bootstrapping
  // thread). Used to learn which TCP port belongs to which peer rank.
  const absl::flat_hash_map<std::string, std::string>& seen() const { return seen_; }

 private:
  std::shared_ptr<worker::Store> store_;
  absl::Duration timeout_;
  absl::flat_hash_map<std::string, std::string> seen_;
};

// Names Gloo gives the remote end of each pair in its IoException messages
// ("Read error [127.0.0.1]:41234: ..."), formatted by Gloo's own
// tcp::Address::str() so they match its messages exactly. Where this rank
// connected to the peer, Gloo names the peer's pair listener, published in
// the store under key "<peer rank>" as one tcp::Address::Impl (starting with
// a sockaddr_storage) per pair (NamesInAddressBlob); where this rank accepted
// the connection, Gloo names the peer's ephemeral port, which only the
// kernel's socket table (/proc/self/net/tcp{,6}) relates to our listener's
// port (EstablishedSockets).
std::string GlooName(const sockaddr_storage& ss);
std::vector<std::string> NamesInAddressBlob(const std::string& blob, int size);

struct KernelSocket {
  uint16_t local_port;  // host order
  sockaddr_storage remote;
};
// This process's ESTABLISHED TCP sockets, IPv4 and IPv6.
std::vector<KernelSocket> EstablishedSockets();

// Appends to (*names)[to_group_rank(r)] the names Gloo's errors may give
// each peer r of `context` (bootstrapped through `adapter`): the two kinds
// above. `to_group_rank` maps a rank of `context` to the group's rank (the
// identity for the group's own context; the host leader's rank for the
// leaders' context).
void AddPeerNames(gloo::rendezvous::Context& context, const StoreAdapter& adapter,
                  const std::function<int(int)>& to_group_rank,
                  std::vector<std::vector<std::string>>* names);

// True if `msg` contains `needle` ("[ip]:port") not followed by another digit.
bool Mentions(const std::string& msg, const std::string& needle);

// Element-wise fp32 reduction for Gloo's allreduce: c[i] = op(a[i], b[i])
// over n elements (kAvg sums; the caller divides).
using ReduceFn = std::function<void(void*, const void*, const void*, size_t)>;
ReduceFn Fp32Reducer(ReduceOp op);

// n elements of `dtype` (fp32, fp16 or bf16) to fp32 and back (round to
// nearest even); FromFloat32 may write in place over `in`.
void ToFloat32(const void* in, DType dtype, size_t n, float* out);
void FromFloat32(const float* in, size_t n, DType dtype, void* out);

}  // namespace shardline::worker::gloo_internal

#endif  // SHARDLINE_WORKER_COMM_GLOO_INTERNAL_H_
