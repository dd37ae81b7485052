#include "server/auth.h"

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace shardline::server {
namespace {

TEST(ConstantTimeEqualsTest, ComparesContentAndLength) {
  EXPECT_TRUE(ConstantTimeEquals("", ""));
  EXPECT_TRUE(ConstantTimeEquals("abc", "abc"));
  EXPECT_FALSE(ConstantTimeEquals("abc", "abd"));
  EXPECT_FALSE(ConstantTimeEquals("abc", "ab"));
  EXPECT_FALSE(ConstantTimeEquals("ab", "abc"));
  EXPECT_FALSE(ConstantTimeEquals("", "a"));
  // A prefix padded with NUL must not compare equal.
  EXPECT_FALSE(ConstantTimeEquals(std::string("ab\0", 3), "ab"));
}

TEST(ParseBearerTest, AcceptsBearerCaseInsensitively) {
  EXPECT_EQ(ParseBearer("Bearer tok-1"), std::optional<absl::string_view>("tok-1"));
  EXPECT_EQ(ParseBearer("bearer tok-1"), std::optional<absl::string_view>("tok-1"));
  EXPECT_EQ(ParseBearer("BEARER   tok-1"), std::optional<absl::string_view>("tok-1"));
}

TEST(ParseBearerTest, RejectsMalformed) {
  for (const char* bad : {"", "Bearer", "Bearer ", "Bearer  ", "Basic abc", "Bearertok",
                          "Bearer a b", "Bearer a\tb", "Token abc"}) {
    EXPECT_EQ(ParseBearer(bad), std::nullopt) << bad;
  }
}

class AuthenticatorTest : public ::testing::Test {
 protected:
  AuthenticatorTest()
      : auth_("admin-secret",
              {[this](absl::string_view job) -> std::optional<std::string> {
                 auto it = worker_tokens_.find(std::string(job));
                 if (it == worker_tokens_.end()) return std::nullopt;
                 return it->second;
               },
               [this] {
                 std::vector<std::string> ids;
                 for (const auto& [job, t] : worker_tokens_) ids.push_back(job);
                 return ids;
               }}) {}

  std::map<std::string, std::string> worker_tokens_ = {{"job-a", "token-a"},
                                                       {"job-b", "token-b"}};
  Authenticator auth_;
};

TEST_F(AuthenticatorTest, AdminTokenWorksEverywhere) {
  for (Access access : {Access::kAdminOnly, Access::kWorker}) {
    for (const char* job : {"job-a", "job-b", "no-such-job", ""}) {
      absl::StatusOr<Principal> who = auth_.Authorize({"Bearer admin-secret"}, access, job);
      ASSERT_TRUE(who.ok()) << who.status();
      EXPECT_EQ(who->kind, Principal::Kind::kAdmin);
      EXPECT_TRUE(who->is_admin());
    }
  }
}

TEST_F(AuthenticatorTest, WorkerTokenOnlyForItsJobAndWorkerRpcs) {
  absl::StatusOr<Principal> who = auth_.Authorize({"Bearer token-a"}, Access::kWorker, "job-a");
  ASSERT_TRUE(who.ok()) << who.status();
  EXPECT_EQ(who->kind, Principal::Kind::kWorker);
  EXPECT_EQ(who->job_id, "job-a");
  EXPECT_FALSE(who->is_admin());

  EXPECT_EQ(auth_.Authorize({"Bearer token-a"}, Access::kWorker, "job-b").status().code(),
            absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(auth_.Authorize({"Bearer token-a"}, Access::kWorker, "").status().code(),
            absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(auth_.Authorize({"Bearer token-a"}, Access::kAdminOnly, "job-a").status().code(),
            absl::StatusCode::kPermissionDenied);
}

TEST_F(AuthenticatorTest, MissingMalformedOrUnknownIsUnauthenticated) {
  const std::vector<std::vector<absl::string_view>> cases = {
      {},
      {"admin-secret"},          // no scheme
      {"Basic admin-secret"},    // wrong scheme
      {"Bearer "},               // no token
      {"Bearer nope"},           // unknown
      {"Bearer admin-secre"},    // prefix of the admin token
      {"Bearer admin-secretX"},  // extension of it
      {"Bearer token-a", "Bearer token-a"},  // two values
  };
  for (const auto& values : cases) {
    for (Access access : {Access::kAdminOnly, Access::kWorker}) {
      absl::Status status = auth_.Authorize(values, access, "job-a").status();
      EXPECT_EQ(status.code(), absl::StatusCode::kUnauthenticated)
          << (values.empty() ? "<none>" : values.front()) << ": " << status;
      // Never echo a token.
      EXPECT_THAT(std::string(status.message()), ::testing::Not(::testing::HasSubstr("secret")));
    }
  }
}

TEST_F(AuthenticatorTest, PermissionDeniedDoesNotLeakTheToken) {
  absl::Status status = auth_.Authorize({"Bearer token-b"}, Access::kWorker, "job-a").status();
  EXPECT_EQ(status.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(std::string(status.message()), ::testing::Not(::testing::HasSubstr("token-b")));
}

TEST(AuthenticatorDisabledTest, NoAdminTokenAcceptsEverything) {
  Authenticator auth("", {});
  EXPECT_FALSE(auth.enabled());
  for (const std::vector<absl::string_view>& values :
       std::vector<std::vector<absl::string_view>>{{}, {"garbage"}, {"Bearer x"}}) {
    absl::StatusOr<Principal> who = auth.Authorize(values, Access::kAdminOnly, "j");
    ASSERT_TRUE(who.ok());
    EXPECT_EQ(who->kind, Principal::Kind::kAnonymous);
    EXPECT_TRUE(who->is_admin());
  }
}

}  // namespace
}  // namespace shardline::server
