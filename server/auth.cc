#include "server/auth.h"

#include <fcntl.h>
#include <openssl/rand.h>
#include <openssl/sha.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <iterator>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/strip.h"
#include "common/files.h"

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

std::string Sha256Hex(absl::string_view data) {
  unsigned char digest[SHA256_DIGEST_LENGTH];
  SHA256(reinterpret_cast<const unsigned char*>(data.data()), data.size(), digest);
  return absl::BytesToHexString(
      absl::string_view(reinterpret_cast<const char*>(digest), sizeof(digest)));
}

bool IsSha256Hex(absl::string_view s) {
  if (s.size() != 2 * SHA256_DIGEST_LENGTH) return false;
  for (char c : s) {
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  }
  return true;
}

std::string NewSecret() {
  unsigned char bytes[32];
  if (RAND_bytes(bytes, sizeof(bytes)) != 1) {
    std::fprintf(stderr, "fatal: OpenSSL RAND_bytes failed; cannot make a secret\n");
    std::abort();
  }
  return absl::BytesToHexString(
      absl::string_view(reinterpret_cast<const char*>(bytes), sizeof(bytes)));
}

std::string PeerHost(absl::string_view peer) {
  std::string p(peer);
  // gRPC percent-encodes the brackets of IPv6 peers in some versions.
  p = absl::StrReplaceAll(p, {{"%5B", "["}, {"%5D", "]"}, {"%5b", "["}, {"%5d", "]"}});
  absl::string_view rest = p;
  if (absl::ConsumePrefix(&rest, "ipv4:")) {
    const size_t colon = rest.rfind(':');
    return std::string(colon == absl::string_view::npos ? rest : rest.substr(0, colon));
  }
  if (absl::ConsumePrefix(&rest, "ipv6:")) {
    if (!rest.empty() && rest.front() == '[') {
      const size_t close = rest.find(']');
      if (close != absl::string_view::npos) return std::string(rest.substr(1, close - 1));
    }
    return std::string(rest);
  }
  return p;
}

absl::Status CheckAdminToken(absl::string_view token, absl::string_view source) {
  if (token.empty()) return absl::OkStatus();
  for (char c : token) {
    if (c <= 0x20 || c >= 0x7f) {
      return absl::InvalidArgumentError(absl::StrCat(
          source, " holds a space or control character; an admin token is visible ASCII "
          "without spaces"));
    }
  }
  if (token.size() < kMinAdminTokenBytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        source, " is ", token.size(), " bytes; an admin token needs at least ",
        kMinAdminTokenBytes, " (e.g. openssl rand -hex 32)"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> ReadAdminTokenFile(const std::string& path) {
  // O_NONBLOCK: a FIFO must not hang the start (it is refused below).
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK);
  if (fd < 0) return FileError(errno, "cannot open --admin-token-file", path);
  struct stat st;
  if (fstat(fd, &st) != 0) {
    const int err = errno;
    close(fd);
    return FileError(err, "cannot stat --admin-token-file", path);
  }
  if (!S_ISREG(st.st_mode)) {
    close(fd);
    return absl::InvalidArgumentError(absl::StrCat(
        "--admin-token-file '", path, "' is not a regular file (",
        S_ISDIR(st.st_mode) ? "a directory" : S_ISFIFO(st.st_mode) ? "a FIFO" : "a device or socket",
        "); give the file that holds the token"));
  }
  if ((st.st_mode & 077) != 0) {
    close(fd);
    return absl::PermissionDeniedError(absl::StrCat(
        "--admin-token-file '", path, "' has mode ",
        absl::StrFormat("%04o", st.st_mode & 07777),
        ": group or others may read it; make it private (chmod 600 '", path, "')"));
  }
  std::string text;
  char buf[4096];
  while (true) {
    const ssize_t n = read(fd, buf, sizeof(buf));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const int err = errno;
      close(fd);
      return FileError(err, "cannot read --admin-token-file", path);
    }
    if (n == 0) break;
    text.append(buf, static_cast<size_t>(n));
    if (text.size() > 64 * 1024) {
      close(fd);
      return absl::InvalidArgumentError(
          absl::StrCat("--admin-token-file '", path, "' is over 64 KiB; it holds one token"));
    }
  }
  close(fd);
  if (absl::EndsWith(text, "\n")) text.pop_back();
  if (absl::EndsWith(text, "\r")) text.pop_back();
  if (text.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("--admin-token-file '", path, "' is empty"));
  }
  if (absl::Status s = CheckAdminToken(text, absl::StrCat("--admin-token-file '", path, "'"));
      !s.ok()) {
    return s;
  }
  return text;
}

