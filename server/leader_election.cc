#include "server/leader_election.h"

#include <algorithm>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/log.h"
#include "etcd/url.h"
#include "google/protobuf/util/time_util.h"

namespace shardline::server {
namespace {

using google::protobuf::util::TimeUtil;

google::protobuf::Timestamp ToProto(absl::Time t) {
  return TimeUtil::NanosecondsToTimestamp(absl::ToUnixNanos(t));
}

}  // namespace

std::optional<v1::Replica> LeaderElection::ParseLeader(const etcdserverpb::KeyValue& kv) {
  v1::Replica r;
  if (r.ParseFromString(kv.value()) && !r.replica_id().empty() &&
      etcd::CheckEndpoint(r.address(), "the leader's address").ok()) {
    return r;
  }
  // Not a replica's record (another program's key, or damaged): nobody can
  // be elected while it is there, and its address must not reach clients.
  const absl::Status s = absl::FailedPreconditionError(absl::StrCat(
      kv.key(), " holds ", kv.value().size(),
      " bytes that are not a Shardline replica's record (or name no valid HOST:PORT): no replica "
      "can be elected while it is there; delete it (etcdctl del ",
      kv.key(), ") or use another prefix"));
  if (!foreign_leader_logged_) {
    LogLine(absl::StrCat("replica ", options_.self.replica_id(), ": ", s.message()));
    foreign_leader_logged_ = true;
  }
  SetError(s);
  return std::nullopt;
}

LeaderElection::LeaderElection(etcd::Client* etcd, ElectionOptions options)
    : etcd_(etcd), options_(std::move(options)) {
  self_ = options_.self;
  self_.set_role(v1::REPLICA_ROLE_CANDIDATE);
}

LeaderElection::~LeaderElection() { Stop(); }

void LeaderElection::Start(ElectionCallbacks callbacks) {
  callbacks_ = std::move(callbacks);
  {
    absl::MutexLock lock(&mu_);
    *self_.mutable_start_time() = ToProto(absl::Now());
  }
  thread_ = std::thread([this] { Loop(); });
}

void LeaderElection::Stop() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  if (thread_.joinable()) thread_.join();
}

void LeaderElection::Resign(const std::string& reason) {
  absl::MutexLock lock(&mu_);
  if (leading_ && resign_.empty()) resign_ = reason.empty() ? "resigned" : reason;
}

std::optional<v1::Replica> LeaderElection::Leader() const {
  absl::MutexLock lock(&mu_);
  // A follower that has not read etcd for a lease TTL does not know: that
  // leader's lease may have run out meanwhile.
  if (!leading_ && absl::Now() - last_read_ > options_.lease_ttl) return std::nullopt;
  return leader_;
}

void LeaderElection::NoteRead() {
  absl::MutexLock lock(&mu_);
  last_read_ = absl::Now();
}

bool LeaderElection::leading() const {
  absl::MutexLock lock(&mu_);
  return leading_;
}

bool LeaderElection::LeaseValid() const {
  return absl::ToUnixNanos(absl::Now()) < serving_until_ns_.load(std::memory_order_acquire);
}

void LeaderElection::UpdateServingUntil() {
  serving_until_ns_.store(leading_ ? absl::ToUnixNanos(valid_until_)
                                   : std::numeric_limits<int64_t>::min(),
                          std::memory_order_release);
}

v1::Replica LeaderElection::Self() const {
  absl::MutexLock lock(&mu_);
  return self_;
}

std::string LeaderElection::LastError() const {
  absl::MutexLock lock(&mu_);
  return last_error_;
}

void LeaderElection::SetError(const absl::Status& s) {
  absl::MutexLock lock(&mu_);
  last_error_ = s.ok() ? "" : std::string(s.message());
}

bool LeaderElection::SleepUntil(absl::Time until) {
  absl::MutexLock lock(&mu_);
  auto woken = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) { return stopping_ || !resign_.empty(); };
  mu_.AwaitWithDeadline(absl::Condition(&woken), until);
  return stopping_ || !resign_.empty();
}

absl::StatusOr<std::vector<v1::Replica>> LeaderElection::Replicas() const {
  absl::StatusOr<std::vector<etcdserverpb::KeyValue>> kvs =
      etcd_->RangePrefix(options_.prefix + "replicas/");
  if (!kvs.ok()) return kvs.status();
  std::optional<v1::Replica> leader = Leader();
  std::vector<v1::Replica> out;
  for (const etcdserverpb::KeyValue& kv : *kvs) {
    v1::Replica r;
    if (!r.ParseFromString(kv.value())) continue;  // not ours: skipped
    out.push_back(std::move(r));
  }
  std::sort(out.begin(), out.end(), [](const v1::Replica& a, const v1::Replica& b) {
    const bool al = a.role() == v1::REPLICA_ROLE_LEADER, bl = b.role() == v1::REPLICA_ROLE_LEADER;
    if (al != bl) return al;
    return a.replica_id() < b.replica_id();
  });
  return out;
}

