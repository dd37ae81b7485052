// FakeCoordinatorServiceClient: an in-memory client::CoordinatorServiceClient
// for unit tests of what prints a coordinator's status (shardctl status):
// answers the status (or the error) it was given, and counts the calls.
//
//   FakeCoordinatorServiceClient fake;
//   fake.status = ...;                 // or fake.error = absl::UnavailableError(...)
//   ... RunStatus(fake, ...) ...
//
// Thread-safety: thread-compatible (set the fields before the calls).
#ifndef SHARDLINE_TESTING_FAKE_COORDINATOR_SERVICE_CLIENT_H_
#define SHARDLINE_TESTING_FAKE_COORDINATOR_SERVICE_CLIENT_H_

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "client/coordinator_service_client.h"
#include "shardline/v1/coordinator.grpc.pb.h"

namespace shardline::client::testing {

class FakeCoordinatorServiceClient final : public CoordinatorServiceClient {
 public:
  absl::StatusOr<v1::CoordinatorStatus> GetStatus(const v1::GetStatusRequest&) override {
    ++calls;
    if (!error.ok()) return error;
    return status;
  }

  v1::CoordinatorStatus status;
  absl::Status error;  // non-OK: GetStatus returns it
  int calls = 0;
};

}  // namespace shardline::client::testing

#endif  // SHARDLINE_TESTING_FAKE_COORDINATOR_SERVICE_CLIENT_H_