// ---------------------------------------------------------------------------
// FailureLimiter.

FailureLimiter::FailureLimiter(const Clock* clock, double per_second, double burst,
                               size_t max_hosts)
    : clock_(clock), per_second_(per_second), burst_(burst), max_hosts_(max_hosts) {}

double FailureLimiter::Refilled(const Bucket& b, absl::Time now) const {
  const double elapsed = absl::ToDoubleSeconds(std::max(now - b.at, absl::ZeroDuration()));
  return std::min(burst_, b.tokens + elapsed * per_second_);
}

bool FailureLimiter::Allowed(const std::string& host) const {
  absl::MutexLock lock(&mu_);
  auto it = buckets_.find(host);
  if (it == buckets_.end()) return true;
  return Refilled(it->second, clock_->Now()) >= 1.0;
}

void FailureLimiter::NoteFailure(const std::string& host) {
  absl::MutexLock lock(&mu_);
  const absl::Time now = clock_->Now();
  auto it = buckets_.find(host);
  if (it == buckets_.end()) {
    if (buckets_.size() >= max_hosts_) {
      for (auto b = buckets_.begin(); b != buckets_.end();) {
        auto next = std::next(b);
        if (Refilled(b->second, now) >= burst_) buckets_.erase(b);
        b = next;
      }
      if (buckets_.size() >= max_hosts_) return;  // not tracked (see the header)
    }
    it = buckets_.emplace(host, Bucket{burst_, now}).first;
  }
  Bucket& b = it->second;
  b.tokens = std::max(0.0, Refilled(b, now) - 1.0);
  b.at = now;
}

size_t FailureLimiter::tracked_hosts() const {
  absl::MutexLock lock(&mu_);
  return buckets_.size();
}

// ---------------------------------------------------------------------------
// Authenticator.

Authenticator::Authenticator(std::string admin_token, const Clock* clock)
    : admin_token_(std::move(admin_token)), limiter_(clock) {}

void Authenticator::SetJobToken(const std::string& job_id, const std::string& token_hash) {
  absl::MutexLock lock(&mu_);
  auto [it, inserted] = job_hash_.try_emplace(job_id, token_hash);
  if (!inserted) {
    by_hash_.erase(it->second);
    it->second = token_hash;
  }
  Credential c;
  c.kind = Principal::Kind::kJob;
  c.who.job_id = job_id;
  by_hash_[token_hash] = std::move(c);
}

void Authenticator::ForgetJob(const std::string& job_id,
                              const std::vector<std::string>& worker_ids) {
  absl::MutexLock lock(&mu_);
  if (auto it = job_hash_.find(job_id); it != job_hash_.end()) {
    by_hash_.erase(it->second);
    job_hash_.erase(it);
  }
  for (const std::string& worker_id : worker_ids) {
    if (auto it = member_hash_.find(absl::StrCat(job_id, "/", worker_id));
        it != member_hash_.end()) {
      by_hash_.erase(it->second);
      member_hash_.erase(it);
    }
  }
}

void Authenticator::SetMemberToken(const WorkerRef& member, const std::string& token_hash) {
  absl::MutexLock lock(&mu_);
  const std::string key = absl::StrCat(member.job_id, "/", member.worker_id);
  if (token_hash.empty()) {  // the worker_id's new incarnation has no token
    if (auto it = member_hash_.find(key); it != member_hash_.end()) {
      by_hash_.erase(it->second);
      member_hash_.erase(it);
    }
    return;
  }
  auto [it, inserted] = member_hash_.try_emplace(key, token_hash);
  if (!inserted) {
    by_hash_.erase(it->second);
    it->second = token_hash;
  }
  Credential c;
  c.kind = Principal::Kind::kMember;
  c.who = member;
  by_hash_[token_hash] = std::move(c);
}

