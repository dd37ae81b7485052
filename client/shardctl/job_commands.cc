#include "client/shardctl/job_commands.h"

#include <map>
#include <optional>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/flags.h"
#include "common/text.h"
#include "client/shardctl/checkpoint_tools.h"
#include "client/shardctl/command.h"
#include "client/coordinator_client.h"
#include "client/shardctl/job_format.h"
#include "client/shardctl/status_command.h"
#include "spec/spec_file.h"
#include "client/shardctl/table.h"

namespace shardline::shardctl {
namespace {

// ListJobs and ListCheckpoints: pages of up to 1000 entries; a bound on the
// number of pages guards against a coordinator that keeps answering a token.
constexpr uint32_t kPageSize = 1000;
constexpr int kMaxPages = 1000;

// ---------------------------------------------------------------- job ----

constexpr char kJobUsage[] =
    "Usage:\n"
    "  shardctl job create SPEC_FILE [--id ID]   create a job from a YAML or JSON JobSpec\n"
    "  shardctl job get ID                       show one job\n"
    "  shardctl job list [--phase P[,P...]]      list jobs, newest first\n"
    "  shardctl job cancel ID [--reason TEXT]    cancel a job (already cancelled: says so,\n"
    "                                            exit 0; already COMPLETED/FAILED: exit 1)\n"
    "Example spec: deploy/jobs/shakespeare.yaml\n";

constexpr char kCreateUsage[] =
    "Usage: shardctl job create SPEC_FILE [--id ID] [--json]\n"
    "  SPEC_FILE is a v1.JobSpec in YAML (.yaml/.yml) or JSON (.json), e.g.\n"
    "  deploy/jobs/shakespeare.yaml. Prints the job and its worker token, once.\n";

absl::Status JobCreate(const std::vector<std::string>& args, std::ostream& out) {
  Command c("shardctl job create");
  std::string id;
  c.parser.AddString("id", &id, "job id (1-63 of a-z, 0-9, '-'); default: the coordinator picks");
  auto positional = c.Parse(args, kCreateUsage, out);
  if (!positional.ok()) return positional.status();
  if (!positional->has_value()) return absl::OkStatus();
  const std::vector<std::string>& pos = **positional;
  if (pos.size() != 1) {
    return Usage(pos.empty() ? "job create needs a spec file, e.g. 'shardctl job create "
                               "deploy/jobs/shakespeare.yaml --id shakespeare'"
                             : absl::StrCat("job create takes one spec file; got ", pos.size(),
                                            " arguments: ", absl::StrJoin(pos, " ")),
                 kCreateUsage);
  }
  if (c.parser.WasSet("id")) {
    if (absl::Status s = CheckJobId(id, "--id="); !s.ok()) return s;
  }
  absl::StatusOr<v1::JobSpec> spec = spec::ReadJobSpecFile(pos[0]);
  if (!spec.ok()) return spec.status();
  auto client = c.Connect();
  if (!client.ok()) return client.status();
  // CreateJob with an existing --id and the same spec answers that job and
  // its token (retries are safe) exactly as if it had created it; ask
  // first, so the output can say nothing was created. (A create by someone
  // else between the two calls reads as ours: harmless.)
  bool already_existed = false;
  if (!id.empty()) {
    v1::GetJobRequest get;
    get.set_job_id(id);
    already_existed = client->jobs->GetJob(get).ok();
  }
  v1::CreateJobRequest request;
  request.set_job_id(id);
  *request.mutable_spec() = *spec;
  absl::StatusOr<v1::CreateJobResponse> response = client->jobs->CreateJob(request);
  if (!response.ok()) {
    const absl::Status& s = response.status();
    // The coordinator names spec fields "spec.model...": say which file.
    if (s.code() == absl::StatusCode::kInvalidArgument && absl::StrContains(s.message(), "spec.")) {
      return absl::InvalidArgumentError(absl::StrCat(pos[0], ": ", s.message()));
    }
    if (s.code() == absl::StatusCode::kAlreadyExists) {
      return absl::AlreadyExistsError(
          absl::StrCat(s.message(), " (--id); 'shardctl job get ", id, "' shows it"));
    }
    if (s.code() == absl::StatusCode::kInvalidArgument && absl::StartsWith(s.message(), "job_id=")) {
      return absl::InvalidArgumentError(absl::StrCat(
          s.message(), c.parser.WasSet("id") ? " (--id)" : "; give the job an id with --id"));
    }
    return s;
  }
  Print(out, c.json ? ProtoToJson(*response) : FormatCreatedJob(*response, already_existed));
  return absl::OkStatus();
}

absl::Status JobGet(const std::vector<std::string>& args, std::ostream& out) {
  constexpr char kUsage[] = "Usage: shardctl job get ID [--json]\n";
  Command c("shardctl job get");
  auto positional = c.Parse(args, kUsage, out);
  if (!positional.ok()) return positional.status();
  if (!positional->has_value()) return absl::OkStatus();
  if ((*positional)->size() != 1) {
    return Usage("job get takes one job id, e.g. 'shardctl job get shakespeare'", kUsage);
  }
  auto client = c.Connect();
  if (!client.ok()) return client.status();
  v1::GetJobRequest request;
  request.set_job_id((**positional)[0]);
  absl::StatusOr<v1::Job> job = client->jobs->GetJob(request);
  if (!job.ok()) return WithJobHint(job.status());
  if (c.json) {
    Print(out, ProtoToJson(*job));
    return absl::OkStatus();
  }
  // Before the first generation forms, who has joined says how formation
  // stands (FormatJob); without it the job still prints.
  std::optional<v1::ListMembersResponse> members;
  if (job->world_size() == 0 && job->phase() == v1::JOB_PHASE_PENDING) {
    v1::ListMembersRequest list;
    list.set_job_id(job->job_id());
    absl::StatusOr<v1::ListMembersResponse> listed = client->jobs->ListMembers(list);
    if (listed.ok()) members = *std::move(listed);
  }
  Print(out, FormatJob(*job, members.has_value() ? &*members : nullptr));
  return absl::OkStatus();
}

absl::StatusOr<std::vector<v1::JobPhase>> ParsePhases(const std::string& text) {
  std::vector<std::string> names;
  for (int i = 1; i < v1::JobPhase_descriptor()->value_count(); ++i) {
    names.push_back(absl::AsciiStrToLower(
        EnumName(v1::JobPhase_descriptor(), v1::JobPhase_descriptor()->value(i)->number())));
  }
  std::vector<v1::JobPhase> phases;
  for (absl::string_view part : absl::StrSplit(text, ',')) {
    std::string word = absl::AsciiStrToUpper(absl::StripAsciiWhitespace(part));
    if (absl::StartsWith(word, "JOB_PHASE_")) word = word.substr(10);
    if (word == "CANCELED") word = "CANCELLED";
    v1::JobPhase phase;
    if (word.empty() || word == "UNSPECIFIED" ||
        !v1::JobPhase_Parse(absl::StrCat("JOB_PHASE_", word), &phase)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--phase='", text, "': '", std::string(absl::StripAsciiWhitespace(part)),
          "' is not a job phase; choose from ", absl::StrJoin(names, ", "),
          " (several: --phase running,recovering)"));
    }
    phases.push_back(phase);
  }
  return phases;
}

