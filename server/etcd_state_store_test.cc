// The etcd StateStore against a real 3-member etcd 3.4 (testing/
// etcd_cluster.h): the same answers as the memory store, the key layout,
// split batches, the fence, the format key, and one latency measurement
// against the SQLite store.
#include "server/etcd_state_store.h"

#include <cstdio>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "etcd/client.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/state_store.h"
#include "testing/etcd_cluster.h"

namespace shardline::server {
namespace {

using ::shardline::testing::EtcdCluster;
using ::shardline::testing::EtcdClusterOptions;
using ::testing::HasSubstr;

struct Failure {
  absl::Status error;
  bool fenced = false;
};

class EtcdStoreTest : public ::testing::Test {
 protected:
  void StartCluster(EtcdClusterOptions options = {}) {
    absl::StatusOr<std::unique_ptr<EtcdCluster>> cluster = EtcdCluster::Start(options);
    ASSERT_TRUE(cluster.ok()) << cluster.status();
    cluster_ = *std::move(cluster);
    etcd::ClientOptions client;
    client.endpoints = cluster_->endpoints();
    client.timeout = absl::Seconds(2);
    absl::StatusOr<std::unique_ptr<etcd::Client>> c = etcd::Client::Connect(client);
    ASSERT_TRUE(c.ok()) << c.status();
    etcd_ = *std::move(c);
  }

  absl::StatusOr<std::unique_ptr<StateStore>> Open(const std::string& prefix,
                                                   int64_t fence_revision = 0,
                                                   int max_txn_ops = 128) {
    EtcdStoreOptions o;
    o.prefix = prefix;
    o.fence_key = prefix + "leader";
    o.fence_revision = fence_revision;
    o.max_txn_ops = max_txn_ops;
    o.on_write_failed = [this](const absl::Status& error, bool fenced) {
      failures_.push_back({error, fenced});
    };
    return OpenEtcdStore(etcd_.get(), o);
  }

  std::unique_ptr<StateStore> MustOpen(const std::string& prefix, int64_t fence_revision = 0,
                                       int max_txn_ops = 128) {
    absl::StatusOr<std::unique_ptr<StateStore>> s = Open(prefix, fence_revision, max_txn_ops);
    EXPECT_TRUE(s.ok()) << s.status();
    return s.ok() ? *std::move(s) : nullptr;
  }

  // The value of etcd key `key` ("" when absent).
  std::string Get(const std::string& key, int64_t* create_revision = nullptr) {
    etcdserverpb::RangeRequest r;
    r.set_key(key);
    absl::StatusOr<etcdserverpb::RangeResponse> got = etcd_->Range(r);
    EXPECT_TRUE(got.ok()) << got.status();
    if (!got.ok() || got->kvs_size() == 0) return "";
    if (create_revision != nullptr) *create_revision = got->kvs(0).create_revision();
    return got->kvs(0).value();
  }

  // Puts key=value (attached to `lease`); returns the new create revision.
  int64_t Put(const std::string& key, const std::string& value, int64_t lease = 0) {
    etcdserverpb::TxnRequest txn;
    etcdserverpb::PutRequest* put = txn.add_success()->mutable_request_put();
    put->set_key(key);
    put->set_value(value);
    put->set_lease(lease);
    absl::StatusOr<etcdserverpb::TxnResponse> r = etcd_->Txn(txn);
    EXPECT_TRUE(r.ok()) << r.status();
    int64_t created = 0;
    Get(key, &created);
    return created;
  }

  void Delete(const std::string& key) {
    etcdserverpb::TxnRequest txn;
    txn.add_success()->mutable_request_delete_range()->set_key(key);
    ASSERT_TRUE(etcd_->Txn(txn).ok());
  }