std::optional<Authenticator::Credential> Authenticator::Find(absl::string_view token) const {
  const std::string hash = Sha256Hex(token);  // outside the lock
  absl::MutexLock lock(&mu_);
  auto it = by_hash_.find(hash);
  if (it == by_hash_.end()) return std::nullopt;
  return it->second;
}

absl::StatusOr<Principal> Authenticator::Authorize(
    const std::vector<absl::string_view>& authorization, Access access,
    absl::string_view job_id, const std::string& peer_host, const WorkerRef* worker) {
  if (!enabled()) return Principal{};
  // The check first: it is one hash and one lookup, so a valid token is
  // never refused because others sent bad ones from the same host.
  absl::StatusOr<Principal> who = Check(authorization, access, job_id, worker);
  if (who.ok() || who.status().code() != absl::StatusCode::kUnauthenticated) return who;
  if (!limiter_.Allowed(peer_host)) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "too many failed authentications from ", peer_host.empty() ? "this peer" : peer_host,
        " (over ", FailureLimiter::kFailuresPerSecond, "/s, burst ",
        FailureLimiter::kFailureBurst, "); fix the token and retry in a few seconds"));
  }
  limiter_.NoteFailure(peer_host);
  return who;
}

absl::StatusOr<Principal> Authenticator::Check(const std::vector<absl::string_view>& authorization,
                                               Access access, absl::string_view job_id,
                                               const WorkerRef* worker) const {
  if (authorization.empty()) {
    return absl::UnauthenticatedError(
        "missing \"authorization\" metadata; send \"authorization: Bearer <token>\" with the "
        "admin token, the job's worker token or a member token");
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
    return Principal{Principal::Kind::kAdmin, "", {}};
  }
  std::optional<Credential> found = Find(*token);
  if (!found) {
    return absl::UnauthenticatedError(absl::StrCat(
        "unknown token; use the admin token, the job's worker token returned by CreateJob, or "
        "the member token returned by JoinJob",
        job_id.empty() ? ""
                       : absl::StrCat(" (a coordinator started on another --state file knows "
                                      "neither job '",
                                      job_id, "' nor its tokens)")));
  }
  const bool member = found->kind == Principal::Kind::kMember;
  const std::string what =
      member ? absl::StrCat("the member token of worker '", found->who.worker_id,
                            "' (incarnation ", found->who.incarnation, ") of job '",
                            found->who.job_id, "'")
             : absl::StrCat("the worker token of job '", found->who.job_id, "'");
  if (access == Access::kAdminOnly) {
    return absl::PermissionDeniedError(
        absl::StrCat(what, " may not make this call; it needs the admin token"));
  }
  if (found->who.job_id != job_id) {
    return absl::PermissionDeniedError(
        absl::StrCat(what, " is not valid for job '", job_id, "'"));
  }
  if (access == Access::kMember && !member) {
    return absl::PermissionDeniedError(absl::StrCat(
        what, " admits only JoinJob and reads of the job; this call needs the member_token "
        "that JoinJob returned to this worker incarnation"));
  }
  if (member && (access == Access::kMember || access == Access::kJoin)) {
    if (worker == nullptr) {
      return absl::PermissionDeniedError(
          absl::StrCat(what, " may act only as that worker; the call names no worker"));
    }
    if (!(found->who == *worker)) {
      return absl::PermissionDeniedError(absl::StrCat(
          what, " may act only as itself, not as worker '", worker->worker_id,
          "' (incarnation ", worker->incarnation, ") of job '", worker->job_id, "'"));
    }
  }
  Principal p;
  p.kind = found->kind;
  p.job_id = found->who.job_id;
  if (member) p.member = found->who;
  return p;
}

}  // namespace shardline::server
