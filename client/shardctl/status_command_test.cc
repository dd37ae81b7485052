// shardctl status: the text and JSON forms of a CoordinatorStatus (from a
// fake CoordinatorServiceClient), its errors, and the command end to end
// against loopback replicas (testing/fake_replica.h) given as a list.
#include "client/shardctl/status_command.h"

#include <sstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "client/shardctl/job_commands.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "testing/fake_coordinator_service_client.h"
#include "testing/fake_replica.h"

namespace shardline::shardctl {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

constexpr int64_t kMidnight = 1796169600;  // 2026-12-02T00:00:00Z

v1::CoordinatorStatus EtcdStatus() {
  v1::CoordinatorStatus s;
  s.set_state("etcd://e1:2379,e2:2379/shardline");
  s.set_replica_id("r2");
  s.set_leader_address("10.0.0.1:7070");
  s.mutable_lease_ttl()->set_seconds(2);
  v1::Replica* r1 = s.add_replicas();
  r1->set_replica_id("r1");
  r1->set_address("10.0.0.1:7070");
  r1->set_role(v1::REPLICA_ROLE_LEADER);
  r1->mutable_leader_since()->set_seconds(kMidnight);
  r1->mutable_start_time()->set_seconds(kMidnight - 3600);
  v1::Replica* r2 = s.add_replicas();
  r2->set_replica_id("r2");
  r2->set_address("10.0.0.2:7070");
  r2->set_role(v1::REPLICA_ROLE_FOLLOWER);
  r2->mutable_start_time()->set_seconds(kMidnight - 3599);
  v1::Replica* r3 = s.add_replicas();
  r3->set_replica_id("r3");
  r3->set_address("10.0.0.3:7070");
  r3->set_role(v1::REPLICA_ROLE_CANDIDATE);
  v1::EtcdMemberStatus* e1 = s.add_etcd();
  e1->set_endpoint("e1:2379");
  e1->set_healthy(true);
  e1->set_is_leader(true);
  e1->set_version("3.4.23");
  e1->set_db_size_bytes(1 << 20);
  e1->set_raft_term(5);
  v1::EtcdMemberStatus* e2 = s.add_etcd();
  e2->set_endpoint("e2:2379");
  e2->set_error("context deadline exceeded");
  return s;
}

TEST(FormatCoordinatorStatusTest, ReplicasLeaderAndEtcdMembers) {
  EXPECT_EQ(FormatCoordinatorStatus(EtcdStatus()),
            "Answered by:  r2\n"
            "State:        etcd://e1:2379,e2:2379/shardline\n"
            "Leader:       10.0.0.1:7070\n"
            "Lease TTL:    2s\n"
            "\n"
            "REPLICA  ADDRESS        ROLE       LEADER SINCE          STARTED\n"
            "r1       10.0.0.1:7070  LEADER     2026-12-02T00:00:00Z  2026-12-01T23:00:00Z\n"
            "r2       10.0.0.2:7070  FOLLOWER   -                     2026-12-01T23:00:01Z\n"
            "r3       10.0.0.3:7070  CANDIDATE  -                     -\n"
            "\n"
            "ETCD MEMBER  HEALTHY  LEADER  VERSION   DB SIZE  RAFT TERM  ERROR\n"
            "e1:2379      yes      yes     3.4.23   1.00 MiB          5\n"
            "e2:2379      no       -       -               -          -  context deadline "
            "exceeded\n");
}

TEST(FormatCoordinatorStatusTest, SingleCoordinatorOnSqliteHasNoEtcdOrLease) {
  v1::CoordinatorStatus s;
  s.set_state("sqlite:/var/lib/shardline/state.db");
  s.set_replica_id("127.0.0.1:7070");
  s.set_leader_address("127.0.0.1:7070");
  v1::Replica* r = s.add_replicas();
  r->set_replica_id("127.0.0.1:7070");
  r->set_address("127.0.0.1:7070");
  r->set_role(v1::REPLICA_ROLE_LEADER);
  r->mutable_leader_since()->set_seconds(kMidnight);
  r->mutable_start_time()->set_seconds(kMidnight);
  const std::string text = FormatCoordinatorStatus(s);
  EXPECT_EQ(text,
            "Answered by:  127.0.0.1:7070\n"
            "State:        sqlite:/var/lib/shardline/state.db\n"
            "Leader:       127.0.0.1:7070\n"
            "\n"
            "REPLICA         ADDRESS         ROLE    LEADER SINCE          STARTED\n"
            "127.0.0.1:7070  127.0.0.1:7070  LEADER  2026-12-02T00:00:00Z  2026-12-02T00:00:00Z\n");
}

TEST(FormatCoordinatorStatusTest, NoLeaderKnownAndEscapedText) {
  v1::CoordinatorStatus s;
  s.set_state("etcd://e1:2379/p");
  s.set_replica_id("r1\x1b[2J");
  const std::string text = FormatCoordinatorStatus(s);
  EXPECT_THAT(text, HasSubstr("Leader:       none known"));
  EXPECT_THAT(text, HasSubstr("Answered by:  r1\\x1b[2J"));
  EXPECT_THAT(text, Not(HasSubstr("\x1b")));
  EXPECT_THAT(text, HasSubstr("No replicas registered."));
}

TEST(FormatCoordinatorStatusTest, SaysWhyOnlyTheAnsweringReplicaIsListed) {
  v1::CoordinatorStatus s;
  s.set_replica_id("r1");
  v1::Replica* r = s.add_replicas();
  r->set_replica_id("r1");
  r->set_address("127.0.0.1:7070");
  r->set_role(v1::REPLICA_ROLE_CANDIDATE);
  s.set_replicas_error("etcd at 127.0.0.1:2379: connection refused");
  EXPECT_THAT(FormatCoordinatorStatus(s),
              HasSubstr("Only the answering replica is listed: etcd at 127.0.0.1:2379: "
                        "connection refused\n"));
}

TEST(PrintCoordinatorStatusTest, JsonHasTheProtoFieldNames) {
  client::testing::FakeCoordinatorServiceClient fake;
  fake.status = EtcdStatus();
  std::ostringstream out;
  ASSERT_TRUE(PrintCoordinatorStatus(fake, /*json=*/true, out).ok());
  const nlohmann::json j = nlohmann::json::parse(out.str());
  EXPECT_EQ(j["leader_address"], "10.0.0.1:7070");
  EXPECT_EQ(j["state"], "etcd://e1:2379,e2:2379/shardline");
  EXPECT_EQ(j["lease_ttl"], "2s");
  ASSERT_EQ(j["replicas"].size(), 3u);
  EXPECT_EQ(j["replicas"][0]["role"], "REPLICA_ROLE_LEADER");
  EXPECT_EQ(j["replicas"][0]["leader_since"], "2026-12-02T00:00:00Z");
  ASSERT_EQ(j["etcd"].size(), 2u);
  EXPECT_EQ(j["etcd"][0]["db_size_bytes"], "1048576");  // int64 is a string in proto JSON
  EXPECT_EQ(j["etcd"][1]["healthy"], false);
  EXPECT_EQ(j["etcd"][1]["error"], "context deadline exceeded");
  EXPECT_EQ(fake.calls, 1);
}

TEST(PrintCoordinatorStatusTest, ErrorWritesNothing) {
  client::testing::FakeCoordinatorServiceClient fake;
  fake.error = absl::PermissionDeniedError("GetStatus needs the admin token");
  std::ostringstream out;
  absl::Status s = PrintCoordinatorStatus(fake, false, out);
  EXPECT_EQ(s.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(out.str(), "");
}

TEST(StatusCommandTest, AsksTheFirstReplicaThatAnswers) {
  client::testing::FakeReplica dead("dead"), follower("follower");
  const std::string dead_address = dead.address();
  dead.Stop();
  follower.Follow("10.0.0.1:7070");
  v1::CoordinatorStatus status;
  status.set_replica_id("follower");
  status.set_leader_address("10.0.0.1:7070");
  follower.SetStatus(status);
  std::ostringstream out;
  absl::Status s = RunCoordinatorCommand(
      "status", {"--coordinator", absl::StrCat(dead_address, ",", follower.address())}, out);
  ASSERT_TRUE(s.ok()) << s;
  EXPECT_THAT(out.str(), HasSubstr("Answered by:  follower\n"));
  EXPECT_THAT(out.str(), HasSubstr("Leader:       10.0.0.1:7070\n"));
  EXPECT_EQ(follower.Calls("GetStatus"), 1);
}

TEST(StatusCommandTest, UsageErrors) {
  std::ostringstream out;
  absl::Status s = RunCoordinatorCommand("status", {"extra"}, out);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("shardctl status takes no arguments (got 'extra')"));
  s = RunCoordinatorCommand("status", {"--coordinator", "a:1,a:1"}, out);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("--coordinator lists a:1 twice"));
  EXPECT_TRUE(IsCoordinatorCommand("status"));
  std::ostringstream help;
  ASSERT_TRUE(RunCoordinatorCommand("status", {"--help"}, help).ok());
  EXPECT_THAT(help.str(), HasSubstr("Usage: shardctl status [--json]"));
  EXPECT_THAT(help.str(), HasSubstr("comma-separated"));
}

}  // namespace
}  // namespace shardline::shardctl
