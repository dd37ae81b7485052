#include "fuzz/spec_fuzz_target.h"

#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "fuzz/check.h"
#include "google/protobuf/util/json_util.h"
#include "google/protobuf/util/message_differencer.h"
#include "spec/job_spec.h"
#include "spec/spec_file.h"

namespace shardline::fuzz {

int FuzzJobSpec(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  static constexpr spec::SpecFormat kFormats[] = {spec::SpecFormat::kAuto,
                                                  spec::SpecFormat::kYaml,
                                                  spec::SpecFormat::kJson};
  const spec::SpecFormat format = kFormats[data[0] % 3];
  const std::string text(reinterpret_cast<const char*>(data + 1), size - 1);
  absl::StatusOr<v1::JobSpec> parsed = spec::ParseJobSpec(text, format, "<fuzz>");
  if (!parsed.ok()) {
    CheckOrDie(!parsed.status().message().empty(), "a parse error without a message");
    return 0;
  }
  absl::StatusOr<v1::JobSpec> resolved = spec::ResolveJobSpec(*parsed);
  if (!resolved.ok()) {
    CheckOrDie(!resolved.status().message().empty(), "a validation error without a message");
    return 0;
  }
  absl::StatusOr<v1::JobSpec> again = spec::ResolveJobSpec(*resolved);
  CheckOrDie(again.ok(), "a resolved spec fails to resolve again");
  CheckOrDie(google::protobuf::util::MessageDifferencer::Equals(*again, *resolved),
             "ResolveJobSpec is not idempotent");

  std::string json;
  CheckOrDie(google::protobuf::util::MessageToJsonString(*resolved, &json).ok(),
             "a resolved spec cannot be printed as JSON");
  absl::StatusOr<v1::JobSpec> reparsed = spec::ParseJobSpec(json, spec::SpecFormat::kJson,
                                                            "<fuzz json>");
  CheckOrDie(reparsed.ok(), "the JSON of a resolved spec does not parse", json);
  CheckOrDie(google::protobuf::util::MessageDifferencer::Equals(*reparsed, *resolved),
             "the JSON of a resolved spec parses to another spec", json);

  const int available = static_cast<int>(resolved->elastic().max_workers());
  if (std::optional<int> dp = spec::ChooseDp(*resolved, available)) {
    // A plan may legitimately be refused (e.g. too large); it must not crash.
    (void)spec::PlanGeneration(*resolved, *dp);
  }
  return 0;
}

}  // namespace shardline::fuzz
