#include "server/coordinator_validation.h"

#include <random>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/text.h"
#include "spec/job_spec.h"

namespace shardline::server {

absl::Status ValidJobId(const std::string& id) {
  bool ok = !id.empty() && id.size() <= 63 && absl::ascii_islower(id[0]) && id.back() != '-';
  for (char c : id) ok = ok && (absl::ascii_islower(c) || absl::ascii_isdigit(c) || c == '-');
  if (ok) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      "job_id='", AbbreviateValue(id),
      "' is invalid; use 1..63 characters of a-z, 0-9 and '-', starting with a letter and not "
      "ending with '-' (e.g. 'shakespeare-1')"));
}

absl::Status ValidIdentity(const v1::WorkerIdentity& w, absl::string_view field) {
  if (w.job_id().empty()) {
    return absl::InvalidArgumentError(absl::StrCat(field, ".job_id is empty; name the job"));
  }
  bool printable = !w.worker_id().empty() && w.worker_id().size() <= 128;
  for (char c : w.worker_id()) printable = printable && c > ' ' && c < 127;
  if (!printable) {
    return absl::InvalidArgumentError(absl::StrCat(
        field, ".worker_id='", AbbreviateValue(w.worker_id()),
        "' is invalid; use 1..128 printable ASCII characters without spaces, e.g. 'node3:cuda:1'"));
  }
  if (w.incarnation() == 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        field, ".incarnation must be non-zero; use a random 64-bit number per process start"));
  }
  return absl::OkStatus();
}

absl::StatusOr<v1::Backend> ResolveBackend(const std::string& device, v1::Backend backend) {
  const bool cuda = absl::StartsWith(device, "cuda:");
  int index = 0;
  if (!(device == "cpu" || (cuda && absl::SimpleAtoi(device.substr(5), &index) && index >= 0))) {
    return absl::InvalidArgumentError(absl::StrCat("device='", device,
                                                   "' is invalid; use \"cpu\" or \"cuda:<index>\""));
  }
  if (absl::Status s = spec::CheckEnumValue("backend", v1::Backend_descriptor(), backend);
      !s.ok()) {
    return s;
  }
  if (backend == v1::BACKEND_UNSPECIFIED) return cuda ? v1::BACKEND_NCCL : v1::BACKEND_GLOO;
  if (backend == v1::BACKEND_NCCL && !cuda) {
    return absl::InvalidArgumentError("backend=NCCL needs a device \"cuda:<index>\"");
  }
  return backend;
}

std::string NewToken() {
  std::random_device rd;
  std::string token;
  for (int i = 0; i < 4; ++i) absl::StrAppend(&token, absl::Hex(rd(), absl::kZeroPad8));
  return token;
}

}  // namespace shardline::server