absl::Status JobList(const std::vector<std::string>& args, std::ostream& out) {
  constexpr char kUsage[] = "Usage: shardctl job list [--phase P[,P...]] [--json]\n";
  Command c("shardctl job list");
  std::string phase;
  c.parser.AddString("phase", &phase,
                     "only jobs in these phases: pending, running, recovering, completed, "
                     "failed, cancelled (comma-separated)");
  auto positional = c.Parse(args, kUsage, out);
  if (!positional.ok()) return positional.status();
  if (!positional->has_value()) return absl::OkStatus();
  if (!(*positional)->empty()) {
    return Usage(absl::StrCat("job list takes no arguments; got '", (**positional)[0],
                              "' (filter with --phase)"),
                 kUsage);
  }
  v1::ListJobsRequest request;
  request.set_page_size(kPageSize);
  if (c.parser.WasSet("phase")) {
    absl::StatusOr<std::vector<v1::JobPhase>> phases = ParsePhases(phase);
    if (!phases.ok()) return phases.status();
    for (v1::JobPhase p : *phases) request.add_phases(p);
  }
  auto client = c.Connect();
  if (!client.ok()) return client.status();
  v1::ListJobsResponse all;
  for (int page = 0; page < kMaxPages; ++page) {
    absl::StatusOr<v1::ListJobsResponse> response = client->jobs->ListJobs(request);
    if (!response.ok()) return response.status();
    for (v1::Job& job : *response->mutable_jobs()) *all.add_jobs() = std::move(job);
    if (response->next_page_token().empty()) break;
    request.set_page_token(response->next_page_token());
  }
  if (!c.json) {
    Print(out, FormatJobList(all.jobs()));
    return absl::OkStatus();
  }
  // One job protobuf cannot print (e.g. stored by an older coordinator that
  // did not check its durations) must not hide the others: they are
  // printed, it is named, and the exit code says the listing is incomplete.
  std::vector<std::string> unprintable;
  Print(out, JobListJson(all, &unprintable));
  if (!unprintable.empty()) {
    return absl::DataLossError(absl::StrCat(
        unprintable.size(), " of ", all.jobs_size(),
        " jobs could not be printed as JSON and are left out of the listing above: ",
        absl::StrJoin(unprintable, "; "), "; see them with `shardctl job get ID` (text)"));
  }
  return absl::OkStatus();
}

absl::Status JobCancel(const std::vector<std::string>& args, std::ostream& out) {
  constexpr char kUsage[] =
      "Usage: shardctl job cancel ID [--reason TEXT] [--json]\n"
      "  Stops every worker of the job; the job ends CANCELLED with the reason.\n"
      "  A job that is already CANCELLED is left as it is: says so and exits 0 (as\n"
      "  'kubectl cordon' of a cordoned node). A job that already ended COMPLETED or\n"
      "  FAILED cannot be cancelled: an error naming its phase, exit 1.\n";
  Command c("shardctl job cancel");
  std::string reason;
  c.parser.AddString("reason", &reason, "why, for humans; becomes the job's phase reason");
  auto positional = c.Parse(args, kUsage, out);
  if (!positional.ok()) return positional.status();
  if (!positional->has_value()) return absl::OkStatus();
  if ((*positional)->size() != 1) {
    return Usage("job cancel takes one job id, e.g. 'shardctl job cancel shakespeare --reason "
                 "\"bad data\"'",
                 kUsage);
  }
  auto client = c.Connect();
  if (!client.ok()) return client.status();
  // CancelJob answers a cancelled job as it is (retries are safe), so ask
  // first to tell the operator nothing changed. COMPLETED and FAILED are the
  // coordinator's FAILED_PRECONDITION ("job 'x' already COMPLETED; nothing to
  // cancel"). The cancel is still sent: the coordinator checks the reason
  // the same way whatever the phase.
  v1::GetJobRequest get;
  get.set_job_id((**positional)[0]);
  absl::StatusOr<v1::Job> before = client->jobs->GetJob(get);
  if (!before.ok()) return WithJobHint(before.status());
  v1::CancelJobRequest request;
  request.set_job_id((**positional)[0]);
  request.set_reason(reason);
  absl::StatusOr<v1::Job> job = client->jobs->CancelJob(request);
  if (!job.ok()) return WithJobHint(job.status());
  if (before->phase() == v1::JOB_PHASE_CANCELLED) {
    Print(out, c.json ? ProtoToJson(*before)
                      : absl::StrCat("job ", before->job_id(), " is already CANCELLED",
                                     before->phase_reason().empty()
                                         ? ""
                                         : absl::StrCat(" (", Printable(before->phase_reason()),
                                                        ")"),
                                     "; nothing to do"));
    return absl::OkStatus();
  }
  Print(out, c.json ? ProtoToJson(*job) : FormatJob(*job));
  return absl::OkStatus();
}

