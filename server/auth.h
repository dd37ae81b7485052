// Bearer-token authentication and authorization for the coordinator API
// (coordinator.proto "Authentication"). No gRPC in here: the adapter passes
// the values of the "authorization" metadata key, the peer's address, the
// job the call is for and, for a worker's calls, the identity it acts as.
//
//   FakeClock clock;  // RealClock in the server
//   Authenticator auth("an-admin-token-of-16+-bytes", &clock);
//   auth.SetJobToken("j1", Sha256Hex(job_token));                 // CreateJob
//   auth.SetMemberToken({"j1", "w0", 7}, Sha256Hex(member_token)); // JoinJob
//   absl::StatusOr<Principal> who =
//       auth.Authorize(metadata_values, Access::kMember, "j1", "10.0.0.5", &identity);
//
// Three kinds of token:
//   * the admin token (configured at start): every RPC of every job;
//   * a job's worker token ("job token", returned by CreateJob): JoinJob of
//     its job, and the read-only calls of its job (Access::kJobRead);
//   * a member token (returned by JoinJob to a new incarnation): its job's
//     reads, JoinJob and every call that acts (Access::kMember), but only as
//     the incarnation it was issued to (job_id, worker_id, incarnation).
// A coordinator configured without an admin token accepts every call and
// ignores the metadata (local tests only).
//
// Lookup: the Authenticator keeps an index of credentials keyed by the
// SHA-256 of the token (hex), which the coordinator fills (Coordinator::
// UseCredentials). A call costs one SHA-256 and one hash-map lookup under the
// Authenticator's own mutex, whatever the number of jobs; it never calls the
// coordinator. The admin token is compared in constant time; worker and
// member tokens are found by their hash, so lookup timing can reveal at most
// something about a hash, never about a token. Only hashes are kept.
//
// Failed authentications are rate-limited per peer host (FailureLimiter):
// once a host spent its budget (kFailuresPerSecond, burst kFailureBurst),
// its calls whose token is unknown or malformed are answered
// RESOURCE_EXHAUSTED instead of UNAUTHENTICATED until the bucket refills.
// A valid token is never refused by the limiter: the lookup that tells it
// from a bad one is the cheap one above, so a real worker behind the same
// address as a client sending bad tokens keeps working.
//
// Errors, exactly as coordinator.proto documents them:
//   Unauthenticated: no "authorization" metadata, more than one, a value that
//     is not "Bearer <token>", or a token that is neither the admin token nor
//     any job's or member's token.
//   ResourceExhausted: an Unauthenticated call from a peer host that exceeded
//     its failed-authentication rate.
//   PermissionDenied: a valid job or member token on an admin-only RPC or on
//     another job; a job token on an RPC that acts (Access::kMember); a member
//     token acting as another worker or incarnation (names both).
// The message of an error never contains a token or a hash.
//
// Thread-safety: thread-safe. Lock order: the coordinator's mutex may be
// held while calling SetJobToken / SetMemberToken (never the reverse: the
// Authenticator calls nothing outside itself).
#ifndef SHARDLINE_SERVER_AUTH_H_
#define SHARDLINE_SERVER_AUTH_H_

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/clock.h"

namespace shardline::server {

// Shortest admin token the coordinator accepts (bytes).
inline constexpr size_t kMinAdminTokenBytes = 16;

// InvalidArgument naming `source` (e.g. "--admin-token") unless `token` is
// empty (authentication off) or a usable admin token: at least
// kMinAdminTokenBytes bytes of visible ASCII without spaces.
absl::Status CheckAdminToken(absl::string_view token, absl::string_view source);

// The admin token in the file at `path` (--admin-token-file): its content
// with one trailing "\n" (or "\r\n") stripped. Refused (the message names
// the file): unreadable (FileError), readable by group or others
// (PermissionDenied naming the mode, e.g. 0644, and "chmod 600"), empty,
// or failing CheckAdminToken.
absl::StatusOr<std::string> ReadAdminTokenFile(const std::string& path);

// Who may make an RPC.
enum class Access {
  kAdminOnly,  // JobService.{CreateJob, ListJobs, CancelJob, DrainWorker},
               // CommitCheckpoint, an operator's KvGet
  kJobRead,    // read-only calls of one job: the admin, job or member token
  kJoin,       // JoinJob: the admin or job token, or the member token of the
               // identity that joins
  kMember,     // every call that acts (fenced calls, Session, LeaveJob):
               // the admin token, or the member token of the identity named
};

// A worker incarnation.
struct WorkerRef {
  std::string job_id;
  std::string worker_id;
  uint64_t incarnation = 0;
  bool operator==(const WorkerRef& o) const {
    return job_id == o.job_id && worker_id == o.worker_id && incarnation == o.incarnation;
  }
};

// Who made a call.
struct Principal {
  enum class Kind {
    kAnonymous,  // no admin token configured: authentication is off
    kAdmin,
    kJob,     // a job's worker token
    kMember,  // a member token: `member` says whose
  };
  Kind kind = Kind::kAnonymous;
  std::string job_id;  // kJob, kMember: the token's job
  WorkerRef member;    // kMember only

