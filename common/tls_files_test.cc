// The TLS flag files: each wrong file is named with what is wrong with it
// (issue 14 defect 12: the coordinator said "bad TLS files?" instead).
#include "common/tls_files.h"

#include <cstdlib>
#include <fstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace shardline {
namespace {

using ::testing::HasSubstr;

struct Pki {
  std::string dir, ca_crt, server_crt, server_key, other_key;
};

// A CA, a server certificate signed by it, and an unrelated key (openssl(1)).
const Pki& TestPki() {
  static const Pki* const pki = [] {
    auto* p = new Pki;
    p->dir = ::testing::TempDir() + "/tls-files-pki";
    const std::string ec = "-newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes";
    const std::string script = absl::StrCat(
        "set -e; mkdir -p ", p->dir, "; cd ", p->dir, "; ",
        "openssl req -x509 ", ec, " -keyout ca.key -out ca.crt -days 2 -subj /CN=test-ca; ",
        "openssl req ", ec, " -keyout server.key -out server.csr -subj /CN=localhost; ",
        "openssl x509 -req -in server.csr -CA ca.crt -CAkey ca.key -CAcreateserial "
        "-out server.crt -days 2; ",
        "openssl genpkey -algorithm ec -pkeyopt ec_paramgen_curve:prime256v1 -out other.key",
        " > openssl.log 2>&1");
    EXPECT_EQ(std::system(script.c_str()), 0) << "openssl failed; see " << p->dir;
    p->ca_crt = p->dir + "/ca.crt";
    p->server_crt = p->dir + "/server.crt";
    p->server_key = p->dir + "/server.key";
    p->other_key = p->dir + "/other.key";
    return p;
  }();
  return *pki;
}

std::string Write(const std::string& name, const std::string& contents) {
  const std::string path = TestPki().dir + "/" + name;
  std::ofstream(path, std::ios::binary) << contents;
  return path;
}

std::string Read(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

TEST(ReadPemFileTest, GoodFilesAreReturnedWhole) {
  const Pki& pki = TestPki();
  absl::StatusOr<std::string> cert = ReadPemFile(pki.server_crt, "--tls-cert", PemKind::kCertificates);
  ASSERT_TRUE(cert.ok()) << cert.status();
  EXPECT_EQ(*cert, Read(pki.server_crt));
  absl::StatusOr<std::string> key = ReadPemFile(pki.server_key, "--tls-key", PemKind::kPrivateKey);
  ASSERT_TRUE(key.ok()) << key.status();
  EXPECT_EQ(*key, Read(pki.server_key));
  // A bundle of several certificates is fine.
  const std::string bundle = Write("bundle.crt", Read(pki.ca_crt) + Read(pki.server_crt));
  EXPECT_TRUE(ReadPemFile(bundle, "--tls-ca", PemKind::kCertificates).ok());
}

TEST(ReadPemFileTest, EachBadFileIsNamedWithItsReason) {
  const Pki& pki = TestPki();
  struct Case {
    std::string path;
    PemKind kind;
    absl::StatusCode code;
    std::string message;
  };
  const std::string missing = pki.dir + "/missing.crt";
  const std::string empty = Write("empty.pem", "");
  const std::string text = Write("text.pem", "hello, I am not a certificate\n");
  const std::string garbled = Write(
      "garbled.crt", "-----BEGIN CERTIFICATE-----\nAAAAAAAA\n-----END CERTIFICATE-----\n");
  const std::string garbled_key = Write(
      "garbled.key", "-----BEGIN PRIVATE KEY-----\nAAAAAAAA\n-----END PRIVATE KEY-----\n");
  const std::string encrypted = Write(
      "encrypted.key",
      "-----BEGIN ENCRYPTED PRIVATE KEY-----\nAAAAAAAA\n-----END ENCRYPTED PRIVATE KEY-----\n");
  const Case cases[] = {
      {missing, PemKind::kCertificates, absl::StatusCode::kNotFound,
       absl::StrCat("cannot read --flag file '", missing, "': it does not exist")},
      {empty, PemKind::kCertificates, absl::StatusCode::kInvalidArgument,
       absl::StrCat("--flag file '", empty, "' is empty")},
      {text, PemKind::kPrivateKey, absl::StatusCode::kInvalidArgument,
       absl::StrCat("--flag file '", text, "' is not PEM (no -----BEGIN line)")},
      {pki.server_key, PemKind::kCertificates, absl::StatusCode::kInvalidArgument,
       absl::StrCat("--flag file '", pki.server_key,
                    "' holds no certificate (no -----BEGIN CERTIFICATE----- block; it holds a "
                    "private key)")},
      {pki.server_crt, PemKind::kPrivateKey, absl::StatusCode::kInvalidArgument,
       absl::StrCat("--flag file '", pki.server_crt,
                    "' holds no private key (no -----BEGIN ... PRIVATE KEY----- block; it holds "
                    "a certificate)")},
      {garbled, PemKind::kCertificates, absl::StatusCode::kInvalidArgument,
       absl::StrCat("--flag file '", garbled,
                    "' has a CERTIFICATE block that is not a valid certificate (OpenSSL: ")},
      {garbled_key, PemKind::kPrivateKey, absl::StatusCode::kInvalidArgument,
       absl::StrCat("--flag file '", garbled_key,
                    "' has a private key block that is not a valid key")},
      {encrypted, PemKind::kPrivateKey, absl::StatusCode::kInvalidArgument,
       absl::StrCat("--flag file '", encrypted, "' holds an encrypted private key")},
      {pki.dir, PemKind::kCertificates, absl::StatusCode::kFailedPrecondition,
       absl::StrCat("cannot read --flag file '", pki.dir, "'")},
  };
  for (const Case& c : cases) {
    absl::StatusOr<std::string> got = ReadPemFile(c.path, "--flag", c.kind);
    ASSERT_FALSE(got.ok()) << c.path;
    EXPECT_EQ(got.status().code(), c.code) << got.status();
    EXPECT_THAT(std::string(got.status().message()), ::testing::StartsWith(c.message));
  }
}

TEST(CheckKeyMatchesCertificateTest, OnlyTheCertificatesOwnKeyMatches) {
  const Pki& pki = TestPki();
  const std::string cert = Read(pki.server_crt);
  EXPECT_TRUE(CheckKeyMatchesCertificate(cert, "C", Read(pki.server_key), "K").ok());
  absl::Status wrong = CheckKeyMatchesCertificate(cert, "--tls-cert file 'server.crt'",
                                                  Read(pki.other_key), "--tls-key file 'other.key'");
  EXPECT_EQ(wrong.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(wrong.message(),
            "--tls-key file 'other.key' is not the private key of the certificate in --tls-cert "
            "file 'server.crt'; give the key the certificate was issued for");
}

}  // namespace
}  // namespace shardline