absl::Status Job(const std::vector<std::string>& args, std::ostream& out) {
  if (args.empty()) return Usage("job needs a subcommand: create, get, list or cancel", kJobUsage);
  const std::string& sub = args[0];
  const std::vector<std::string> rest(args.begin() + 1, args.end());
  if (sub == "create") return JobCreate(rest, out);
  if (sub == "get") return JobGet(rest, out);
  if (sub == "list") return JobList(rest, out);
  if (sub == "cancel") return JobCancel(rest, out);
  if (sub == "--help" || sub == "-h" || sub == "help") {
    out << kJobUsage << "\n" << kConnectionHelp;
    return absl::OkStatus();
  }
  return Usage(absl::StrCat("unknown job subcommand '", sub,
                            "'; choose create, get, list or cancel"),
               kJobUsage);
}

// ----------------------------------------------------- job inspection ----

// The commands that take exactly one JOB argument.
absl::StatusOr<std::string> OneJob(Command& c, const std::vector<std::string>& args,
                                   const char* usage, const char* example, std::ostream& out,
                                   bool* help) {
  auto positional = c.Parse(args, usage, out);
  if (!positional.ok()) return positional.status();
  *help = !positional->has_value();
  if (*help) return std::string();
  if ((*positional)->size() != 1) {
    return Usage(absl::StrCat("takes one job id, e.g. '", example, "'"), usage);
  }
  return (**positional)[0];
}

absl::Status Drain(const std::vector<std::string>& args, std::ostream& out) {
  constexpr char kUsage[] =
      "Usage: shardctl drain JOB WORKER_ID [--reason TEXT] [--force] [--json]\n"
      "Takes the worker out at a step boundary: the job saves a checkpoint after its next\n"
      "step, then re-forms without the worker, which stops and leaves (exit 0). Refused\n"
      "when fewer than min_workers live workers would stay, unless --force.\n";
  Command c("shardctl drain");
  std::string reason;
  c.parser.AddString("reason", &reason, "why, for humans; recorded in the member's detail");
  bool force = false;
  c.parser.AddBool("force", &force,
                   "drain even if fewer than min_workers live workers would stay");
  auto positional = c.Parse(args, kUsage, out);
  if (!positional.ok()) return positional.status();
  if (!positional->has_value()) return absl::OkStatus();
  if ((*positional)->size() != 2) {
    return Usage("drain takes a job id and a worker id, e.g. 'shardctl drain shakespeare "
                 "node3:cpu --reason \"kernel upgrade\"'",
                 kUsage);
  }
  auto client = c.Connect();
  if (!client.ok()) return client.status();
  v1::DrainWorkerRequest request;
  request.set_job_id((**positional)[0]);
  request.set_worker_id((**positional)[1]);
  request.set_reason(reason);
  request.set_force(force);
  absl::StatusOr<v1::Member> member = client->jobs->DrainWorker(request);
  if (!member.ok()) return WithJobHint(member.status());
  if (c.json) {
    Print(out, ProtoToJson(*member));
  } else {
    // The member's detail already reads "draining (REASON): leaves after the
    // next checkpoint commits" or "drained: REASON"; say it once, from the
    // fields.
    Print(out, member->state() == v1::MEMBER_STATE_LEFT
                   ? absl::StrCat(Printable(member->worker_id()), ": left the job",
                                  member->detail().empty()
                                      ? ""
                                      : absl::StrCat(" (", Printable(member->detail()), ")"))
                   : absl::StrCat(Printable(member->worker_id()), ": draining",
                                  member->drain_reason().empty()
                                      ? ""
                                      : absl::StrCat(" (", Printable(member->drain_reason()), ")"),
                                  "; leaves after the next checkpoint commits"));
  }
  return absl::OkStatus();
}

absl::Status Members(const std::vector<std::string>& args, std::ostream& out) {
  constexpr char kUsage[] = "Usage: shardctl members JOB [--json]\n";
  Command c("shardctl members");
  bool help = false;
  absl::StatusOr<std::string> job =
      OneJob(c, args, kUsage, "shardctl members shakespeare", out, &help);
  if (!job.ok() || help) return job.status();
  auto client = c.Connect();
  if (!client.ok()) return client.status();
  v1::ListMembersRequest request;
  request.set_job_id(*job);
  absl::StatusOr<v1::ListMembersResponse> response = client->jobs->ListMembers(request);
  if (!response.ok()) return WithJobHint(response.status());
  Print(out, c.json ? ProtoToJson(*response) : FormatMembers(*job, *response));
  return absl::OkStatus();
}

// WhatIfRequest.lose_worker_ids' limits (kMaxWhatIfWorkers,
// kMaxWorkerIdBytes in server/limits.h), checked here to name the flag.
constexpr size_t kMaxWhatIfWorkers = 1024;
constexpr size_t kMaxWorkerIdBytes = 128;

