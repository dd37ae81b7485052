#include "common/grpc_backup_poll.h"

#include <cstdlib>
#include <string>

namespace shardline {
namespace {

// Static initialisation: single-threaded, before main() and before gRPC
// reads its configuration (grpc_backup_poll.h).
const bool kBackupPollSet = [] {
  ::setenv(kBackupPollIntervalVariable, std::to_string(kBackupPollIntervalMs).c_str(),
           /*overwrite=*/0);
  return true;
}();

}  // namespace
}  // namespace shardline
