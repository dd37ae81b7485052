// Job spec files: a v1::JobSpec written in YAML or JSON, as operators keep
// them next to their launch scripts (deploy/jobs/*.yaml).
//
//   absl::StatusOr<v1::JobSpec> spec = ReadJobSpecFile("deploy/jobs/shakespeare.yaml");
//   if (!spec.ok()) return spec.status();  // "….yaml:14:3: unknown field 'elastic.hearbeat'; …"
//
// The file holds the JobSpec's fields at top level (name, model, parallel,
// training, data, checkpoint, elastic) under the proto's names, snake_case
// (`hidden_size`) or lowerCamel (`hiddenSize`). YAML is turned into JSON and
// read with protobuf's JSON parser, so the rules are proto3 JSON's, with a
// few conveniences checked first, each with an error naming the field (and,
// for YAML, its line):
//   * durations are strings with a unit: "10s", "500ms", "2m", "1h30m";
//     a bare number is an error (its unit would be a guess);
//   * enums take the full name (SCHEDULE_ONE_F_ONE_B), the name without its
//     prefix in any case (one_f_one_b, fp32), or the number; Schedule also
//     takes "1f1b" as `shardctl plan --schedule` does;
//   * integers must be whole and in range for their field (uint32: 0..2^32-1);
//   * an unknown field, a duplicate key or a value of the wrong kind is
//     InvalidArgument, never silently ignored.
// Pure functions over their inputs (plus the file read); thread-safe.
#ifndef SHARDLINE_SPEC_SPEC_FILE_H_
#define SHARDLINE_SPEC_SPEC_FILE_H_

#include <string>

#include "absl/status/statusor.h"
#include "google/protobuf/message.h"
#include "shardline/v1/job.pb.h"

namespace shardline::spec {

enum class SpecFormat {
  kAuto,  // .json → JSON, .yaml/.yml → YAML; otherwise JSON when the text starts with '{'.
  kYaml,
  kJson,
};

// Reads and parses the spec file at `path`. Errors:
//   NotFound: no file at `path` (the message names the path).
//   FailedPrecondition: the file exists but cannot be read (permissions, a
//     directory), naming the path and the OS error.
//   InvalidArgument: a syntax error or a field problem, as
//     "<path>:<line>:<column>: <what> ..." (JSON: "<path>: ...").
absl::StatusOr<v1::JobSpec> ReadJobSpecFile(const std::string& path,
                                            SpecFormat format = SpecFormat::kAuto);

// Parses `text` as a JobSpec; `source` names it in messages (a path or
// "<stdin>"). Errors as ReadJobSpecFile's InvalidArgument.
absl::StatusOr<v1::JobSpec> ParseJobSpec(const std::string& text, SpecFormat format,
                                         const std::string& source);

// The generic form: parses `text` into `message` (cleared first), checking
// field names and values against its descriptor as described above.
absl::Status ParseSpecMessage(const std::string& text, SpecFormat format,
                              const std::string& source, google::protobuf::Message* message);

}  // namespace shardline::spec

#endif  // SHARDLINE_SPEC_SPEC_FILE_H_
