// Bearer-token authentication and authorization for the coordinator API
// (coordinator.proto "Authentication"). No gRPC in here: the adapter passes
// the values of the "authorization" metadata key and the job the call is for.
//
//   Authenticator auth("s3cret", {
//       .worker_token = [&](absl::string_view job) { return TokenOf(job); },
//       .job_ids = [&] { return AllJobIds(); }});
//   absl::StatusOr<Principal> who = auth.Authorize(metadata_values,
//                                                  Access::kWorker, "j1");
//
// Two kinds of token: the admin token (accepted on every RPC of every job)
// and a job's worker token (accepted for that job only, on the RPCs marked
// Access::kWorker). A coordinator configured without an admin token accepts
// every call and ignores the metadata (local tests only).
//
// Errors, exactly as coordinator.proto documents them:
//   Unauthenticated: no "authorization" metadata, more than one, a value that
//     is not "Bearer <token>", or a token that is neither the admin token nor
//     any job's worker token.
//   PermissionDenied: a valid worker token on an admin-only RPC, or on
//     another job than its own.
//
// Tokens are compared in constant time (in their length); the message of an
// error never contains a token.
//
// Thread-safety: thread-safe if the WorkerTokens functions are.
#ifndef SHARDLINE_SERVER_AUTH_H_
#define SHARDLINE_SERVER_AUTH_H_

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace shardline::server {

// Who may make an RPC.
enum class Access {
  kAdminOnly,  // JobService.{CreateJob, ListJobs, CancelJob}, CommitCheckpoint
  kWorker,     // everything else: the admin token, or the job's worker token
};

// Who made a call.
struct Principal {
  enum class Kind {
    kAnonymous,  // no admin token configured: authentication is off
    kAdmin,
    kWorker,
  };
  Kind kind = Kind::kAnonymous;
  std::string job_id;  // kWorker: the job whose worker token was presented

  // Admin rights: the admin token, or authentication off.
  bool is_admin() const { return kind != Kind::kWorker; }
};

// True when `a` and `b` are equal; the time taken depends only on their
// lengths, never on where they differ.
bool ConstantTimeEquals(absl::string_view a, absl::string_view b);

// The token of an "authorization" value "Bearer <token>" (scheme
// case-insensitive, one or more spaces, token of visible ASCII without
// spaces); nullopt when malformed.
std::optional<absl::string_view> ParseBearer(absl::string_view authorization);

class Authenticator {
 public:
  // Where worker tokens come from (the coordinator).
  struct WorkerTokens {
    // The worker token of `job_id`, or nullopt when there is no such job.
    // Called on every call that does not carry the admin token.
    std::function<std::optional<std::string>(absl::string_view job_id)> worker_token;
    // Every job id. Called only when the token is not the call's job's (to
    // tell PermissionDenied from Unauthenticated), so it may be slow.
    std::function<std::vector<std::string>()> job_ids;
  };

  // `admin_token` empty: authentication off (every call is kAnonymous).
  Authenticator(std::string admin_token, WorkerTokens worker_tokens);

  bool enabled() const { return !admin_token_.empty(); }

  // Checks a call. `authorization` holds every value of the metadata key
  // "authorization" (normally one); `job_id` is the job the call is for
  // (may be empty: a worker token then fails with PermissionDenied, and the
  // adapter reports the empty job_id with InvalidArgument for the admin).
  // Errors: see the file comment.
  absl::StatusOr<Principal> Authorize(const std::vector<absl::string_view>& authorization,
                                      Access access, absl::string_view job_id) const;

 private:
  // The job whose worker token `token` is, or nullopt.
  std::optional<std::string> JobOfToken(absl::string_view token, absl::string_view hint) const;

  const std::string admin_token_;
  const WorkerTokens worker_tokens_;
};

}  // namespace shardline::server

#endif  // SHARDLINE_SERVER_AUTH_H_