  // Admin rights: the admin token, or authentication off.
  bool is_admin() const { return kind == Kind::kAnonymous || kind == Kind::kAdmin; }
};

// True when `a` and `b` are equal; the time taken depends only on their
// lengths, never on where they differ.
bool ConstantTimeEquals(absl::string_view a, absl::string_view b);

// The token of an "authorization" value "Bearer <token>" (scheme
// case-insensitive, one or more spaces, token of visible ASCII without
// spaces); nullopt when malformed.
std::optional<absl::string_view> ParseBearer(absl::string_view authorization);

// SHA-256 of `data` as 64 lowercase hex digits (OpenSSL libcrypto). What the
// coordinator stores and indexes instead of a token.
std::string Sha256Hex(absl::string_view data);

// True when `s` looks like a Sha256Hex result (64 lowercase hex digits).
bool IsSha256Hex(absl::string_view s);

// A fresh secret: 32 bytes from OpenSSL's CSPRNG (RAND_bytes) as 64
// lowercase hex digits. Aborts the process if the CSPRNG fails (no secret
// is better than a guessable one).
std::string NewSecret();

// The host part of a gRPC peer string: "ipv4:10.0.0.5:3456" -> "10.0.0.5",
// "ipv6:[::1]:3456" -> "::1", "ipv6:%5B::1%5D:3456" -> "::1"; anything else
// ("unix:/path", "") is returned without a port when it has one, else whole.
std::string PeerHost(absl::string_view grpc_peer);

// A token bucket of failed authentications per peer host.
//   Allowed(host): the host may still fail (its bucket holds >= 1).
//   NoteFailure(host): one failure spent.
// A bucket refills at `per_second` up to `burst`. At most `max_hosts` hosts
// are tracked: when a new one arrives and the table is full, the hosts whose
// buckets are full again are forgotten; if none is, the new host is not
// tracked (it is allowed: a flood from many addresses costs each its burst,
// and nothing is refused that might be a real worker's).
// Thread-safe (its own mutex).
class FailureLimiter {
 public:
  // Defaults: 20 failures/s, burst 40, per host. A real worker never fails
  // authentication in a loop (a bad token ends it), so these bound an
  // attacker's cost to the server without touching real traffic.
  static constexpr double kFailuresPerSecond = 20;
  static constexpr double kFailureBurst = 40;
  static constexpr size_t kMaxHosts = 65536;

  explicit FailureLimiter(const Clock* clock, double per_second = kFailuresPerSecond,
                          double burst = kFailureBurst, size_t max_hosts = kMaxHosts);

  bool Allowed(const std::string& host) const ABSL_LOCKS_EXCLUDED(mu_);
  void NoteFailure(const std::string& host) ABSL_LOCKS_EXCLUDED(mu_);
  size_t tracked_hosts() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  struct Bucket {
    double tokens = 0;
    absl::Time at;  // when `tokens` was computed
  };
  double Refilled(const Bucket& b, absl::Time now) const;

  const Clock* const clock_;
  const double per_second_;
  const double burst_;
  const size_t max_hosts_;
  mutable absl::Mutex mu_;
  absl::flat_hash_map<std::string, Bucket> buckets_ ABSL_GUARDED_BY(mu_);
};

class Authenticator {
 public:
  // `admin_token` empty: authentication off (every call is kAnonymous).
  // `clock` (not owned, outlives this) paces the FailureLimiter.
  Authenticator(std::string admin_token, const Clock* clock);

  bool enabled() const { return !admin_token_.empty(); }

  // The credential index (hashes are Sha256Hex of the token). Setting a
  // job's token again replaces its previous one; setting a member token
  // replaces the previous one of the same (job_id, worker_id), so a replaced
  // incarnation's token stops working (an empty `token_hash` only removes
  // the previous one).
  void SetJobToken(const std::string& job_id, const std::string& token_hash)
      ABSL_LOCKS_EXCLUDED(mu_);
  void SetMemberToken(const WorkerRef& member, const std::string& token_hash)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Removes a job's token and the member tokens of `worker_ids` (a pruned
  // job, Coordinator::PruneJob): they authenticate nothing afterwards.
  void ForgetJob(const std::string& job_id, const std::vector<std::string>& worker_ids)
      ABSL_LOCKS_EXCLUDED(mu_);

  // Checks a call. `authorization` holds every value of the metadata key
  // "authorization" (normally one); `peer_host` is PeerHost(ctx.peer());
  // `job_id` is the job the call is for (may be empty: a job or member token
  // then fails with PermissionDenied, and the adapter reports the empty
  // job_id with InvalidArgument for the admin); `worker` is the identity a
  // kJoin or kMember call acts as (required for a member token there: null
  // is PermissionDenied). Errors: see the file comment.
  absl::StatusOr<Principal> Authorize(const std::vector<absl::string_view>& authorization,
                                      Access access, absl::string_view job_id,
                                      const std::string& peer_host = "",
                                      const WorkerRef* worker = nullptr)
      ABSL_LOCKS_EXCLUDED(mu_);

  const FailureLimiter& limiter() const { return limiter_; }

 private:
  struct Credential {
    Principal::Kind kind = Principal::Kind::kJob;
    WorkerRef who;  // kJob: only job_id
  };
  absl::StatusOr<Principal> Check(const std::vector<absl::string_view>& authorization,
                                  Access access, absl::string_view job_id,
                                  const WorkerRef* worker) const ABSL_LOCKS_EXCLUDED(mu_);
  std::optional<Credential> Find(absl::string_view token) const ABSL_LOCKS_EXCLUDED(mu_);

  const std::string admin_token_;
  FailureLimiter limiter_;
  mutable absl::Mutex mu_;
  absl::flat_hash_map<std::string, Credential> by_hash_ ABSL_GUARDED_BY(mu_);
  // job_id -> its token's hash; "job_id/worker_id" -> the member token's hash.
  absl::flat_hash_map<std::string, std::string> job_hash_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, std::string> member_hash_ ABSL_GUARDED_BY(mu_);
};

}  // namespace shardline::server

#endif  // SHARDLINE_SERVER_AUTH_H_
