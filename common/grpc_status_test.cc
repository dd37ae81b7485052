#include "common/grpc_status.h"

#include <string>

#include "common/text.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace shardline {
namespace {

// A status message over kMaxStatusMessageBytes keeps its start (which names
// the field) and is cut on a UTF-8 boundary.
TEST(GrpcStatusTest, LongStatusMessagesAreCappedKeepingTheStart) {
  std::string message = "spec.x='";
  for (int i = 0; i < 5000; ++i) message += "\xc3\xa9";  // e-acute, 2 bytes
  message += "' is invalid";
  const grpc::Status g = ToGrpcStatus(absl::InvalidArgumentError(message));
  EXPECT_EQ(g.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_LE(g.error_message().size(), kMaxStatusMessageBytes);
  EXPECT_GT(g.error_message().size(), kMaxStatusMessageBytes - 4);
  EXPECT_EQ(g.error_message().rfind("spec.x='\xc3\xa9", 0), 0u);
  EXPECT_THAT(g.error_message(), ::testing::EndsWith("... (message truncated, 10020 bytes)"));
  EXPECT_TRUE(IsDisplayText(g.error_message()));
  // At the limit: unchanged.
  const std::string exact(kMaxStatusMessageBytes, 'm');
  EXPECT_EQ(ToGrpcStatus(absl::NotFoundError(exact)).error_message(), exact);
}

TEST(GrpcStatusTest, StatusMappingIsOneToOne) {
  for (int code = 0; code <= 16; ++code) {
    absl::Status s(static_cast<absl::StatusCode>(code), code == 0 ? "" : "msg");
    grpc::Status g = ToGrpcStatus(s);
    EXPECT_EQ(static_cast<int>(g.error_code()), code);
    EXPECT_EQ(FromGrpcStatus(g), s);
  }
}

}  // namespace
}  // namespace shardline