absl::Status LeaderElection::EnsureLease() {
  if (lease_ != 0) return absl::OkStatus();
  const absl::Time sent = absl::Now();
  absl::StatusOr<int64_t> lease = etcd_->LeaseGrant(options_.lease_ttl);
  if (!lease.ok()) return lease.status();
  lease_ = *lease;
  last_keepalive_sent_ = sent;
  {
    absl::MutexLock lock(&mu_);
    valid_until_ = sent + options_.lease_ttl;
    UpdateServingUntil();
  }
  return Register();
}

absl::Status LeaderElection::KeepAlive() {
  const absl::Time sent = absl::Now();
  absl::StatusOr<absl::Duration> ttl = etcd_->LeaseKeepAliveOnce(lease_);
  if (!ttl.ok()) return ttl.status();
  last_keepalive_sent_ = sent;
  absl::MutexLock lock(&mu_);
  valid_until_ = sent + options_.lease_ttl;
  UpdateServingUntil();
  return absl::OkStatus();
}

absl::Status LeaderElection::Register() {
  v1::Replica self = Self();
  etcdserverpb::PutRequest put;
  put.set_key(options_.prefix + "replicas/" + self.replica_id());
  put.set_value(self.SerializeAsString());
  put.set_lease(lease_);
  etcdserverpb::TxnRequest txn;
  *txn.add_success()->mutable_request_put() = put;
  absl::StatusOr<etcdserverpb::TxnResponse> r = etcd_->Txn(txn);
  return r.ok() ? absl::OkStatus() : r.status();
}

std::optional<LeaderTerm> LeaderElection::Campaign() {
  if (absl::Status s = EnsureLease(); !s.ok()) {
    SetError(s);
    return std::nullopt;
  }
  if (absl::Now() - last_keepalive_sent_ >= options_.lease_ttl / 3) {
    absl::Status s = KeepAlive();
    if (absl::IsNotFound(s)) {
      lease_ = 0;  // expired while etcd was out of reach: a new one next round
      SetError(s);
      return std::nullopt;
    }
    if (!s.ok()) {
      SetError(s);
      return std::nullopt;
    }
  }
  const std::string key = leader_key();
  if (absl::Now() < campaign_after_) {
    // Just deposed: follow whoever is elected, without standing.
    etcdserverpb::RangeRequest get;
    get.set_key(key);
    absl::StatusOr<etcdserverpb::RangeResponse> r = etcd_->Range(get);
    if (!r.ok()) {
      SetError(r.status());
      return std::nullopt;
    }
    NoteRead();
    std::optional<v1::Replica> leader;
    if (r->kvs_size() > 0) leader = ParseLeader(r->kvs(0));
    Follow(leader);
    return std::nullopt;
  }
  // If nobody holds the leader key, create it on our lease; else read it.
  etcdserverpb::TxnRequest txn;
  etcdserverpb::Compare* free = txn.add_compare();
  free->set_key(key);
  free->set_target(etcdserverpb::Compare::CREATE);
  free->set_result(etcdserverpb::Compare::EQUAL);
  free->set_create_revision(0);
  v1::Replica candidate = Self();
  candidate.set_role(v1::REPLICA_ROLE_LEADER);
  const absl::Time now = absl::Now();
  *candidate.mutable_leader_since() = ToProto(now);
  etcdserverpb::PutRequest* put = txn.add_success()->mutable_request_put();
  put->set_key(key);
  put->set_value(candidate.SerializeAsString());
  put->set_lease(lease_);
  txn.add_failure()->mutable_request_range()->set_key(key);
  absl::StatusOr<etcdserverpb::TxnResponse> r = etcd_->Txn(txn);
  if (!r.ok()) {
    SetError(r.status());
    return std::nullopt;
  }
  SetError(absl::OkStatus());
  NoteRead();
  if (r->succeeded()) {
    LeaderTerm term;
    term.leader_key = key;
    term.revision = r->header().revision();
    term.lease = lease_;
    term.since = now;
    absl::MutexLock lock(&mu_);
    leader_ = candidate;
    return term;
  }
  std::optional<v1::Replica> leader;
  if (r->responses_size() > 0 && r->responses(0).response_range().kvs_size() > 0) {
    const etcdserverpb::KeyValue& kv = r->responses(0).response_range().kvs(0);
    leader = ParseLeader(kv);
    if (kv.lease() == lease_ && leader.has_value()) {
      // Our own key (a Txn whose answer was lost and that we repeated):
      // we lead since it was created.
      LeaderTerm term{key, kv.create_revision(), lease_, now};
      absl::MutexLock lock(&mu_);
      leader_ = leader;
      return term;
    }
  }
  Follow(leader);
  return std::nullopt;
}

