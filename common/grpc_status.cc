#include "common/grpc_status.h"

#include <string>

#include "absl/strings/str_cat.h"

namespace shardline {

grpc::Status ToGrpcStatus(const absl::Status& status) {
  if (status.ok()) return grpc::Status::OK;
  // absl::StatusCode and grpc::StatusCode are the same canonical numbers.
  const auto code = static_cast<grpc::StatusCode>(static_cast<int>(status.code()));
  const absl::string_view message = status.message();
  if (message.size() <= kMaxStatusMessageBytes) return grpc::Status(code, std::string(message));
  const std::string suffix = absl::StrCat("... (message truncated, ", message.size(), " bytes)");
  size_t keep = kMaxStatusMessageBytes - suffix.size();
  // Not inside a UTF-8 sequence: back up over continuation bytes.
  while (keep > 0 && (static_cast<unsigned char>(message[keep]) & 0xC0) == 0x80) --keep;
  return grpc::Status(code, absl::StrCat(message.substr(0, keep), suffix));
}

absl::Status FromGrpcStatus(const grpc::Status& status) {
  if (status.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(static_cast<int>(status.error_code())),
                      status.error_message());
}

}  // namespace shardline
