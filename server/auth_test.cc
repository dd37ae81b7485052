#include "server/auth.h"

#include <sys/stat.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "common/clock.h"
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
  AuthenticatorTest() : auth_("admin-secret-0123456789", &clock_) {
    auth_.SetJobToken("job-a", Sha256Hex("token-a"));
    auth_.SetJobToken("job-b", Sha256Hex("token-b"));
    auth_.SetMemberToken(a0_, Sha256Hex("member-a0"));
    auth_.SetMemberToken(a1_, Sha256Hex("member-a1"));
  }

  FakeClock clock_;
  Authenticator auth_;
  const WorkerRef a0_{"job-a", "w0", 7};
  const WorkerRef a1_{"job-a", "w1", 3};
};

constexpr Access kAll[] = {Access::kAdminOnly, Access::kJobRead, Access::kJoin, Access::kMember};

TEST(Sha256HexTest, KnownDigestAndShape) {
  EXPECT_EQ(Sha256Hex("abc"),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  EXPECT_TRUE(IsSha256Hex(Sha256Hex("")));
  EXPECT_FALSE(IsSha256Hex("0123"));
  EXPECT_FALSE(IsSha256Hex(std::string(64, 'G')));
}

TEST(NewSecretTest, SixtyFourHexDigitsFreshEachTime) {
  const std::string a = NewSecret();
  const std::string b = NewSecret();
  EXPECT_TRUE(IsSha256Hex(a)) << a;  // same shape: 64 lowercase hex digits
  EXPECT_NE(a, b);
}

TEST(PeerHostTest, StripsSchemeAndPort) {
  EXPECT_EQ(PeerHost("ipv4:10.0.0.5:3456"), "10.0.0.5");
  EXPECT_EQ(PeerHost("ipv6:[::1]:3456"), "::1");
  EXPECT_EQ(PeerHost("ipv6:%5B::1%5D:3456"), "::1");
  EXPECT_EQ(PeerHost("unix:/run/x.sock"), "unix:/run/x.sock");
  EXPECT_EQ(PeerHost(""), "");
}

TEST_F(AuthenticatorTest, AdminTokenWorksEverywhere) {
  for (Access access : kAll) {
    for (const char* job : {"job-a", "job-b", "no-such-job", ""}) {
      absl::StatusOr<Principal> who =
          auth_.Authorize({"Bearer admin-secret-0123456789"}, access, job, "h", &a0_);
      ASSERT_TRUE(who.ok()) << who.status();
      EXPECT_EQ(who->kind, Principal::Kind::kAdmin);
      EXPECT_TRUE(who->is_admin());
    }
  }
}

TEST_F(AuthenticatorTest, JobTokenOnlyJoinsAndReadsItsJob) {
  for (Access access : {Access::kJobRead, Access::kJoin}) {
    absl::StatusOr<Principal> who = auth_.Authorize({"Bearer token-a"}, access, "job-a", "h", &a0_);
    ASSERT_TRUE(who.ok()) << who.status();
    EXPECT_EQ(who->kind, Principal::Kind::kJob);
    EXPECT_EQ(who->job_id, "job-a");
    EXPECT_FALSE(who->is_admin());
  }
  EXPECT_EQ(auth_.Authorize({"Bearer token-a"}, Access::kJobRead, "job-b").status().code(),
            absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(auth_.Authorize({"Bearer token-a"}, Access::kJobRead, "").status().code(),
            absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(auth_.Authorize({"Bearer token-a"}, Access::kAdminOnly, "job-a").status().code(),
            absl::StatusCode::kPermissionDenied);
  // Nothing that acts: the member token is needed.
  absl::Status acts =
      auth_.Authorize({"Bearer token-a"}, Access::kMember, "job-a", "h", &a0_).status();
  EXPECT_EQ(acts.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(std::string(acts.message()), ::testing::HasSubstr("member_token"));
}

TEST_F(AuthenticatorTest, MemberTokenActsOnlyAsItself) {
  for (Access access : {Access::kJobRead, Access::kJoin, Access::kMember}) {
    absl::StatusOr<Principal> who =
        auth_.Authorize({"Bearer member-a0"}, access, "job-a", "h", &a0_);
    ASSERT_TRUE(who.ok()) << who.status();
    EXPECT_EQ(who->kind, Principal::Kind::kMember);
    EXPECT_EQ(who->member, a0_);
    EXPECT_FALSE(who->is_admin());
  }
  // As another worker, another incarnation of itself, or nobody.
  const WorkerRef older{"job-a", "w0", 6};
  for (const WorkerRef* as : {&a1_, &older}) {
    for (Access access : {Access::kJoin, Access::kMember}) {
      absl::Status st = auth_.Authorize({"Bearer member-a0"}, access, "job-a", "h", as).status();
      EXPECT_EQ(st.code(), absl::StatusCode::kPermissionDenied) << st;
      // Names both identities.
      EXPECT_THAT(std::string(st.message()), ::testing::HasSubstr("worker 'w0' (incarnation 7)"));
      EXPECT_THAT(std::string(st.message()),
                  ::testing::HasSubstr(absl::StrCat("worker '", as->worker_id,
                                                    "' (incarnation ", as->incarnation, ")")));
    }
  }
  EXPECT_EQ(auth_.Authorize({"Bearer member-a0"}, Access::kMember, "job-a", "h", nullptr)
                .status()
                .code(),
            absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(auth_.Authorize({"Bearer member-a0"}, Access::kJobRead, "job-b").status().code(),
            absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(auth_.Authorize({"Bearer member-a0"}, Access::kAdminOnly, "job-a").status().code(),
            absl::StatusCode::kPermissionDenied);
}

TEST_F(AuthenticatorTest, NewIncarnationsTokenReplacesTheOldOne) {
  const WorkerRef next{"job-a", "w0", 8};
  auth_.SetMemberToken(next, Sha256Hex("member-a0-next"));
  EXPECT_EQ(auth_.Authorize({"Bearer member-a0"}, Access::kJobRead, "job-a").status().code(),
            absl::StatusCode::kUnauthenticated);
  EXPECT_TRUE(auth_.Authorize({"Bearer member-a0-next"}, Access::kMember, "job-a", "h", &next)
                  .ok());
  // A job's token replaced likewise.
  auth_.SetJobToken("job-b", Sha256Hex("token-b2"));
  EXPECT_EQ(auth_.Authorize({"Bearer token-b"}, Access::kJobRead, "job-b").status().code(),
            absl::StatusCode::kUnauthenticated);
  EXPECT_TRUE(auth_.Authorize({"Bearer token-b2"}, Access::kJobRead, "job-b").ok());
}

TEST_F(AuthenticatorTest, AForgottenJobsTokensAuthenticateNothing) {
  auth_.ForgetJob("job-a", {"w0", "w1"});
  for (const char* token : {"Bearer token-a", "Bearer member-a0", "Bearer member-a1"}) {
    EXPECT_EQ(auth_.Authorize({token}, Access::kJobRead, "job-a").status().code(),
              absl::StatusCode::kUnauthenticated)
        << token;
  }
  // Another job keeps its token.
  EXPECT_TRUE(auth_.Authorize({"Bearer token-b"}, Access::kJobRead, "job-b").ok());
}

TEST_F(AuthenticatorTest, MissingMalformedOrUnknownIsUnauthenticated) {
  const std::vector<std::vector<absl::string_view>> cases = {
      {},
      {"admin-secret-0123456789"},          // no scheme
      {"Basic admin-secret-0123456789"},    // wrong scheme
      {"Bearer "},                          // no token
      {"Bearer nope"},                      // unknown
      {"Bearer admin-secret-012345678"},    // prefix of the admin token
      {"Bearer admin-secret-0123456789X"},  // extension of it
      {"Bearer token-a", "Bearer token-a"},  // two values
  };
  int peer = 0;
  for (const auto& values : cases) {
    for (Access access : kAll) {
      absl::Status status =
          auth_.Authorize(values, access, "job-a", absl::StrCat("peer-", peer++), &a0_).status();
      EXPECT_EQ(status.code(), absl::StatusCode::kUnauthenticated)
          << (values.empty() ? "<none>" : values.front()) << ": " << status;
      // Never echo a token.
      EXPECT_THAT(std::string(status.message()), ::testing::Not(::testing::HasSubstr("secret")));
    }
  }
}

TEST_F(AuthenticatorTest, PermissionDeniedDoesNotLeakTheToken) {
  absl::Status status = auth_.Authorize({"Bearer token-b"}, Access::kJobRead, "job-a").status();
  EXPECT_EQ(status.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(std::string(status.message()), ::testing::Not(::testing::HasSubstr("token-b")));
  status = auth_.Authorize({"Bearer member-a0"}, Access::kMember, "job-a", "h", &a1_).status();
  EXPECT_THAT(std::string(status.message()), ::testing::Not(::testing::HasSubstr("member-a0")));
}

// Failed authentications of one host beyond the burst are refused at once,
// without a lookup (even a valid token is then refused from that host);
// other hosts and the refill are unaffected.
TEST_F(AuthenticatorTest, FailedAuthenticationsAreRateLimitedPerHost) {
  const int burst = static_cast<int>(FailureLimiter::kFailureBurst);
  for (int i = 0; i < burst; ++i) {
    EXPECT_EQ(auth_.Authorize({"Bearer wrong"}, Access::kMember, "job-a", "10.0.0.9", &a0_)
                  .status()
                  .code(),
              absl::StatusCode::kUnauthenticated)
        << i;
  }
  absl::Status limited =
      auth_.Authorize({"Bearer wrong"}, Access::kMember, "job-a", "10.0.0.9", &a0_).status();
  EXPECT_EQ(limited.code(), absl::StatusCode::kResourceExhausted) << limited;
  EXPECT_THAT(std::string(limited.message()), ::testing::HasSubstr("10.0.0.9"));
  // A valid token from the same host still works: the flood of bad ones
  // must not lock out a real worker (or the admin) behind that address.
  EXPECT_TRUE(
      auth_.Authorize({"Bearer member-a0"}, Access::kMember, "job-a", "10.0.0.9", &a0_).ok());
  EXPECT_TRUE(auth_.Authorize({"Bearer admin-secret-0123456789"}, Access::kAdminOnly, "", "10.0.0.9")
                  .ok());
  // Another host is not limited.
  EXPECT_EQ(auth_.Authorize({"Bearer wrong"}, Access::kMember, "job-a", "10.0.0.10", &a0_)
                .status()
                .code(),
            absl::StatusCode::kUnauthenticated);
  // Successes cost nothing: a host with valid tokens is never limited.
  for (int i = 0; i < 3 * burst; ++i) {
    ASSERT_TRUE(
        auth_.Authorize({"Bearer member-a0"}, Access::kMember, "job-a", "10.0.0.11", &a0_).ok());
  }
  // One failure's worth refills in 1/kFailuresPerSecond.
  clock_.Advance(absl::Seconds(1.5 / FailureLimiter::kFailuresPerSecond));
  EXPECT_EQ(auth_.Authorize({"Bearer wrong"}, Access::kMember, "job-a", "10.0.0.9", &a0_)
                .status()
                .code(),
            absl::StatusCode::kUnauthenticated);
}

TEST(FailureLimiterTest, TokenBucketRefillsAtItsRateUpToTheBurst) {
  FakeClock clock;
  FailureLimiter limiter(&clock, /*per_second=*/2, /*burst=*/4, /*max_hosts=*/100);
  for (int i = 0; i < 4; ++i) {
    ASSERT_TRUE(limiter.Allowed("h")) << i;
    limiter.NoteFailure("h");
  }
  EXPECT_FALSE(limiter.Allowed("h"));
  EXPECT_TRUE(limiter.Allowed("other"));
  clock.Advance(absl::Milliseconds(400));  // 0.8 of a failure
  EXPECT_FALSE(limiter.Allowed("h"));
  clock.Advance(absl::Milliseconds(100));  // 1.0
  EXPECT_TRUE(limiter.Allowed("h"));
  limiter.NoteFailure("h");
  EXPECT_FALSE(limiter.Allowed("h"));
  // A long pause refills up to the burst, never beyond it.
  clock.Advance(absl::Hours(1));
  for (int i = 0; i < 4; ++i) {
    ASSERT_TRUE(limiter.Allowed("h")) << i;
    limiter.NoteFailure("h");
  }
  EXPECT_FALSE(limiter.Allowed("h"));
}

TEST(FailureLimiterTest, TableIsBoundedAndForgetsRefilledHosts) {
  FakeClock clock;
  FailureLimiter limiter(&clock, /*per_second=*/1, /*burst=*/2, /*max_hosts=*/3);
  for (const char* h : {"a", "b", "c"}) {
    limiter.NoteFailure(h);
    limiter.NoteFailure(h);
  }
  EXPECT_EQ(limiter.tracked_hosts(), 3u);
  // Full table, nobody refilled: a new host is not tracked (allowed).
  limiter.NoteFailure("d");
  limiter.NoteFailure("d");
  EXPECT_EQ(limiter.tracked_hosts(), 3u);
  EXPECT_TRUE(limiter.Allowed("d"));
  EXPECT_FALSE(limiter.Allowed("a"));
  // Once the others refilled they are forgotten to make room.
  clock.Advance(absl::Seconds(2));
  limiter.NoteFailure("d");
  EXPECT_EQ(limiter.tracked_hosts(), 1u);
}

TEST(AdminTokenTest, ShortOrBlankTokensAreRefusedNamingTheSource) {
  EXPECT_TRUE(CheckAdminToken("", "--admin-token").ok());  // authentication off
  EXPECT_TRUE(CheckAdminToken("0123456789abcdef", "--admin-token").ok());
  absl::Status s = CheckAdminToken("0123456789abcde", "SHARDLINE_ADMIN_TOKEN");
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()),
              ::testing::HasSubstr("SHARDLINE_ADMIN_TOKEN is 15 bytes; an admin token needs at "
                                   "least 16"));
  EXPECT_EQ(CheckAdminToken("0123456789 abcdef", "--admin-token").code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(AdminTokenTest, FileMustBePrivateAndLosesOneTrailingNewline) {
  const char* tmp = std::getenv("TEST_TMPDIR");
  const std::string path = std::string(tmp != nullptr ? tmp : "/tmp") + "/admin-token-unit";
  auto write = [&](const std::string& content, mode_t mode) {
    std::remove(path.c_str());
    std::ofstream(path) << content;
    ASSERT_EQ(chmod(path.c_str(), mode), 0);
  };
  write("0123456789abcdef-token\r\n", 0600);
  absl::StatusOr<std::string> t = ReadAdminTokenFile(path);
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(*t, "0123456789abcdef-token");
  write("0123456789abcdef-token\n", 0640);
  t = ReadAdminTokenFile(path);
  EXPECT_EQ(t.status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(std::string(t.status().message()), ::testing::HasSubstr("has mode 0640"));
  write("\n", 0400);
  EXPECT_EQ(ReadAdminTokenFile(path).status().code(), absl::StatusCode::kInvalidArgument);
  write("short\n", 0600);
  EXPECT_THAT(std::string(ReadAdminTokenFile(path).status().message()),
              ::testing::HasSubstr("is 5 bytes"));
  EXPECT_EQ(ReadAdminTokenFile(path + ".missing").status().code(), absl::StatusCode::kNotFound);
}

TEST(AuthenticatorDisabledTest, NoAdminTokenAcceptsEverything) {
  FakeClock clock;
  Authenticator auth("", &clock);
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