constexpr char kWhatIfUsage[] =
    "Usage: shardctl whatif JOB --lose WORKER[,WORKER...] [--json]\n"
    "  What losing these workers at once would do to the job, changing nothing: their\n"
    "  ranks and ZeRO shards, whether the generation ends, which spares would take the\n"
    "  lost ranks or how far dp shrinks (new world, dp, gradient accumulation and\n"
    "  ranks), whether the job falls below what it needs, the checkpoint it would\n"
    "  restore and the steps trained again. WORKER is a worker id as 'shardctl members\n"
    "  JOB' lists it; 1 to 1024 of them, each once (--lose may also be repeated), e.g.\n"
    "  'shardctl whatif shakespeare --lose node3:cpu,node4:cpu'.\n";

// The worker ids of every --lose value: comma-separated, spaces around a
// name ignored (worker ids have none). InvalidArgument naming --lose: none
// given, an empty name, a name that is no worker id, too many, a repeat.
absl::StatusOr<std::vector<std::string>> ParseLose(const std::vector<std::string>& values,
                                                   bool given) {
  if (!given) {
    return Usage("whatif needs --lose WORKER[,WORKER...]: the workers to suppose lost, as "
                 "'shardctl members JOB' lists them, e.g. --lose node3:cpu",
                 kWhatIfUsage);
  }
  std::vector<std::string> ids;
  std::map<std::string, size_t> seen;  // id -> its position, from 1
  for (const std::string& value : values) {
    if (absl::StripAsciiWhitespace(value).empty()) {
      return Usage("--lose is empty; give 1 to 1024 worker ids, comma-separated, e.g. "
                   "--lose node3:cpu,node4:cpu",
                   kWhatIfUsage);
    }
    for (absl::string_view part : absl::StrSplit(value, ',')) {
      const std::string id(absl::StripAsciiWhitespace(part));
      const size_t position = ids.size() + 1;
      if (id.empty()) {
        return Usage(absl::StrCat("--lose='", AbbreviateValue(value), "': worker ", position,
                                  " is empty; separate worker ids by single commas, e.g. "
                                  "--lose node3:cpu,node4:cpu"),
                     kWhatIfUsage);
      }
      bool printable = id.size() <= kMaxWorkerIdBytes;
      for (char c : id) printable = printable && c > ' ' && c < 127;
      if (!printable) {
        return Usage(absl::StrCat("--lose: '", AbbreviateValue(id),
                                  "' is not a worker id: 1 to 128 printable ASCII characters "
                                  "without spaces"),
                     kWhatIfUsage);
      }
      if (auto [it, inserted] = seen.emplace(id, position); !inserted) {
        return Usage(absl::StrCat("--lose names '", id, "' twice (workers ", it->second, " and ",
                                  position, "); name each worker once"),
                     kWhatIfUsage);
      }
      ids.push_back(id);
    }
  }
  if (ids.size() > kMaxWhatIfWorkers) {
    return Usage(absl::StrCat("--lose names ", ids.size(), " workers; at most ", kMaxWhatIfWorkers,
                              " can be supposed lost at once"),
                 kWhatIfUsage);
  }
  return ids;
}

absl::Status WhatIf(const std::vector<std::string>& args, std::ostream& out) {
  Command c("shardctl whatif");
  std::vector<std::string> lose;
  c.parser.AddStrings("lose", &lose,
                      "worker ids to suppose lost, comma-separated (1 to 1024; may repeat)",
                      "WORKER[,WORKER...]");
  bool help = false;
  absl::StatusOr<std::string> job = OneJob(c, args, kWhatIfUsage,
                                           "shardctl whatif shakespeare --lose node3:cpu", out,
                                           &help);
  if (!job.ok() || help) return job.status();
  absl::StatusOr<std::vector<std::string>> ids = ParseLose(lose, c.parser.WasSet("lose"));
  if (!ids.ok()) return ids.status();
  auto client = c.Connect();
  if (!client.ok()) return client.status();
  v1::WhatIfRequest request;
  request.set_job_id(*job);
  for (const std::string& id : *ids) request.add_lose_worker_ids(id);
  absl::StatusOr<v1::WhatIfResponse> response = client->jobs->WhatIf(request);
  if (!response.ok()) {
    const absl::Status& s = response.status();
    // A worker the job never had: the user typed it in --lose.
    if (s.code() == absl::StatusCode::kNotFound && absl::StartsWith(s.message(), "no worker ")) {
      return absl::NotFoundError(absl::StrCat("--lose: ", s.message()));
    }
    return WithJobHint(s);
  }
  Print(out, c.json ? ProtoToJson(*response) : FormatWhatIf(*response));
  return absl::OkStatus();
}

absl::Status Topology(const std::vector<std::string>& args, std::ostream& out) {
  constexpr char kUsage[] =
      "Usage: shardctl topology JOB [--json]\n"
      "  The process groups and pipeline stages of the job's latest formed generation\n"
      "  (--json: the full plan, with schedule, ZeRO units and memory per rank).\n";
  Command c("shardctl topology");
  bool help = false;
  absl::StatusOr<std::string> job =
      OneJob(c, args, kUsage, "shardctl topology shakespeare", out, &help);
  if (!job.ok() || help) return job.status();
  auto client = c.Connect();
  if (!client.ok()) return client.status();
  v1::GetPlanRequest request;
  request.set_job_id(*job);
  absl::StatusOr<v1::Plan> plan = client->jobs->GetPlan(request);
  if (!plan.ok()) {
    // An external job never has a plan: the coordinator's message says so.
    if (plan.status().code() == absl::StatusCode::kFailedPrecondition &&
        !absl::StrContains(plan.status().message(), "(spec.external)")) {
      return absl::FailedPreconditionError(absl::StrCat(
          plan.status().message(), "; the topology exists once the first generation forms "
          "('shardctl members ", *job, "' shows who has joined)"));
    }
    return WithJobHint(plan.status());
  }
  Print(out, c.json ? ProtoToJson(*plan) : FormatTopology(*plan));
  return absl::OkStatus();
}

