// The StateStore on etcd (server/etcd_state_store.h).
//
// A Write is one Txn per chunk:
//   compare: CREATE(fence_key) == fence_revision   (when fenced)
//   success: Put / DeleteRange of each record key
//   failure: Range(fence_key)                      (who holds it now, for the message)
// so a chunk has at most max_txn_ops - 1 operations, the failure branch's
// one Range counted in.
#include "server/etcd_state_store.h"

#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/text.h"

namespace shardline::server {
namespace {

// kind with '%' and '/' escaped, so "a" and "a/b" have disjoint key ranges.
std::string EscapeKind(absl::string_view kind) {
  std::string out;
  for (char c : kind) {
    if (c == '%') {
      out += "%25";
    } else if (c == '/') {
      out += "%2F";
    } else {
      out += c;
    }
  }
  return out;
}

// A failure of the etcd client as the StateStore contract has it:
// InvalidArgument stays (a request etcd refuses as malformed, too large);
// everything else is Unavailable, with the client's message.
absl::Status AsStoreError(const absl::Status& s, absl::string_view what) {
  if (absl::IsInvalidArgument(s)) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": ", s.message()));
  }
  return absl::UnavailableError(absl::StrCat(
      what, ": ", s.message(),
      absl::IsUnavailable(s) ? "" : absl::StrCat(" (", absl::StatusCodeToString(s.code()), ")")));
}

void AddFence(const EtcdStoreOptions& o, etcdserverpb::TxnRequest& txn) {
  if (o.fence_revision == 0) return;
  etcdserverpb::Compare* c = txn.add_compare();
  c->set_key(o.fence_key);
  c->set_target(etcdserverpb::Compare::CREATE);
  c->set_result(etcdserverpb::Compare::EQUAL);
  c->set_create_revision(o.fence_revision);
  txn.add_failure()->mutable_request_range()->set_key(o.fence_key);
}

// The message of a failed fence compare, from the failure branch's Range.
absl::Status FencedError(const EtcdStoreOptions& o, const etcdserverpb::TxnResponse& r,
                         absl::string_view what) {
  std::string now = "no longer exists (this replica's lease expired or was revoked)";
  if (r.responses_size() > 0 && r.responses(0).has_response_range() &&
      r.responses(0).response_range().kvs_size() > 0) {
    const etcdserverpb::KeyValue& kv = r.responses(0).response_range().kvs(0);
    now = absl::StrCat("was created again at revision ", kv.create_revision(), " (holder '",
                       AbbreviateValue(kv.value()), "')");
  }
  return absl::FailedPreconditionError(absl::StrCat(
      "fenced: ", what, " refused: the leader key ", o.fence_key, " this replica created at ",
      "revision ", o.fence_revision, " ", now,
      "; this replica no longer leads, so it must not change the state; nothing of this "
      "transaction was applied"));
}

class EtcdStore final : public StateStore {
 public:
  EtcdStore(etcd::Client* etcd, EtcdStoreOptions options)
      : etcd_(etcd), options_(std::move(options)) {}

  absl::Status Write(const std::vector<Mutation>& mutations) override ABSL_LOCKS_EXCLUDED(mu_) {
    bool fenced = false;
    absl::Status s = WriteAll(mutations, &fenced);
    if (!s.ok() && options_.on_write_failed) options_.on_write_failed(s, fenced);
    return s;
  }

  absl::StatusOr<std::vector<Record>> Scan(absl::string_view kind) const override {
    const std::string prefix = KindPrefix(kind);
    absl::StatusOr<std::vector<etcdserverpb::KeyValue>> kvs = etcd_->RangePrefix(prefix);
    if (!kvs.ok()) {
      return AsStoreError(kvs.status(), absl::StrCat("state scan of kind '", kind, "'"));
    }
    std::vector<Record> out;
    out.reserve(kvs->size());
    for (etcdserverpb::KeyValue& kv : *kvs) {
      Record r;
      r.kind = std::string(kind);
      r.key = kv.key().substr(prefix.size());
      r.value = std::move(*kv.mutable_value());
      out.push_back(std::move(r));
    }
    return out;
  }

 private:
  std::string KindPrefix(absl::string_view kind) const {
    return absl::StrCat(options_.prefix, "state/", EscapeKind(kind), "/");
  }

