// Linking //common:grpc_backup_poll sets gRPC's backup poll interval before
// main() (the test environment does not set it).
#include "common/grpc_backup_poll.h"

#include <cstdlib>
#include <string>

#include "gtest/gtest.h"

namespace shardline {
namespace {

TEST(GrpcBackupPollTest, SetBeforeMain) {
  const char* value = std::getenv(kBackupPollIntervalVariable);
  ASSERT_NE(value, nullptr);
  EXPECT_EQ(std::string(value), std::to_string(kBackupPollIntervalMs));
}

}  // namespace
}  // namespace shardline