absl::Status Owner(const std::vector<std::string>& args, std::ostream& out) {
  constexpr char kUsage[] =
      "Usage: shardctl owner JOB PARAMETER [--element I] [--json]\n"
      "  Which ranks hold the parameter's values, gradients and optimizer states in the\n"
      "  job's latest formed generation, e.g. 'shardctl owner shakespeare\n"
      "  layers.2.mlp.fc1.weight --element 1000'.\n";
  Command c("shardctl owner");
  int64_t element = 0;
  c.parser.AddInt("element", &element,
                  "only holders of this element (row-major index into the unsplit parameter)");
  auto positional = c.Parse(args, kUsage, out);
  if (!positional.ok()) return positional.status();
  if (!positional->has_value()) return absl::OkStatus();
  if ((*positional)->size() != 2) {
    return Usage("owner takes a job id and a parameter name, e.g. 'shardctl owner shakespeare "
                 "layers.0.mlp.fc1.weight'",
                 kUsage);
  }
  v1::GetShardOwnerRequest request;
  request.set_job_id((**positional)[0]);
  request.set_parameter((**positional)[1]);
  if (c.parser.WasSet("element")) {
    if (element < 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--element=", element, " is negative; give an element index >= 0"));
    }
    request.set_element_index(static_cast<uint64_t>(element));
  }
  auto client = c.Connect();
  if (!client.ok()) return client.status();
  absl::StatusOr<v1::GetShardOwnerResponse> response = client->jobs->GetShardOwner(request);
  if (!response.ok()) return response.status();
  Print(out, c.json ? ProtoToJson(*response) : FormatShardOwner(*response));
  return absl::OkStatus();
}

// ---------------------------------------------------------- checkpoint ----

constexpr char kCheckpointUsage[] =
    "Usage:\n"
    "  shardctl checkpoint list JOB [--all]       the job's checkpoints, newest step first\n"
    "                                             (also spelled 'shardctl checkpoints JOB')\n"
    "  shardctl checkpoint show JOB [ID] [--tensors]\n"
    "                                             one checkpoint's manifest (default: the\n"
    "                                             newest committed); --json prints it whole\n"
    "  shardctl checkpoint verify JOB [ID]        re-read every shard file and piece and check\n"
    "                                             the checksums and the coverage\n"
    "  shardctl checkpoint verify --dir DIR       the same offline, from DIR/manifest.json\n"
    "  shardctl checkpoint consolidate JOB [ID] --out FILE [--optimizer]\n"
    "                                             write one unsharded safetensors file\n"
    "  shardctl checkpoint consolidate --dir DIR --out FILE [--optimizer]\n"
    "                                             the same offline\n";

// `checkpoint list` and its old spelling `checkpoints`: ListCheckpoints, all
// pages.
absl::Status CheckpointList(const std::vector<std::string>& args, std::ostream& out,
                            const char* name) {
  constexpr char kUsage[] =
      "Usage: shardctl checkpoint list JOB [--all] [--json]\n"
      "  The job's checkpoints, newest step first; --all includes aborted ones.\n"
      "  'shardctl checkpoints JOB' is the same command.\n";
  Command c(name);
  bool all = false;
  c.parser.AddBool("all", &all, "include aborted checkpoints");
  bool help = false;
  absl::StatusOr<std::string> job =
      OneJob(c, args, kUsage, "shardctl checkpoint list shakespeare", out, &help);
  if (!job.ok() || help) return job.status();
  auto client = c.Connect();
  if (!client.ok()) return client.status();
  v1::ListCheckpointsRequest request;
  request.set_job_id(*job);
  request.set_include_aborted(all);
  request.set_page_size(kPageSize);
  v1::ListCheckpointsResponse every;
  for (int page = 0; page < kMaxPages; ++page) {
    absl::StatusOr<v1::ListCheckpointsResponse> response =
        client->checkpoints->ListCheckpoints(request);
    if (!response.ok()) return WithJobHint(response.status());
    for (auto& summary : *response->mutable_checkpoints()) {
      *every.add_checkpoints() = std::move(summary);
    }
    if (response->next_page_token().empty()) break;
    request.set_page_token(response->next_page_token());
  }
  Print(out, c.json ? ProtoToJson(every) : FormatCheckpoints(*job, every.checkpoints()));
  return absl::OkStatus();
}

absl::Status Checkpoints(const std::vector<std::string>& args, std::ostream& out) {
  return CheckpointList(args, out, "shardctl checkpoints");
}

// `checkpoint show JOB [ID]`: GetManifest; no ID is the newest committed.
absl::Status CheckpointShow(const std::vector<std::string>& args, std::ostream& out) {
  constexpr char kUsage[] =
      "Usage: shardctl checkpoint show JOB [ID] [--tensors] [--json]\n"
      "  The manifest of checkpoint ID (default: the job's newest committed one, the\n"
      "  restore point): step, generation, layout, data cursor, ranks, files, bytes and\n"
      "  tensors. --tensors lists every tensor with its global shape and piece count;\n"
      "  --json prints the whole manifest (every piece) as JSON.\n";
  Command c("shardctl checkpoint show");
  bool tensors = false;
  c.parser.AddBool("tensors", &tensors, "list the tensors: dtype, global shape, pieces, bytes");
  auto positional = c.Parse(args, kUsage, out);
  if (!positional.ok()) return positional.status();
  if (!positional->has_value()) return absl::OkStatus();
  const std::vector<std::string>& pos = **positional;
  if (pos.empty() || pos.size() > 2) {
    return Usage(absl::StrCat("checkpoint show takes a job id and optionally a checkpoint id, "
                              "e.g. 'shardctl checkpoint show shakespeare' or 'shardctl "
                              "checkpoint show shakespeare ckpt-step000000000100-gen2'",
                              pos.empty() ? "" : absl::StrCat("; got ", pos.size(),
                                                              " arguments")),
                 kUsage);
  }
  auto client = c.Connect();
  if (!client.ok()) return client.status();
  v1::GetManifestRequest request;
  request.set_job_id(pos[0]);
  if (pos.size() == 2) request.set_checkpoint_id(pos[1]);
  absl::StatusOr<v1::Manifest> manifest = client->checkpoints->GetManifest(request);
  if (!manifest.ok()) {
    const absl::Status& s = manifest.status();
    if (s.code() == absl::StatusCode::kNotFound) {
      return absl::NotFoundError(absl::StrCat(
          s.message(), "; 'shardctl checkpoint list ", pos[0], " --all' lists its checkpoints"));
    }
    return s;
  }
  Print(out, c.json ? ProtoToJson(*manifest) : FormatManifest(*manifest, tensors));
  return absl::OkStatus();
}