  absl::Status WriteAll(const std::vector<Mutation>& mutations, bool* fenced)
      ABSL_LOCKS_EXCLUDED(mu_) {
    if (absl::Status s = ValidateMutations(mutations); !s.ok()) return s;
    if (mutations.empty()) return absl::OkStatus();

    // The last mutation of each record, in the order of those last ones.
    std::map<std::string, size_t> last;
    std::vector<std::string> keys(mutations.size());
    for (size_t i = 0; i < mutations.size(); ++i) {
      keys[i] = KindPrefix(mutations[i].kind) + mutations[i].key;
      last[keys[i]] = i;
    }
    std::vector<etcdserverpb::RequestOp> ops;
    std::vector<int64_t> op_bytes;
    for (size_t i = 0; i < mutations.size(); ++i) {
      if (last[keys[i]] != i) continue;
      etcdserverpb::RequestOp op;
      if (mutations[i].value.has_value()) {
        etcdserverpb::PutRequest* put = op.mutable_request_put();
        put->set_key(keys[i]);
        put->set_value(*mutations[i].value);
      } else {
        op.mutable_request_delete_range()->set_key(keys[i]);
      }
      op_bytes.push_back(static_cast<int64_t>(op.ByteSizeLong()));
      ops.push_back(std::move(op));
    }

    // Chunks of at most max_txn_ops - 1 operations and max_txn_bytes (an
    // operation larger than that alone; etcd refuses it if it is over
    // --max-request-bytes).
    const size_t per_txn = static_cast<size_t>(options_.max_txn_ops - 1);
    std::vector<std::pair<size_t, size_t>> chunks;  // [begin, end)
    for (size_t begin = 0; begin < ops.size();) {
      size_t end = begin;
      int64_t bytes = 0;
      while (end < ops.size() && end - begin < per_txn &&
             (end == begin || bytes + op_bytes[end] <= options_.max_txn_bytes)) {
        bytes += op_bytes[end];
        ++end;
      }
      chunks.emplace_back(begin, end);
      begin = end;
    }

    absl::MutexLock lock(&mu_);
    for (size_t c = 0; c < chunks.size(); ++c) {
      etcdserverpb::TxnRequest txn;
      AddFence(options_, txn);
      for (size_t i = chunks[c].first; i < chunks[c].second; ++i) {
        *txn.add_success() = std::move(ops[i]);
      }
      const std::string what =
          chunks.size() == 1 ? absl::StrCat("state write of ", mutations.size(), " mutations")
                             : absl::StrCat("state write of ", mutations.size(),
                                            " mutations, part ", c + 1, " of ", chunks.size(),
                                            c == 0 ? "" : " (the parts before it were applied)");
      absl::StatusOr<etcdserverpb::TxnResponse> r = etcd_->Txn(txn);
      if (!r.ok()) {
        // A Txn that timed out once sent may still be applied when etcd
        // gets a quorum back: say so, since the caller's answer is then
        // unknown (e.g. a CreateJob whose worker token it never saw).
        const absl::Status e = AsStoreError(r.status(), what);
        if (!absl::IsDeadlineExceeded(r.status())) return e;
        return absl::Status(e.code(), absl::StrCat(e.message(),
                                                   "; the write may still be applied once etcd "
                                                   "has a quorum: check before repeating it"));
      }
      if (!r->succeeded()) {
        *fenced = true;
        return FencedError(options_, *r, what);
      }
    }
    return absl::OkStatus();
  }

  etcd::Client* const etcd_;
  const EtcdStoreOptions options_;
  // Serializes writes, so a split batch's Txns are not interleaved with
  // another Write's.
  absl::Mutex mu_;
};

absl::Status CheckOptions(const EtcdStoreOptions& o) {
  if (o.prefix.empty() || o.prefix.back() != '/') {
    return absl::InvalidArgumentError(absl::StrCat(
        "etcd state store: prefix '", AbbreviateValue(o.prefix),
        "' must be non-empty and end with '/' (etcd/url.h EtcdUrl::prefix, e.g. \"/shardline/\")"));
  }
  if (o.fence_revision < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("etcd state store: fence_revision ", o.fence_revision, " is negative"));
  }
  if (o.fence_revision > 0 && o.fence_key.empty()) {
    return absl::InvalidArgumentError(
        "etcd state store: fence_revision is set without a fence_key (the leader key)");
  }
  if (o.max_txn_ops < 2) {
    return absl::InvalidArgumentError(
        absl::StrCat("etcd state store: max_txn_ops ", o.max_txn_ops,
                     " is below 2 (a Txn needs room for one mutation and the fence's read)"));
  }
  if (o.max_txn_bytes < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("etcd state store: max_txn_bytes ", o.max_txn_bytes, " is not positive"));
  }
  return absl::OkStatus();
}

// Whether [key, end) holds any key (one keys-only Range of limit 1);
// *first gets it.
absl::StatusOr<bool> AnyKey(etcd::Client* etcd, const std::string& key, const std::string& end,
                            std::string* first) {
  etcdserverpb::RangeRequest r;
  r.set_key(key);
  r.set_range_end(end);
  r.set_limit(1);
  r.set_keys_only(true);
  absl::StatusOr<etcdserverpb::RangeResponse> got = etcd->Range(r);
  if (!got.ok()) return got.status();
  if (got->kvs_size() == 0) return false;
  *first = got->kvs(0).key();
  return true;
}

