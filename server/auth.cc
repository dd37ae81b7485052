#include "server/auth.h"

#include <cstddef>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace shardline::server {

bool ConstantTimeEquals(absl::string_view a, absl::string_view b) {
  // Compare max(len) bytes whatever happens, so the time says nothing about
  // the position of the first difference.
  const size_t n = a.size() > b.size() ? a.size() : b.size();
  volatile unsigned char diff = a.size() == b.size() ? 0 : 1;
  for (size_t i = 0; i < n; ++i) {
    const unsigned char x = i < a.size() ? static_cast<unsigned char>(a[i]) : 0;
    const unsigned char y = i < b.size() ? static_cast<unsigned char>(b[i]) : 0;
    diff = diff | (x ^ y);
  }
  return diff == 0;
}

std::optional<absl::string_view> ParseBearer(absl::string_view authorization) {
  constexpr absl::string_view kScheme = "bearer";
  if (authorization.size() <= kScheme.size() ||
      !absl::EqualsIgnoreCase(authorization.substr(0, kScheme.size()), kScheme) ||
      authorization[kScheme.size()] != ' ') {
    return std::nullopt;
  }
  absl::string_view token = authorization.substr(kScheme.size());
  while (!token.empty() && token.front() == ' ') token.remove_prefix(1);
  if (token.empty()) return std::nullopt;
  for (char c : token) {
    // RFC 6750 token68 is narrower; any visible ASCII is accepted here, but
    // never spaces or control bytes.
    if (c <= 0x20 || c >= 0x7f) return std::nullopt;
  }
  return token;
}

Authenticator::Authenticator(std::string admin_token, WorkerTokens worker_tokens)
    : admin_token_(std::move(admin_token)), worker_tokens_(std::move(worker_tokens)) {}

std::optional<std::string> Authenticator::JobOfToken(absl::string_view token,
                                                     absl::string_view hint) const {
  if (!worker_tokens_.worker_token) return std::nullopt;
  if (!hint.empty()) {
    std::optional<std::string> t = worker_tokens_.worker_token(hint);
    if (t && !t->empty() && ConstantTimeEquals(token, *t)) return std::string(hint);
  }
  if (!worker_tokens_.job_ids) return std::nullopt;
  for (const std::string& job : worker_tokens_.job_ids()) {
    if (job == hint) continue;
    std::optional<std::string> t = worker_tokens_.worker_token(job);
    if (t && !t->empty() && ConstantTimeEquals(token, *t)) return job;
  }
  return std::nullopt;
}

absl::StatusOr<Principal> Authenticator::Authorize(
    const std::vector<absl::string_view>& authorization, Access access,
    absl::string_view job_id) const {
  if (!enabled()) return Principal{};
  if (authorization.empty()) {
    return absl::UnauthenticatedError(
        "missing \"authorization\" metadata; send \"authorization: Bearer <token>\" with the "
        "admin token or the job's worker token");
  }
  if (authorization.size() > 1) {
    return absl::UnauthenticatedError(
        "more than one \"authorization\" metadata value; send exactly one");
  }
  std::optional<absl::string_view> token = ParseBearer(authorization.front());
  if (!token) {
    return absl::UnauthenticatedError(
        "malformed \"authorization\" metadata; expected \"Bearer <token>\"");
  }
  if (ConstantTimeEquals(*token, admin_token_)) {
    return Principal{Principal::Kind::kAdmin, ""};
  }
  std::optional<std::string> token_job = JobOfToken(*token, job_id);
  if (!token_job) {
    return absl::UnauthenticatedError(absl::StrCat(
        "unknown token; use the admin token or the job's worker token returned by CreateJob",
        job_id.empty() ? ""
                       : absl::StrCat(" (a coordinator started on another --state file knows "
                                      "neither job '",
                                      job_id, "' nor its token)")));
  }
  if (access == Access::kAdminOnly) {
    return absl::PermissionDeniedError(absl::StrCat(
        "a worker token (of job '", *token_job, "') may not make this call; it needs the admin "
        "token"));
  }
  if (*token_job != job_id) {
    return absl::PermissionDeniedError(absl::StrCat("the worker token of job '", *token_job,
                                                    "' is not valid for job '", job_id, "'"));
  }
  return Principal{Principal::Kind::kWorker, std::move(*token_job)};
}

}  // namespace shardline::server