// The manifest and the directory holding its files for `checkpoint verify`
// and `consolidate`: from --dir DIR (DIR/manifest.json, no coordinator), or
// GetManifest(JOB, ID) and the manifest's directory (the CLI must run where
// it is visible).
struct LocatedCheckpoint {
  v1::Manifest manifest;
  std::string directory;
};

absl::StatusOr<LocatedCheckpoint> LocateCheckpoint(Command& c, const std::vector<std::string>& pos,
                                                   const std::string& dir, const char* usage) {
  LocatedCheckpoint located;
  if (c.parser.WasSet("dir")) {
    if (!pos.empty()) {
      return Usage(absl::StrCat("--dir names the checkpoint; give no job or checkpoint id with it "
                                "(got ", absl::StrJoin(pos, " "), ")"),
                   usage);
    }
    if (dir.empty()) return Usage("--dir is empty; give a checkpoint directory", usage);
    absl::StatusOr<v1::Manifest> m = ReadManifestJson(dir);
    if (!m.ok()) return m.status();
    located.manifest = *std::move(m);
    located.directory = dir;
    return located;
  }
  if (pos.empty() || pos.size() > 2) {
    return Usage(absl::StrCat("give a job id and optionally a checkpoint id (default: the newest "
                              "committed), or --dir CHECKPOINT_DIR",
                              pos.empty() ? "" : absl::StrCat("; got ", pos.size(), " arguments")),
                 usage);
  }
  auto client = c.Connect();
  if (!client.ok()) return client.status();
  v1::GetManifestRequest request;
  request.set_job_id(pos[0]);
  if (pos.size() == 2) request.set_checkpoint_id(pos[1]);
  absl::StatusOr<v1::Manifest> manifest = client->checkpoints->GetManifest(request);
  if (!manifest.ok()) {
    const absl::Status& s = manifest.status();
    if (s.code() == absl::StatusCode::kNotFound) {
      return absl::NotFoundError(absl::StrCat(
          s.message(), "; 'shardctl checkpoint list ", pos[0], " --all' lists its checkpoints"));
    }
    return s;
  }
  if (manifest->state() != v1::CHECKPOINT_STATE_COMMITTED) {
    return absl::FailedPreconditionError(absl::StrCat(
        "checkpoint ", manifest->checkpoint_id(), " is ",
        v1::CheckpointState_Name(manifest->state()), ", not COMMITTED; only committed checkpoints "
        "are complete"));
  }
  // Files below the job's root are read only when it and the checkpoint
  // directory are no symlinks (a worker could have planted one).
  if (absl::Status s = CheckCheckpointDirectory(manifest->directory()); !s.ok()) return s;
  located.directory = manifest->directory();
  located.manifest = *std::move(manifest);
  return located;
}

// `checkpoint verify JOB [ID]` / `--dir DIR`: VerifyCheckpoint over the files.
absl::Status CheckpointVerify(const std::vector<std::string>& args, std::ostream& out) {
  constexpr char kUsage[] =
      "Usage: shardctl checkpoint verify JOB [ID]\n"
      "       shardctl checkpoint verify --dir CHECKPOINT_DIR\n"
      "  Re-reads every shard file (size, CRC-32C) and every piece (bounds, CRC-32C) of\n"
      "  checkpoint ID (default: the job's newest committed one) and checks that the\n"
      "  pieces cover every tensor exactly once. Run it where the checkpoint directory\n"
      "  is visible. --dir reads CHECKPOINT_DIR/manifest.json and needs no coordinator.\n"
      "  Exit 0 when sound; 1 with the first problem (tensor, file) otherwise.\n";
  Command c("shardctl checkpoint verify");
  std::string dir;
  c.parser.AddString("dir", &dir, "a checkpoint directory holding manifest.json (offline)");
  auto positional = c.Parse(args, kUsage, out);
  if (!positional.ok()) return positional.status();
  if (!positional->has_value()) return absl::OkStatus();
  absl::StatusOr<LocatedCheckpoint> located = LocateCheckpoint(c, **positional, dir, kUsage);
  if (!located.ok()) return located.status();
  absl::StatusOr<std::string> verified =
      VerifyCheckpointFiles(located->manifest, located->directory);
  if (!verified.ok()) return verified.status();
  Print(out, *verified);
  return absl::OkStatus();
}

