// Communicators: the process groups of one assignment, built as Gloo
// backends that bootstrap through the coordinator's rendezvous store.
//
//   absl::StatusOr<std::unique_ptr<Communicators>> comms =
//       Communicators::Build(assignment, agent.rendezvous(), agent.clock(),
//                            agent.fence(), GlooOptions{});
//   absl::Status ok = (*comms)->Check();     // barrier + all_reduce on dp
//   (*comms)->Abort();                       // generation over
//
// Build creates the groups in the Assignment's order (the global creation
// order every rank shares), keeping only those that contain this rank, each
// over a CoordinatorStore scoped by the group's name in the assignment's
// generation. When the generation ends while building, the store answers
// Aborted (from the coordinator, or at once when `cancel` is cancelled) and
// Build returns it.
//
// Thread-safety: Abort() and Progress() may be called from any thread at any
// time (a directive callback, the heartbeat thread) while another thread
// runs Check() or trains; the rest is single-threaded.
#ifndef SHARDLINE_WORKER_COMMUNICATORS_H_
#define SHARDLINE_WORKER_COMMUNICATORS_H_

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "client/cancel_token.h"
#include "client/rendezvous_client.h"
#include "common/clock.h"
#include "shardline/v1/coordinator.grpc.pb.h"
#include "shardline/v1/progress.pb.h"
#include "worker/comm/backend.h"
#include "worker/comm/nccl_backend.h"

namespace shardline::worker {

class Communicators {
 public:
  struct Group {
    std::string name;  // e.g. "dp/0": also the rendezvous scope
    shardline::v1::GroupKind kind = shardline::v1::GROUP_KIND_UNSPECIFIED;
    std::vector<uint32_t> ranks;  // global ranks, ascending
    int group_rank = 0;           // index of this rank in `ranks`
    std::unique_ptr<Backend> backend;
  };

  // Possible errors: InvalidArgument for a spare assignment; Aborted when the
  // generation ended (the coordinator said so, or `cancel` was cancelled:
  // pass WorkerAgent::GenerationToken(assignment.generation()) so that the
  // agent learning of the end interrupts a rendezvous wait at once);
  // DeadlineExceeded / Unavailable from CreateGlooBackend or
  // CreateNcclBackend (the message names the group). The stores call
  // `rendezvous` and measure their timeouts on `clock` (not owned; must
  // outlive the communicators).
  //
  // Backends: Gloo (`options`), or, when `nccl` is given, NCCL for every
  // group (nccl_backend.h: buffers are device memory of nccl->device; the
  // timeouts are options.timeout / options.connect_timeout; pipeline
  // groups get their p2p channels).
  static absl::StatusOr<std::unique_ptr<Communicators>> Build(
      const shardline::v1::Assignment& assignment,
      std::shared_ptr<client::RendezvousClient> rendezvous, const Clock* clock,
      const shardline::v1::Fence& fence, GlooOptions options,
      std::shared_ptr<client::CancelToken> cancel = nullptr,
      std::optional<NcclOptions> nccl = std::nullopt);

  // A barrier on every group, then an fp32 all_reduce (sum) on this rank's dp
  // group of (global rank + 1), checked against the closed form (through a
  // buffer on the GPU with NCCL). Errors: the backend's (and, with NCCL, the
  // device memory's); Internal when the sum is wrong (names both values).
  absl::Status Check(absl::Duration timeout);

  // Aborts every group (idempotent, bounded time).
  void Abort();

  // Appends to `out->collectives` where each group's operations are
  // (Backend::Progress), in the Assignment's group order: one entry per
  // group that has issued a collective in this generation, then, for a
  // group with a send / recv in flight, one more for the oldest of those
  // (peer_rank: the peer's GLOBAL rank). Groups whose backend reports no
  // operation are skipped; at most kMaxProgressEntries entries in all (the
  // coordinator's limit, server/limits.h kMaxProgressGroups). Cheap: a lock
  // and a copy per group.
  static constexpr size_t kMaxProgressEntries = 64;
  void Progress(shardline::v1::RankProgress* out) const;

  // How each group reaches its peers (Backend::Transport), for the log:
  // "tp/0 shared memory (2 ranks on this host); dp/0 TCP (2 hosts)", a
  // group whose local ranks could not share memory with why ("... TCP (2
  // ranks on this host: <note>)"). Groups of one rank are left out; "" when
  // none is left.
  std::string TransportSummary() const;

  uint64_t generation() const { return generation_; }
  const std::vector<Group>& groups() const { return groups_; }

  // For tests of Progress and of code given a Communicators: one made of
  // ready groups (their backends already connected).
  static std::unique_ptr<Communicators> FromGroups(uint64_t generation, std::vector<Group> groups);

 private:
  uint64_t generation_ = 0;
  std::vector<Group> groups_;
  std::optional<NcclOptions> nccl_;  // the groups are NCCL's
};

}  // namespace shardline::worker

#endif  // SHARDLINE_WORKER_COMMUNICATORS_H_