  std::unique_ptr<EtcdCluster> cluster_;
  std::unique_ptr<etcd::Client> etcd_;
  std::vector<Failure> failures_;
};

std::vector<std::pair<std::string, std::string>> KeyValues(
    const absl::StatusOr<std::vector<Record>>& records) {
  std::vector<std::pair<std::string, std::string>> out;
  EXPECT_TRUE(records.ok()) << records.status();
  if (!records.ok()) return out;
  for (const Record& r : *records) out.emplace_back(r.key, r.value);
  return out;
}

TEST_F(EtcdStoreTest, WritesAndScansLikeTheMemoryStore) {
  ASSERT_NO_FATAL_FAILURE(StartCluster());
  std::unique_ptr<StateStore> etcd_store = MustOpen("/rt/");
  ASSERT_NE(etcd_store, nullptr);
  EXPECT_EQ(Get("/rt/format"), kEtcdStateFormat);
  std::unique_ptr<StateStore> memory = NewMemoryStore();

  const std::vector<std::vector<Mutation>> batches = {
      {Mutation::Put("job", "j2", "job two"), Mutation::Put("job", "j1", "job one"),
       Mutation::Put("member", "j1/w0", "m0"), Mutation::Put("member", "j1/w1", "m1")},
      // Bytewise order, binary keys and values, kinds that share a prefix.
      {Mutation::Put("job", std::string("j1\0x", 4), std::string("\0\xff", 2)),
       Mutation::Put("job", "j1\xff", "high"), Mutation::Put("job", "J0", "upper"),
       Mutation::Put("a", "b/x", "kind a"), Mutation::Put("a/b", "x", "kind a/b"),
       Mutation::Put("a%2Fb", "x", "kind a%2Fb")},
      // Overwrite, delete, delete of a missing record, and one record
      // changed three times in one batch (only the last counts).
      {Mutation::Put("job", "j2", "job two v2"), Mutation::Delete("member", "j1/w0"),
       Mutation::Delete("member", "never"), Mutation::Put("kv", "k", "1"),
       Mutation::Delete("kv", "k"), Mutation::Put("kv", "k", "3")},
      {Mutation::Delete("member", "j1/w1"), Mutation::Put("event", "j1/000001", "e1")},
      {},
  };
  const std::vector<std::string> kinds = {"job",   "member", "a",     "a/b",
                                          "a%2Fb", "kv",     "event", "none"};
  for (size_t b = 0; b < batches.size(); ++b) {
    ASSERT_TRUE(memory->Write(batches[b]).ok());
    absl::Status s = etcd_store->Write(batches[b]);
    ASSERT_TRUE(s.ok()) << "batch " << b << ": " << s;
    for (const std::string& kind : kinds) {
      absl::StatusOr<std::vector<Record>> want = memory->Scan(kind);
      absl::StatusOr<std::vector<Record>> got = etcd_store->Scan(kind);
      EXPECT_EQ(KeyValues(got), KeyValues(want)) << "kind " << kind << " after batch " << b;
      if (got.ok()) {
        for (const Record& r : *got) EXPECT_EQ(r.kind, kind);
      }
    }
  }
  // The order, spelled out.
  std::vector<std::string> job_keys;
  for (const auto& [key, value] : KeyValues(etcd_store->Scan("job"))) job_keys.push_back(key);
  EXPECT_EQ(job_keys,
            (std::vector<std::string>{"J0", "j1", std::string("j1\0x", 4), "j1\xff", "j2"}));

  // The layout of the keys (server/etcd_state_store.h).
  EXPECT_EQ(Get("/rt/state/job/j2"), "job two v2");
  EXPECT_EQ(Get("/rt/state/a%2Fb/x"), "kind a/b");
  EXPECT_EQ(Get("/rt/state/a%252Fb/x"), "kind a%2Fb");
  EXPECT_EQ(Get("/rt/state/kv/k"), "3");

  // An empty kind or key: refused by both, nothing applied.
  const std::vector<Mutation> bad = {Mutation::Put("job", "j9", "x"),
                                     Mutation::Put("job", "", "y")};
  absl::Status want = memory->Write(bad);
  absl::Status got = etcd_store->Write(bad);
  EXPECT_EQ(got.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(got.message(), want.message());
  EXPECT_EQ(Get("/rt/state/job/j9"), "");
  ASSERT_EQ(failures_.size(), 1u);
  EXPECT_FALSE(failures_[0].fenced);

  // Another store on the same prefix (a restarted coordinator) reads it all.
  std::unique_ptr<StateStore> reopened = MustOpen("/rt/");
  ASSERT_NE(reopened, nullptr);
  EXPECT_EQ(KeyValues(reopened->Scan("job")), KeyValues(memory->Scan("job")));
  EXPECT_EQ(KeyValues(reopened->Scan("event")), KeyValues(memory->Scan("event")));
}

TEST_F(EtcdStoreTest, SplitsBatchesBeyondMaxTxnOpsAndBytes) {
  EtcdClusterOptions options;
  options.extra_flags = {"--max-txn-ops=16"};
  ASSERT_NO_FATAL_FAILURE(StartCluster(options));

  // 100 mutations in Txns of 15: all applied.
  std::unique_ptr<StateStore> store = MustOpen("/split/", 0, /*max_txn_ops=*/16);
  ASSERT_NE(store, nullptr);
  std::vector<Mutation> batch;
  for (int i = 0; i < 100; ++i) {
    batch.push_back(Mutation::Put("member", absl::StrFormat("w%03d", i), absl::StrCat("v", i)));
  }
  ASSERT_TRUE(store->Write(batch).ok());
  absl::StatusOr<std::vector<Record>> all = store->Scan("member");
  ASSERT_TRUE(all.ok()) << all.status();
  ASSERT_EQ(all->size(), 100u);
  for (int i = 0; i < 100; ++i) {
    EXPECT_EQ((*all)[i].key, absl::StrFormat("w%03d", i));
    EXPECT_EQ((*all)[i].value, absl::StrCat("v", i));
  }
  std::vector<Mutation> deletes;
  for (int i = 0; i < 100; i += 2)
    deletes.push_back(Mutation::Delete("member", absl::StrFormat("w%03d", i)));
  ASSERT_TRUE(store->Write(deletes).ok());
  EXPECT_EQ(store->Scan("member")->size(), 50u);

  // A store that believes etcd takes 128: etcd refuses the one Txn, and
  // nothing of it is applied.
  std::unique_ptr<StateStore> wrong = MustOpen("/split/", 0, /*max_txn_ops=*/128);
  ASSERT_NE(wrong, nullptr);
  std::vector<Mutation> fifty;
  for (int i = 0; i < 50; ++i) fifty.push_back(Mutation::Put("other", absl::StrCat("k", i), "x"));
  absl::Status refused = wrong->Write(fifty);
  EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument) << refused;
  EXPECT_THAT(refused.message(), HasSubstr("too many operations"));
  EXPECT_TRUE(store->Scan("other")->empty());
  ASSERT_EQ(failures_.size(), 1u);
  EXPECT_FALSE(failures_[0].fenced);

  // Three values of 700 KiB: over etcd's 1.5 MiB request limit together,
  // so one Txn each (max_txn_bytes 1 MiB).
  const std::string big(700 << 10, 'b');
  ASSERT_TRUE(store
                  ->Write({Mutation::Put("blob", "1", big), Mutation::Put("blob", "2", big),
                           Mutation::Put("blob", "3", big)})
                  .ok());
  absl::StatusOr<std::vector<Record>> blobs = store->Scan("blob");
  ASSERT_TRUE(blobs.ok()) << blobs.status();
  ASSERT_EQ(blobs->size(), 3u);
  EXPECT_EQ((*blobs)[2].value, big);
}

TEST_F(EtcdStoreTest, FencedWritesAreRefusedWhenAnotherReplicaLeads) {
  ASSERT_NO_FATAL_FAILURE(StartCluster());
  absl::StatusOr<int64_t> lease = etcd_->LeaseGrant(absl::Seconds(30));
  ASSERT_TRUE(lease.ok()) << lease.status();
  const int64_t ours = Put("/f/leader", "replica-a", *lease);
  ASSERT_GT(ours, 0);
  std::unique_ptr<StateStore> store = MustOpen("/f/", ours, /*max_txn_ops=*/16);
  ASSERT_NE(store, nullptr);
  ASSERT_TRUE(store->Write({Mutation::Put("job", "j1", "v1")}).ok());
  EXPECT_TRUE(failures_.empty());

  // Replica b takes over: the leader key is created again.
  Delete("/f/leader");
  const int64_t theirs = Put("/f/leader", "replica-b");
  ASSERT_GT(theirs, ours);

  absl::Status s = store->Write({Mutation::Put("job", "j1", "v2"), Mutation::Put("job", "j2", "x"),
                                 Mutation::Delete("job", "j1")});
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_THAT(std::string(s.message()), ::testing::StartsWith("fenced: "));
  EXPECT_THAT(s.message(), HasSubstr(absl::StrCat("created again at revision ", theirs)));
  EXPECT_THAT(s.message(), HasSubstr("replica-b"));
  ASSERT_EQ(failures_.size(), 1u);
  EXPECT_TRUE(failures_[0].fenced);
  EXPECT_EQ(failures_[0].error, s);
  EXPECT_EQ(KeyValues(store->Scan("job")),
            (std::vector<std::pair<std::string, std::string>>{{"j1", "v1"}}));

  // A split batch: its first Txn is refused, so nothing of it applies.
  std::vector<Mutation> forty;
  for (int i = 0; i < 40; ++i) forty.push_back(Mutation::Put("member", absl::StrCat("m", i), "x"));
  EXPECT_EQ(store->Write(forty).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(store->Scan("member")->empty());

  // The new leader's store writes.
  std::unique_ptr<StateStore> next = MustOpen("/f/", theirs);
  ASSERT_NE(next, nullptr);
  EXPECT_TRUE(next->Write({Mutation::Put("job", "j1", "from b")}).ok());
  EXPECT_EQ(Get("/f/state/job/j1"), "from b");

  // No leader key at all (b's lease expired, nobody leads yet).
  Delete("/f/leader");
  absl::Status none = next->Write({Mutation::Put("job", "j1", "late")});
  EXPECT_EQ(none.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(none.message(), HasSubstr("no longer exists"));
  EXPECT_EQ(Get("/f/state/job/j1"), "from b");

  // Opening a fresh prefix fenced on a revision that is not the leader key's.
  absl::StatusOr<std::unique_ptr<StateStore>> stale = Open("/f2/", ours);
  EXPECT_EQ(stale.status().code(), absl::StatusCode::kFailedPrecondition) << stale.status();
  EXPECT_THAT(stale.status().message(), HasSubstr("fenced"));
  EXPECT_EQ(Get("/f2/format"), "");

  // etcd without a quorum: Unavailable, and the callback says not fenced.
  const int64_t again = Put("/f/leader", "replica-c");
  std::unique_ptr<StateStore> third = MustOpen("/f/", again);
  ASSERT_NE(third, nullptr);
  failures_.clear();
  cluster_->Kill(0);
  cluster_->Kill(1);
  absl::Status down = third->Write({Mutation::Put("job", "j1", "no quorum")});
  EXPECT_EQ(down.code(), absl::StatusCode::kUnavailable) << down;
  EXPECT_THAT(std::string(down.message()),
              ::testing::StartsWith("state write of 1 mutations: etcd"));
  ASSERT_EQ(failures_.size(), 1u);
  EXPECT_FALSE(failures_[0].fenced);
  EXPECT_EQ(third->Scan("job").status().code(), absl::StatusCode::kUnavailable);
}

TEST_F(EtcdStoreTest, FormatKeyAndForeignKeys) {
  ASSERT_NO_FATAL_FAILURE(StartCluster());

  // Another version's state.
  Put("/v0/format", "shardline-state-v0");
  absl::StatusOr<std::unique_ptr<StateStore>> v0 = Open("/v0/");
  EXPECT_EQ(v0.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(v0.status().message(), HasSubstr("'shardline-state-v0', not 'shardline-state-v1'"));
  EXPECT_THAT(v0.status().message(), HasSubstr("another prefix"));

  // Someone else's keys.
  Put("/foreign/config/x", "not ours");
  absl::StatusOr<std::unique_ptr<StateStore>> foreign = Open("/foreign/");
  EXPECT_EQ(foreign.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(foreign.status().message(),
              HasSubstr("'/foreign/config/x', which is not Shardline's"));
  EXPECT_EQ(Get("/foreign/format"), "");
  Put("/foreign2/zzz", "after state/ in key order");
  EXPECT_EQ(Open("/foreign2/").status().code(), absl::StatusCode::kFailedPrecondition);
  Put("/foreign3/leaderboard", "between leader and replicas/");
  EXPECT_EQ(Open("/foreign3/").status().code(), absl::StatusCode::kFailedPrecondition);

  // Records without a format key.
  Put("/orphan/state/job/j1", "x");
  absl::StatusOr<std::unique_ptr<StateStore>> orphan = Open("/orphan/");
  EXPECT_EQ(orphan.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(orphan.status().message(), HasSubstr("holds state records"));

  // The election's keys come first; keys next to the prefix are not under it.
  Put("/fresh/leader", "replica-a");
  Put("/fresh/replicas/replica-a", "10.0.0.1:7070");
  Put("/fresh0", "a sibling, not under /fresh/");
  Put("/fres", "a sibling, not under /fresh/");
  absl::StatusOr<std::unique_ptr<StateStore>> fresh = Open("/fresh/");
  ASSERT_TRUE(fresh.ok()) << fresh.status();
  EXPECT_EQ(Get("/fresh/format"), kEtcdStateFormat);
  EXPECT_TRUE((*fresh)->Scan("job")->empty());

  // Options.
  EXPECT_EQ(Open("").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Open("/no-slash").status().message(), HasSubstr("end with '/'"));
  EXPECT_EQ(Open("/p/", -1).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Open("/p/", 0, 1).status().message(), HasSubstr("max_txn_ops 1"));
  EtcdStoreOptions no_key;
  no_key.prefix = "/p/";
  no_key.fence_revision = 5;
  EXPECT_THAT(OpenEtcdStore(etcd_.get(), no_key).status().message(), HasSubstr("fence_key"));
}

// Not a pass/fail check: the per-Write latency on this machine, etcd (3
// members on loopback, each Write one fenced Txn, raft commit with fsync
// on a quorum) against SQLite (WAL, synchronous=FULL).
TEST_F(EtcdStoreTest, WriteLatencyAgainstSqlite) {
  ASSERT_NO_FATAL_FAILURE(StartCluster());
  const int64_t leader = Put("/lat/leader", "replica-a");
  std::unique_ptr<StateStore> on_etcd = MustOpen("/lat/", leader);
  ASSERT_NE(on_etcd, nullptr);
  const char* tmp = std::getenv("TEST_TMPDIR");
  absl::StatusOr<std::unique_ptr<StateStore>> on_sqlite =
      OpenSqliteStore(absl::StrCat(tmp != nullptr ? tmp : "/tmp", "/latency.db"));
  ASSERT_TRUE(on_sqlite.ok()) << on_sqlite.status();

  constexpr int kWrites = 100;
  auto measure = [&](StateStore& store) {
    const std::string value(300, 'v');  // about a member record
    const absl::Time start = absl::Now();
    for (int i = 0; i < kWrites; ++i) {
      absl::Status s = store.Write({Mutation::Put("job", "j1", value),
                                    Mutation::Put("member", absl::StrCat("j1/w", i % 8), value)});
      EXPECT_TRUE(s.ok()) << s;
    }
    return (absl::Now() - start) / kWrites;
  };
  const absl::Duration etcd_write = measure(*on_etcd);
  const absl::Duration sqlite_write = measure(**on_sqlite);
  const double ratio = absl::FDivDuration(etcd_write, sqlite_write);
  std::printf(
      "state store write latency (%d writes of 2 records): etcd 3 members %s, "
      "SQLite %s, etcd/SQLite %.2f\n",
      kWrites, absl::FormatDuration(etcd_write).c_str(), absl::FormatDuration(sqlite_write).c_str(),
      ratio);
  RecordProperty("etcd_write_us", static_cast<int>(absl::ToInt64Microseconds(etcd_write)));
  RecordProperty("sqlite_write_us", static_cast<int>(absl::ToInt64Microseconds(sqlite_write)));
  EXPECT_EQ(on_etcd->Scan("member")->size(), 8u);
}

}  // namespace
}  // namespace shardline::server