// `checkpoint consolidate JOB [ID] --out FILE [--optimizer]` / `--dir DIR`.
absl::Status CheckpointConsolidate(const std::vector<std::string>& args, std::ostream& out) {
  constexpr char kUsage[] =
      "Usage: shardctl checkpoint consolidate JOB [ID] --out FILE [--optimizer]\n"
      "       shardctl checkpoint consolidate --dir CHECKPOINT_DIR --out FILE [--optimizer]\n"
      "  Reads every parameter whole from checkpoint ID (default: the job's newest\n"
      "  committed one), checking each piece's CRC-32C, and writes ONE unsharded\n"
      "  safetensors file: F32 tensors sorted by name, __metadata__ with the step, job,\n"
      "  checkpoint and model config. --optimizer adds the AdamW moments\n"
      "  (<parameter>/exp_avg, <parameter>/exp_avg_sq). Run it where the checkpoint\n"
      "  directory is visible; --dir needs no coordinator.\n";
  Command c("shardctl checkpoint consolidate");
  std::string dir, out_path;
  bool optimizer = false;
  c.parser.AddString("dir", &dir, "a checkpoint directory holding manifest.json (offline)");
  c.parser.AddString("out", &out_path, "the safetensors file to write (required)");
  c.parser.AddBool("optimizer", &optimizer, "also write the optimizer state");
  auto positional = c.Parse(args, kUsage, out);
  if (!positional.ok()) return positional.status();
  if (!positional->has_value()) return absl::OkStatus();
  if (out_path.empty()) {
    return Usage("consolidate needs --out FILE, e.g. --out model.safetensors", kUsage);
  }
  absl::StatusOr<LocatedCheckpoint> located = LocateCheckpoint(c, **positional, dir, kUsage);
  if (!located.ok()) return located.status();
  ConsolidateOptions options;
  options.optimizer = optimizer;
  absl::StatusOr<ConsolidateResult> r =
      ConsolidateCheckpoint(located->manifest, located->directory, out_path, options);
  if (!r.ok()) return r.status();
  Print(out, absl::StrCat("checkpoint ", located->manifest.checkpoint_id(), " (step ",
                          located->manifest.step(), "): wrote ", r->tensors, " tensors (",
                          r->data_bytes, " bytes of data) to ", out_path));
  return absl::OkStatus();
}

absl::Status Checkpoint(const std::vector<std::string>& args, std::ostream& out) {
  if (args.empty()) {
    return Usage("checkpoint needs a subcommand: list, show, verify or consolidate",
                 kCheckpointUsage);
  }
  const std::string& sub = args[0];
  const std::vector<std::string> rest(args.begin() + 1, args.end());
  if (sub == "list") return CheckpointList(rest, out, "shardctl checkpoint list");
  if (sub == "show") return CheckpointShow(rest, out);
  if (sub == "verify") return CheckpointVerify(rest, out);
  if (sub == "consolidate") return CheckpointConsolidate(rest, out);
  if (sub == "--help" || sub == "-h" || sub == "help") {
    out << kCheckpointUsage << "\n" << kConnectionHelp;
    return absl::OkStatus();
  }
  return Usage(absl::StrCat("unknown checkpoint subcommand '", sub,
                            "'; choose list, show, verify or consolidate"),
               kCheckpointUsage);
}

absl::Status Watch(const std::vector<std::string>& args, std::ostream& out) {
  constexpr char kUsage[] =
      "Usage: shardctl watch JOB [--after SEQ] [--count N] [--json]\n"
      "  Streams the job's events, one line each, until the job ends, N events were\n"
      "  printed, or Ctrl-C. Without --after only new events; --after 0 replays the\n"
      "  retained history first. A job that has already ended has no new events: it\n"
      "  prints the retained history, then a line with the final phase and reason.\n"
      "  --json: one JSON object per line (events only).\n";
  Command c("shardctl watch");
  int64_t after = 0, count = 0;
  c.parser.AddInt("after", &after, "replay events with a larger sequence number first (0: all)");
  c.parser.AddInt("count", &count, "stop after this many events");
  bool help = false;
  absl::StatusOr<std::string> job = OneJob(c, args, kUsage, "shardctl watch shakespeare", out, &help);
  if (!job.ok() || help) return job.status();
  if (c.parser.WasSet("after") && after < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--after=", after, " is negative; give a sequence number >= 0"));
  }
  if (c.parser.WasSet("count") && count < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("--count=", count, " must be at least 1 (leave it out to watch until the "
                     "job ends)"));
  }
  auto client = c.Connect();
  if (!client.ok()) return client.status();
  v1::WatchJobRequest request;
  request.set_job_id(*job);
  if (c.parser.WasSet("after")) request.set_after_sequence(static_cast<uint64_t>(after));
  int64_t seen = 0;
  auto print = [&](const v1::JobEvent& event) {
    // Flushed per line so `shardctl watch ... | grep` sees events as they come.
    out << (c.json ? ProtoToJson(event, /*one_line=*/true) : FormatEvent(event)) << "\n";
    out.flush();
    ++seen;
    return !(count > 0 && seen >= count);
  };
  absl::Status s = client->jobs->WatchJob(request, print);
  if (s.ok() && seen == 0 && !c.parser.WasSet("after")) {
    // The stream ended before any new event: the job had already ended. Show
    // how it got there instead of nothing.
    v1::GetJobRequest get;
    get.set_job_id(*job);
    absl::StatusOr<v1::Job> state = client->jobs->GetJob(get);
    if (!state.ok()) return WithJobHint(state.status());
    const v1::JobPhase phase = state->phase();
    if (phase != v1::JOB_PHASE_COMPLETED && phase != v1::JOB_PHASE_FAILED &&
        phase != v1::JOB_PHASE_CANCELLED) {
      return absl::OkStatus();
    }
    request.set_after_sequence(0);
    s = client->jobs->WatchJob(request, print);
    // OUT_OF_RANGE: the oldest events are no longer retained; the line
    // below still says how the job ended.
    if (!s.ok() && s.code() != absl::StatusCode::kOutOfRange) return WithJobHint(s);
    if (!c.json && !(count > 0 && seen >= count)) {
      Print(out, absl::StrCat("job ", *job, " has ended: ",
                              EnumName(v1::JobPhase_descriptor(), phase),
                              state->phase_reason().empty()
                                  ? ""
                                  : absl::StrCat(" (", Printable(state->phase_reason()), ")"),
                              "; no more events will come"));
    }
    return absl::OkStatus();
  }
  if (s.code() == absl::StatusCode::kResourceExhausted) {
    return absl::ResourceExhaustedError(absl::StrCat(
        s.message(), "; resume with 'shardctl watch ", *job, " --after <last sequence shown>'"));
  }
  if (s.code() == absl::StatusCode::kOutOfRange) {
    // The coordinator names the request field; the user typed --after.
    return absl::OutOfRangeError(
        absl::StrReplaceAll(s.message(), {{"after_sequence=", "--after="},
                                          {"leave after_sequence unset", "leave --after out"}}));
  }
  return WithJobHint(s);
}