void LeaderElection::Follow(const std::optional<v1::Replica>& leader) {
  bool changed = false;
  {
    absl::MutexLock lock(&mu_);
    const std::string before = leader_.has_value() ? leader_->replica_id() : "";
    const std::string now = leader.has_value() ? leader->replica_id() : "";
    changed = before != now;
    leader_ = leader;
    const v1::ReplicaRole role =
        leader.has_value() ? v1::REPLICA_ROLE_FOLLOWER : v1::REPLICA_ROLE_CANDIDATE;
    if (self_.role() != role) {
      self_.set_role(role);
      changed = true;
    }
  }
  if (changed) {
    if (leader.has_value()) {
      LogLine(absl::StrCat("replica ", options_.self.replica_id(), ": following ",
                           leader->replica_id(), " at ", leader->address()));
    }
    Register().IgnoreError();  // the role shown by Replicas(); retried on change
  }
}

std::string LeaderElection::Lead(const LeaderTerm& term) {
  const absl::Duration interval = options_.lease_ttl / 3;
  absl::Time next = last_keepalive_sent_ + interval;
  // Since when keep-alives fail (InfinitePast: they do not).
  absl::Time failing_since = absl::InfinitePast();
  while (true) {
    if (SleepUntil(next)) {
      absl::MutexLock lock(&mu_);
      return stopping_ ? std::string("shutting down") : resign_;
    }
    absl::Status s = KeepAlive();
    // The lease is gone: another replica may lead by now.
    if (absl::IsNotFound(s)) return "the lease expired (etcd answered TTL 0)";
    const absl::Time now = absl::Now();
    if (!s.ok()) {
      SetError(s);
      if (failing_since == absl::InfinitePast()) {
        failing_since = now;
        LogLine(absl::StrCat("replica ", options_.self.replica_id(),
                             ": lease keep-alive failed: ", s.message(), "; not serving from ",
                             absl::FormatDuration(options_.lease_ttl),
                             " after the last one that succeeded until etcd answers"));
      }
      // Not deposed yet: LeaseValid() stops serving once lease_ttl has
      // passed since the last keep-alive that succeeded. etcd keeps (and,
      // with a new raft leader, renews) the lease while it has no quorum,
      // so a keep-alive that succeeds later, on a lease that is still
      // there, resumes this same term: nobody else can have been elected.
      next = now + absl::Milliseconds(100);
      continue;
    }
    if (failing_since != absl::InfinitePast()) {
      LogLine(absl::StrCat("replica ", options_.self.replica_id(),
                           ": lease keep-alive succeeded again after ",
                           absl::FormatDuration(now - failing_since), "; still the leader"));
      failing_since = absl::InfinitePast();
      SetError(absl::OkStatus());
    }
    // Still our key? (An operator may have deleted it, or etcd's state was
    // restored from a backup.)
    etcdserverpb::RangeRequest get;
    get.set_key(term.leader_key);
    absl::StatusOr<etcdserverpb::RangeResponse> leader = etcd_->Range(get);
    if (leader.ok() &&
        (leader->kvs_size() == 0 || leader->kvs(0).create_revision() != term.revision)) {
      return "the leader key is no longer this replica's";
    }
    next = last_keepalive_sent_ + interval;
  }
}

void LeaderElection::Loop() {
  while (true) {
    {
      absl::MutexLock lock(&mu_);
      if (stopping_) break;
    }
    std::optional<LeaderTerm> term = Campaign();
    if (!term.has_value()) {
      if (SleepUntil(absl::Now() + options_.poll_interval)) {
        absl::MutexLock lock(&mu_);
        if (stopping_) break;
      }
      continue;
    }
    {
      absl::MutexLock lock(&mu_);
      leading_ = true;
      UpdateServingUntil();
      resign_.clear();
      self_.set_role(v1::REPLICA_ROLE_LEADER);
      *self_.mutable_leader_since() = ToProto(term->since);
    }
    Register().IgnoreError();
    LogLine(absl::StrCat("replica ", options_.self.replica_id(), ": elected leader (term ",
                         term->revision, ", lease TTL ", absl::FormatDuration(options_.lease_ttl),
                         ")"));
    if (callbacks_.elected) callbacks_.elected(*term);
    const std::string why = Lead(*term);
    {
      absl::MutexLock lock(&mu_);
      leading_ = false;
      UpdateServingUntil();
      resign_.clear();
      leader_.reset();
      self_.set_role(v1::REPLICA_ROLE_CANDIDATE);
      self_.clear_leader_since();
    }
    LogLine(absl::StrCat("replica ", options_.self.replica_id(), ": no longer the leader: ", why));
    if (callbacks_.deposed) callbacks_.deposed(why);
    // Deletes the leader key (and our registration) so that another replica
    // is elected now rather than at the lease's expiry.
    etcd_->LeaseRevoke(lease_).IgnoreError();
    lease_ = 0;
    // The others get the first chance: for a lease TTL this replica only
    // follows.
    campaign_after_ = absl::Now() + options_.lease_ttl;
  }
  if (lease_ != 0) etcd_->LeaseRevoke(lease_).IgnoreError();
  lease_ = 0;
}

}  // namespace shardline::server
