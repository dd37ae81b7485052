// JobService.WhatIf over the in-process server with authentication: a read
// of the job's state (admin, the job's worker token or one of its member
// tokens; another job's token is refused), limits before the coordinator,
// errors as coordinator.proto says, and nothing changes.
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/rpc/coordinator_server.h"
#include "testing/grpc_test_util.h"

namespace shardline::server {
namespace {

using ::testing::ElementsAre;
using testing::Harness;
using ::testing::HasSubstr;
using testing::JoinAll;
using testing::Prepare;
using testing::SimWorker;
using testing::SmallSpec;

constexpr char kAdmin[] = "admin-token-0123456789";

grpc::Status WhatIfAs(Harness& h, const std::string& token, const std::string& job_id,
                      const std::vector<std::string>& lose, v1::WhatIfResponse* resp) {
  auto jobs = v1::JobService::NewStub(h.Channel());
  v1::WhatIfRequest req;
  req.set_job_id(job_id);
  for (const std::string& w : lose) req.add_lose_worker_ids(w);
  grpc::ClientContext ctx;
  Prepare(&ctx, token, absl::Seconds(10));
  return jobs->WhatIf(&ctx, req, resp);
}

TEST(WhatIfRpcTest, AReadOfTheJobWithItsTokensAndLimitsFirst) {
  Harness h(kAdmin);
  // Two workers of three (min 2, max 2 ranks): a spare covers a lost rank.
  const std::string token =
      testing::CreateJobAs(h.Channel(), kAdmin, "job-a", SmallSpec(2, 2, 4)).worker_token();
  const std::string other =
      testing::CreateJobAs(h.Channel(), kAdmin, "job-b", SmallSpec(1, 1, 4)).worker_token();
  ASSERT_FALSE(token.empty());
  SimWorker w0(h.Channel(), "job-a", "w0", 1, token);
  SimWorker w1(h.Channel(), "job-a", "w1", 1, token);
  for (const absl::StatusOr<v1::Assignment>& a : JoinAll({&w0, &w1}, /*open_session=*/true)) {
    ASSERT_TRUE(a.ok()) << a.status();
  }
  SimWorker spare(h.Channel(), "job-a", "s0", 1, token);
  ASSERT_TRUE(spare.Join().ok());

  v1::WhatIfResponse r;
  EXPECT_EQ(WhatIfAs(h, "", "job-a", {"w1"}, &r).error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(WhatIfAs(h, other, "job-a", {"w1"}, &r).error_code(),
            grpc::StatusCode::PERMISSION_DENIED);
  for (const std::string& t : {std::string(kAdmin), token, w0.member_token()}) {
    r.Clear();
    grpc::Status s = WhatIfAs(h, t, "job-a", {"w1"}, &r);
    ASSERT_TRUE(s.ok()) << s.error_message();
    EXPECT_TRUE(r.generation_ends());
    EXPECT_TRUE(r.spares_cover());
    EXPECT_THAT(r.spares_used(), ElementsAre("s0"));
    EXPECT_THAT(r.new_worker_ids(), ElementsAre("w0", "s0"));
    EXPECT_EQ(r.new_world_size(), 2u);
  }
  // Nothing changed.
  EXPECT_EQ(h.coordinator().GetJob("job-a")->generation(), 1u);
  EXPECT_EQ(h.coordinator().GetJob("job-a")->phase(), v1::JOB_PHASE_RUNNING);

  // Limits come first (server/limits.h), then the coordinator's checks.
  std::vector<std::string> many;
  for (int i = 0; i <= 1024; ++i) many.push_back(absl::StrCat("w", i));
  grpc::Status s = WhatIfAs(h, token, "job-a", many, &r);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(s.error_message(), HasSubstr("kMaxWhatIfWorkers"));
  s = WhatIfAs(h, token, "job-a", {std::string(129, 'x')}, &r);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(s.error_message(), HasSubstr("kMaxWorkerIdBytes"));
  s = WhatIfAs(h, kAdmin, "", {"w1"}, &r);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  s = WhatIfAs(h, token, "job-a", {}, &r);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(s.error_message(), HasSubstr("lose_worker_ids is empty"));
  s = WhatIfAs(h, token, "job-a", {"w1", "w1"}, &r);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  s = WhatIfAs(h, token, "job-a", {"nobody"}, &r);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_THAT(s.error_message(), HasSubstr("'nobody'"));
  s = WhatIfAs(h, kAdmin, "job-c", {"w1"}, &r);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::NOT_FOUND);
  // job-b has not formed (nobody joined).
  s = WhatIfAs(h, other, "job-b", {"w1"}, &r);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
}

}  // namespace
}  // namespace shardline::server
