// The coordinator's input checks: job ids, worker identities, devices and
// backends, worker tokens.
#include "server/coordinator_validation.h"

#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace shardline::server {
namespace {

using ::testing::HasSubstr;
using ::testing::MatchesRegex;

v1::WorkerIdentity Identity(const std::string& job, const std::string& worker,
                            uint64_t incarnation) {
  v1::WorkerIdentity w;
  w.set_job_id(job);
  w.set_worker_id(worker);
  w.set_incarnation(incarnation);
  return w;
}

TEST(ValidJobIdTest, AcceptsLowercaseIdsStartingWithALetter) {
  EXPECT_TRUE(ValidJobId("shakespeare-1").ok());
  EXPECT_TRUE(ValidJobId("a").ok());
  EXPECT_TRUE(ValidJobId(std::string(63, 'a')).ok());
}

TEST(ValidJobIdTest, RefusesOthersNamingTheValue) {
  for (const std::string& bad : {std::string(""), std::string("1job"), std::string("job-"),
                                 std::string("Job"), std::string("job_1"), std::string(64, 'a')}) {
    absl::Status s = ValidJobId(bad);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_THAT(s.message(), HasSubstr("job_id='")) << bad;
    EXPECT_THAT(s.message(), HasSubstr("1..63 characters of a-z, 0-9 and '-'")) << bad;
  }
  EXPECT_THAT(ValidJobId("job_1").message(), HasSubstr("job_id='job_1' is invalid"));
}

TEST(ValidIdentityTest, NamesTheField) {
  EXPECT_TRUE(ValidIdentity(Identity("job", "node3:cuda:1", 7), "worker").ok());
  absl::Status no_job = ValidIdentity(Identity("", "w", 7), "fence.worker");
  EXPECT_EQ(no_job.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(no_job.message(), "fence.worker.job_id is empty; name the job");
  absl::Status spaced = ValidIdentity(Identity("job", "my worker", 7), "worker");
  EXPECT_EQ(spaced.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(spaced.message(), HasSubstr("worker.worker_id='my worker' is invalid"));
  EXPECT_EQ(ValidIdentity(Identity("job", "", 7), "worker").code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ValidIdentity(Identity("job", std::string(129, 'w'), 7), "worker").code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(ValidIdentity(Identity("job", std::string(128, 'w'), 7), "worker").ok());
  absl::Status zero = ValidIdentity(Identity("job", "w", 0), "worker");
  EXPECT_EQ(zero.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(zero.message(), HasSubstr("worker.incarnation must be non-zero"));
}

TEST(ResolveBackendTest, PicksFromTheDeviceAndRefusesMismatches) {
  EXPECT_EQ(*ResolveBackend("cpu", v1::BACKEND_UNSPECIFIED), v1::BACKEND_GLOO);
  EXPECT_EQ(*ResolveBackend("cuda:0", v1::BACKEND_UNSPECIFIED), v1::BACKEND_NCCL);
  EXPECT_EQ(*ResolveBackend("cuda:3", v1::BACKEND_GLOO), v1::BACKEND_GLOO);
  EXPECT_EQ(*ResolveBackend("cuda:1", v1::BACKEND_NCCL), v1::BACKEND_NCCL);
  absl::StatusOr<v1::Backend> nccl_on_cpu = ResolveBackend("cpu", v1::BACKEND_NCCL);
  EXPECT_EQ(nccl_on_cpu.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(nccl_on_cpu.status().message(), "backend=NCCL needs a device \"cuda:<index>\"");
  for (const char* bad : {"gpu", "cuda:", "cuda:-1", "cuda:x", ""}) {
    absl::StatusOr<v1::Backend> b = ResolveBackend(bad, v1::BACKEND_UNSPECIFIED);
    EXPECT_EQ(b.status().code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_THAT(b.status().message(), HasSubstr("use \"cpu\" or \"cuda:<index>\"")) << bad;
  }
}

// Issue 14 defect 11: backend=77 was accepted and later named "" in the
// "backend  differs from worker ..." error.
TEST(ResolveBackendTest, UnknownBackendValueIsRefusedNamingTheChoices) {
  for (const char* device : {"cpu", "cuda:0"}) {
    absl::StatusOr<v1::Backend> b = ResolveBackend(device, static_cast<v1::Backend>(77));
    ASSERT_FALSE(b.ok()) << device;
    EXPECT_EQ(b.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(b.status().message(),
              "backend=77 is not a Backend; use one of BACKEND_NCCL (1), BACKEND_GLOO (2), or "
              "leave it unset (BACKEND_UNSPECIFIED, 0)");
  }
}

TEST(NewTokenTest, ThirtyTwoHexDigitsFreshEachTime) {
  const std::string a = NewToken();
  const std::string b = NewToken();
  EXPECT_THAT(a, MatchesRegex("[0-9a-f]{32}"));
  EXPECT_THAT(b, MatchesRegex("[0-9a-f]{32}"));
  EXPECT_NE(a, b);
}

}  // namespace
}  // namespace shardline::server