// Keys under the prefix that are not Shardline's: anything but "format",
// "state/...", "leader" and "replicas/..." of the layout.
absl::Status CheckNoForeignKeys(etcd::Client* etcd, const std::string& prefix) {
  const std::string format = prefix + "format";
  const std::string leader = prefix + "leader";
  const std::string replicas = prefix + "replicas/";
  const std::string state = prefix + "state/";
  // Gaps between the layout's keys, in key order: "format" < "leader" <
  // "replicas/" < "state/".
  const std::vector<std::pair<std::string, std::string>> gaps = {
      {prefix, format},
      {format + std::string(1, '\0'), leader},
      {leader + std::string(1, '\0'), replicas},
      {etcd::PrefixRangeEnd(replicas), state},
      {etcd::PrefixRangeEnd(state), etcd::PrefixRangeEnd(prefix)},
  };
  for (const auto& [from, to] : gaps) {
    std::string first;
    absl::StatusOr<bool> any = AnyKey(etcd, from, to, &first);
    if (!any.ok()) return AsStoreError(any.status(), "etcd state store: checking the prefix");
    if (*any) {
      return absl::FailedPreconditionError(absl::StrCat(
          "etcd state store: prefix ", prefix, " holds key '", AbbreviateValue(first),
          "', which is not Shardline's (", prefix,
          "format is missing): these keys belong to something else; give the coordinator "
          "another prefix (--state etcd://.../OTHER)"));
    }
  }
  std::string first;
  absl::StatusOr<bool> records = AnyKey(etcd, state, etcd::PrefixRangeEnd(state), &first);
  if (!records.ok()) return AsStoreError(records.status(), "etcd state store: checking the prefix");
  if (*records) {
    return absl::FailedPreconditionError(absl::StrCat(
        "etcd state store: prefix ", prefix, " holds state records (e.g. '", AbbreviateValue(first),
        "') but no ", prefix,
        "format key: it was not written by a Shardline coordinator, or was damaged; give the "
        "coordinator another prefix (--state etcd://.../OTHER)"));
  }
  return absl::OkStatus();
}

absl::Status CheckFormatValue(const std::string& prefix, const std::string& value) {
  if (value == kEtcdStateFormat) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat(
      "etcd state store: ", prefix, "format is '", AbbreviateValue(value), "', not '",
      kEtcdStateFormat,
      "': the state under this prefix is another version's or not Shardline's; give the "
      "coordinator another prefix (--state etcd://.../OTHER)"));
}

}  // namespace

absl::StatusOr<std::unique_ptr<StateStore>> OpenEtcdStore(etcd::Client* etcd,
                                                          EtcdStoreOptions options) {
  if (absl::Status s = CheckOptions(options); !s.ok()) return s;
  const std::string format = options.prefix + "format";
  for (int attempt = 0; attempt < 2; ++attempt) {
    etcdserverpb::RangeRequest get;
    get.set_key(format);
    absl::StatusOr<etcdserverpb::RangeResponse> got = etcd->Range(get);
    if (!got.ok()) return AsStoreError(got.status(), "etcd state store: reading the format key");
    if (got->kvs_size() > 0) {
      if (absl::Status s = CheckFormatValue(options.prefix, got->kvs(0).value()); !s.ok()) {
        return s;
      }
      return std::unique_ptr<StateStore>(new EtcdStore(etcd, std::move(options)));
    }
    if (absl::Status s = CheckNoForeignKeys(etcd, options.prefix); !s.ok()) return s;
    // Written only if still absent: another replica may be doing the same.
    etcdserverpb::TxnRequest txn;
    AddFence(options, txn);
    etcdserverpb::Compare* absent = txn.add_compare();
    absent->set_key(format);
    absent->set_target(etcdserverpb::Compare::CREATE);
    absent->set_result(etcdserverpb::Compare::EQUAL);
    absent->set_create_revision(0);
    etcdserverpb::PutRequest* put = txn.add_success()->mutable_request_put();
    put->set_key(format);
    put->set_value(kEtcdStateFormat);
    absl::StatusOr<etcdserverpb::TxnResponse> r = etcd->Txn(txn);
    if (!r.ok()) return AsStoreError(r.status(), "etcd state store: writing the format key");
    if (r->succeeded()) {
      return std::unique_ptr<StateStore>(new EtcdStore(etcd, std::move(options)));
    }
    // Either the fence failed or the format appeared meanwhile: the
    // failure branch's Range (of the fence key) tells which.
    if (options.fence_revision != 0) {
      const bool fence_holds =
          r->responses_size() > 0 && r->responses(0).response_range().kvs_size() > 0 &&
          r->responses(0).response_range().kvs(0).create_revision() == options.fence_revision;
      if (!fence_holds) return FencedError(options, *r, "writing the format key");
    }
    // The format was written by someone else meanwhile: read it again.
  }
  return absl::UnavailableError(
      absl::StrCat("etcd state store: ", format, " changed while it was being written; retry"));
}

}  // namespace shardline::server