// ----------------------------------------------------------------- kv ----

constexpr char kKvUsage[] =
    "Usage: shardctl kv get JOB --generation G [--scope S] KEY [--json]\n"
    "  Reads a rendezvous key of the job's current generation (debugging): an\n"
    "  operator read with the admin token (--token / SHARDLINE_TOKEN), which never\n"
    "  waits and touches no worker; keys of earlier generations are gone.\n";

absl::Status KvGet(const std::vector<std::string>& args, std::ostream& out) {
  Command c("shardctl kv get");
  int64_t generation = 0;
  std::string scope;
  c.parser.AddInt("generation", &generation, "generation whose store to read (the current one)");
  c.parser.AddString("scope", &scope,
                     "rendezvous scope, e.g. a group name \"tp/0\" (default \"\": "
                     "generation-wide)");
  auto positional = c.Parse(args, kKvUsage, out);
  if (!positional.ok()) return positional.status();
  if (!positional->has_value()) return absl::OkStatus();
  const std::vector<std::string>& pos = **positional;
  if (pos.size() != 2) {
    return Usage("kv get takes a job id and a key, e.g. 'shardctl kv get shakespeare "
                 "--generation 1 --scope tp/0 nccl_id'",
                 kKvUsage);
  }
  if (!c.parser.WasSet("generation")) {
    return Usage("--generation is required (the job's current generation: 'shardctl job get')",
                 kKvUsage);
  }
  if (generation < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("--generation=", generation, " is invalid; generations start at 1"));
  }
  const std::string& job_id = pos[0];
  const std::string& key = pos[1];
  auto client = c.Connect();
  if (!client.ok()) return client.status();

  v1::KvGetRequest request;  // no fence: an operator read
  request.set_job_id(job_id);
  request.set_generation(static_cast<uint64_t>(generation));
  request.set_scope(scope);
  request.set_key(key);
  request.set_wait(false);
  absl::StatusOr<v1::KvGetResponse> response = client->rendezvous->KvGet(request, nullptr);
  if (!response.ok()) return WithJobHint(response.status());
  if (c.json) {
    Print(out, ProtoToJson(*response));
    return absl::OkStatus();
  }
  std::vector<std::pair<std::string, std::string>> lines = {
      {"Job", job_id},
      {"Generation", absl::StrCat(generation)},
      {"Scope", scope.empty() ? "\"\" (generation-wide)" : scope},
      {"Key", key},
  };
  if (!response->found()) {
    lines.emplace_back("Value", "not set");
  } else if (IsPrintableText(response->value())) {
    lines.emplace_back("Value", absl::StrCat(response->value().size(), " bytes, text"));
  } else {
    lines.emplace_back("Value", absl::StrCat(response->value().size(), " bytes, hex"));
  }
  std::string text = KeyValueBlock(lines);
  if (response->found()) {
    text += IsPrintableText(response->value()) ? response->value() : HexBytes(response->value());
  }
  Print(out, text);
  return absl::OkStatus();
}

absl::Status Kv(const std::vector<std::string>& args, std::ostream& out) {
  if (!args.empty() && args[0] == "get") {
    return KvGet(std::vector<std::string>(args.begin() + 1, args.end()), out);
  }
  if (!args.empty() && (args[0] == "--help" || args[0] == "-h" || args[0] == "help")) {
    out << kKvUsage;
    return absl::OkStatus();
  }
  return Usage(args.empty() ? "kv needs a subcommand: get"
                            : absl::StrCat("unknown kv subcommand '", args[0],
                                           "'; the only one is 'get' (the store is the "
                                           "workers'; operators only read it)"),
               kKvUsage);
}

}  // namespace

bool IsCoordinatorCommand(const std::string& command) {
  return command == "job" || command == "members" || command == "drain" || command == "topology" ||
         command == "owner" || command == "checkpoints" || command == "checkpoint" ||
         command == "watch" || command == "kv" || command == "status" || command == "whatif";
}

absl::Status RunCoordinatorCommand(const std::string& command,
                                   const std::vector<std::string>& args, std::ostream& out) {
  if (command == "job") return Job(args, out);
  if (command == "members") return Members(args, out);
  if (command == "drain") return Drain(args, out);
  if (command == "topology") return Topology(args, out);
  if (command == "owner") return Owner(args, out);
  if (command == "checkpoints") return Checkpoints(args, out);
  if (command == "checkpoint") return Checkpoint(args, out);
  if (command == "watch") return Watch(args, out);
  if (command == "kv") return Kv(args, out);
  if (command == "status") return RunStatusCommand(args, out);
  if (command == "whatif") return WhatIf(args, out);
  return absl::InvalidArgumentError(absl::StrCat("unknown command '", command, "'"));
}

int ExitCodeFor(const absl::Status& status) {
  if (status.ok()) return 0;
  switch (status.code()) {
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kNotFound:
    case absl::StatusCode::kOutOfRange:
      return 2;
    default:
      return 1;
  }
}

}  // namespace shardline::shardctl
