// Send and recv of the Gloo backend (see PostPointToPoint in gloo_state.h).
//
// Send / recv are posted from the calling thread (see backend.h). Each side
// first sends its descriptor of the call (gloo_checks::CallDesc, fixed
// size) on its direction's slot and posts the receive of the peer's; one
// short-lived thread per operation waits for the peer's descriptor,
// compares (a mismatch fails both sides with the same message and moves no
// payload, so no receive smaller than its message is ever posted), then
// posts the payload in this (peer, tag, direction)'s call order and waits
// for it, all within the op timeout (Abort closes the sockets, which ends
// the waits).
//
// Cost: the descriptors cross first (one message each way, in parallel), and
// the receiver posts its payload receive only once the sender's descriptor
// has arrived, so a send / recv takes about one more round trip than the
// payload alone (tens of microseconds on loopback; nothing next to a large
// payload's transfer).
#include <algorithm>
#include <exception>
#include <memory>
#include <string>
#include <thread>
#include <tuple>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "gloo/transport/unbound_buffer.h"
#include "worker/comm/gloo_checks.h"
#include "worker/comm/gloo_internal.h"
#include "worker/comm/gloo_state.h"

namespace shardline::worker::gloo_internal {

using gloo_checks::CallDesc;

std::shared_ptr<Work> PostPointToPoint(const std::shared_ptr<State>& st, void* data, size_t count,
                                       DType dtype, int peer, uint32_t tag, bool send) {
  const char* op = send ? "send" : "recv";
  auto work = std::make_shared<WorkImpl>();
  const std::tuple<int, uint32_t, bool> key(peer, tag, send);
  uint64_t number = 0, ticket = 0;
  {
    absl::MutexLock lock(&st->mu);
    if (st->aborted) return Done(absl::AbortedError("backend was aborted"));
    if (!st->sticky.ok()) return Done(st->sticky);
    number = ++st->p2p_issued;
    ticket = st->p2p_order[key].first++;
    OpProgress p;
    p.operation = op;
    p.sequence = number;
    p.count = count;
    p.dtype = dtype;
    p.in_flight = true;
    p.peer = peer;
    st->p2p_in_flight[number] = {std::move(p), absl::Now()};
  }
  const std::string what = absl::StrCat(op, " (peer=", peer, ", tag=", tag, ")");
  struct Pending {
    CallDesc mine, theirs;
    std::unique_ptr<gloo::transport::UnboundBuffer> out, in, payload;
  };
  auto pending = std::make_shared<Pending>();
  pending->mine = gloo_checks::PointToPoint(send, count, dtype, tag);
  const absl::Time deadline = absl::Now() + st->options.timeout;
  absl::Status posted;
  try {
    pending->in = st->context->createUnboundBuffer(&pending->theirs, sizeof(CallDesc));
    pending->out = st->context->createUnboundBuffer(&pending->mine, sizeof(CallDesc));
    pending->in->recv(peer, (send ? kP2PRecvDescSlotPrefix : kP2PSendDescSlotPrefix) | tag);
    pending->out->send(peer, (send ? kP2PSendDescSlotPrefix : kP2PRecvDescSlotPrefix) | tag);
  } catch (...) {
    posted = st->MapException(what);
  }
  std::thread([st, work, what, send, data, count, dtype, peer, tag, key, ticket, number,
               deadline, pending, posted]() {
    absl::Status s = posted;
    auto left = [&] { return ToMs(std::max(deadline - absl::Now(), absl::Milliseconds(1))); };
    try {
      if (s.ok()) {
        pending->in->waitRecv(left());
        pending->out->waitSend(left());
      }
    } catch (...) {
      s = st->MapException(what);
    }
    if (s.ok()) s = gloo_checks::CompareP2P(pending->mine, pending->theirs, st->rank, peer, st->names);
    const size_t bytes = count * ElementSize(dtype);
    std::exception_ptr error;
    {
      // This (peer, tag, direction)'s payloads are posted in call order.
      absl::MutexLock lock(&st->mu);
      auto my_turn = [&]() ABSL_SHARED_LOCKS_REQUIRED(st->mu) {
        return st->p2p_order[key].second == ticket;
      };
      st->mu.Await(absl::Condition(&my_turn));
      if (s.ok() && st->aborted) s = absl::AbortedError("backend was aborted");
      if (s.ok() && bytes > 0) {
        try {
          pending->payload = st->context->createUnboundBuffer(data, bytes);
          if (send) {
            pending->payload->send(peer, kP2PSlotPrefix | tag);
          } else {
            pending->payload->recv(peer, kP2PSlotPrefix | tag);
          }
        } catch (...) {
          error = std::current_exception();
        }
      }
      auto& order = st->p2p_order[key];
      if (++order.second == order.first) st->p2p_order.erase(key);
    }
    try {
      if (error) std::rethrow_exception(error);
      if (s.ok() && pending->payload != nullptr) {
        if (send) {
          pending->payload->waitSend(left());
        } else {
          pending->payload->waitRecv(left());
        }
      }
    } catch (...) {
      s = st->MapException(what);
    }
    if (!s.ok()) st->RecordFailure(s);
    {
      absl::MutexLock lock(&st->mu);
      // A failed send / recv stays in flight, as a failed collective does
      // (gloo_backend.cc State::Loop).
      if (s.ok() || absl::IsInvalidArgument(s)) st->p2p_in_flight.erase(number);
      if (st->aborted && !s.ok() && !absl::IsAborted(s))
        s = absl::AbortedError(absl::StrCat("backend was aborted: ", s.message()));
    }
    work->Complete(std::move(s));
  }).detach();
  {
    absl::MutexLock lock(&st->mu);
    // Drop handles of completed operations so the list stays short.
    auto& list = st->p2p_pending;
    list.erase(std::remove_if(list.begin(), list.end(),
                              [](const std::weak_ptr<WorkImpl>& w) {
                                auto p = w.lock();
                                return p == nullptr || p->IsCompleted();
                              }),
               list.end());
    list.push_back(work);
    // An Abort since the check above did not see this operation.
    if (st->aborted) work->Complete(absl::AbortedError("backend was aborted during the operation"));
  }
  return work;
}

}  // namespace shardline::worker::gloo_internal
