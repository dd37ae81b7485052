#include "common/tls_files.h"

#include <openssl/bio.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509.h>

#include <memory>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/files.h"

namespace shardline {
namespace {

struct BioFree {
  void operator()(BIO* b) const { BIO_free(b); }
};
struct X509Free {
  void operator()(X509* x) const { X509_free(x); }
};
struct KeyFree {
  void operator()(EVP_PKEY* k) const { EVP_PKEY_free(k); }
};
using Bio = std::unique_ptr<BIO, BioFree>;
using Cert = std::unique_ptr<X509, X509Free>;
using Key = std::unique_ptr<EVP_PKEY, KeyFree>;

Bio MemoryBio(const std::string& pem) {
  return Bio(BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size())));
}

// OpenSSL's latest error as text (and clears the queue); "" when none.
std::string OpenSslReason() {
  const unsigned long code = ERR_peek_last_error();
  ERR_clear_error();
  if (code == 0) return "";
  char buf[256];
  ERR_error_string_n(code, buf, sizeof(buf));
  return absl::StrCat(" (OpenSSL: ", buf, ")");
}

// A passphrase callback that gives none: an encrypted key fails to load
// instead of prompting on the terminal.
int NoPassphrase(char*, int, int, void*) { return -1; }

Cert FirstCertificate(const std::string& pem) {
  Bio bio = MemoryBio(pem);
  return Cert(bio == nullptr ? nullptr : PEM_read_bio_X509(bio.get(), nullptr, nullptr, nullptr));
}

Key PrivateKey(const std::string& pem) {
  Bio bio = MemoryBio(pem);
  return Key(bio == nullptr ? nullptr
                            : PEM_read_bio_PrivateKey(bio.get(), nullptr, NoPassphrase, nullptr));
}

}  // namespace

absl::StatusOr<std::string> ReadPemFile(const std::string& path, absl::string_view flag,
                                        PemKind kind) {
  const std::string what = absl::StrCat(flag, " file '", path, "'");
  absl::StatusOr<std::string> text = ReadFileToString(path);
  if (!text.ok()) {
    return absl::Status(text.status().code(),
                        absl::StrCat("cannot read ", what, ": ",
                                     absl::IsNotFound(text.status()) ? "it does not exist"
                                                                     : text.status().message()));
  }
  const bool certificates = kind == PemKind::kCertificates;
  const char* wanted = certificates ? "certificates (-----BEGIN CERTIFICATE-----)"
                                    : "a private key (-----BEGIN PRIVATE KEY-----)";
  if (text->empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " is empty; it should hold ", wanted, " in PEM"));
  }
  if (!absl::StrContains(*text, "-----BEGIN")) {
    return absl::InvalidArgumentError(absl::StrCat(what, " is not PEM (no -----BEGIN line); give ",
                                                   wanted, " in PEM"));
  }
  if (certificates) {
    if (!absl::StrContains(*text, "-----BEGIN CERTIFICATE-----")) {
      return absl::InvalidArgumentError(absl::StrCat(
          what, " holds no certificate (no -----BEGIN CERTIFICATE----- block",
          absl::StrContains(*text, "PRIVATE KEY-----") ? "; it holds a private key" : "",
          "); give ", wanted));
    }
    ERR_clear_error();
    if (FirstCertificate(*text) == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat(
          what, " has a CERTIFICATE block that is not a valid certificate", OpenSslReason()));
    }
    return text;
  }
  if (!absl::StrContains(*text, "PRIVATE KEY-----")) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, " holds no private key (no -----BEGIN ... PRIVATE KEY----- block",
        absl::StrContains(*text, "-----BEGIN CERTIFICATE-----") ? "; it holds a certificate" : "",
        "); give ", wanted));
  }
  if (absl::StrContains(*text, "ENCRYPTED")) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, " holds an encrypted private key; give it unencrypted (e.g. openssl pkey -in KEY "
              "-out KEY.plain) and keep the file mode 0600"));
  }
  ERR_clear_error();
  if (PrivateKey(*text) == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " has a private key block that is not a valid key", OpenSslReason()));
  }
  return text;
}

absl::Status CheckKeyMatchesCertificate(const std::string& cert_pem, absl::string_view cert_what,
                                        const std::string& key_pem, absl::string_view key_what) {
  ERR_clear_error();
  Cert cert = FirstCertificate(cert_pem);
  Key key = PrivateKey(key_pem);
  if (cert == nullptr || key == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(
        "cannot compare ", key_what, " with ", cert_what, ": ",
        cert == nullptr ? "no certificate" : "no private key", OpenSslReason()));
  }
  if (X509_check_private_key(cert.get(), key.get()) != 1) {
    ERR_clear_error();
    return absl::InvalidArgumentError(absl::StrCat(
        key_what, " is not the private key of the certificate in ", cert_what,
        "; give the key the certificate was issued for"));
  }
  return absl::OkStatus();
}

}  // namespace shardline
