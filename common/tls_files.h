// The PEM files behind the TLS flags (--tls-cert, --tls-key, --tls-ca,
// --tls-client-ca), read and checked before gRPC sees them, so that a bad
// file is reported by name and reason instead of as a failed listen or
// handshake.
//
//   absl::StatusOr<std::string> cert = ReadPemFile(path, "--tls-cert", PemKind::kCertificates);
//   absl::StatusOr<std::string> key = ReadPemFile(key_path, "--tls-key", PemKind::kPrivateKey);
//   absl::Status s = CheckKeyMatchesCertificate(*cert, path, *key, key_path);
//
// OpenSSL's libcrypto parses the PEM (linked with gRPC already).
// Thread-safe (no state).
#ifndef SHARDLINE_COMMON_TLS_FILES_H_
#define SHARDLINE_COMMON_TLS_FILES_H_

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace shardline {

enum class PemKind {
  kCertificates,  // one or more "-----BEGIN CERTIFICATE-----" blocks (a chain, a CA bundle)
  kPrivateKey,    // one private key ("BEGIN PRIVATE KEY", "BEGIN RSA/EC PRIVATE KEY")
};

// The contents of the PEM file at `path`, given by `flag` (e.g. "--tls-key"),
// checked to hold what `kind` says in a form OpenSSL can parse (an
// encrypted key is refused: nothing could type its passphrase). Errors,
// each naming the flag and the path:
//   NotFound "cannot read <flag> file '<path>': No such file ..." (missing);
//   PermissionDenied and others from FileError (common/files.h): unreadable;
//   InvalidArgument: empty, not PEM (no "-----BEGIN" line), PEM of another
//     kind (e.g. a key given as the certificate), or a block OpenSSL cannot
//     parse (its reason appended).
absl::StatusOr<std::string> ReadPemFile(const std::string& path, absl::string_view flag,
                                        PemKind kind);

// InvalidArgument unless the private key `key_pem` (from `key_what`, e.g.
// "--tls-key file 'k.pem'") is the key of the first certificate in
// `cert_pem` (from `cert_what`); both must have passed ReadPemFile.
absl::Status CheckKeyMatchesCertificate(const std::string& cert_pem, absl::string_view cert_what,
                                        const std::string& key_pem, absl::string_view key_what);

}  // namespace shardline

#endif  // SHARDLINE_COMMON_TLS_FILES_H_
