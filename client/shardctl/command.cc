#include "client/shardctl/command.h"

#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"

namespace shardline::shardctl {

const char kConnectionHelp[] =
    "Connection: --coordinator HOST:PORT, or every replica's HOST:PORT comma-separated\n"
    "  (else $SHARDLINE_COORDINATOR, else 127.0.0.1:7070),\n"
    "  --token T (else $SHARDLINE_TOKEN), --tls-ca FILE, --tls-cert FILE --tls-key FILE,\n"
    "  --timeout D (default 10s). --json prints the response as JSON.\n";

Command::Command(std::string name) : parser(std::move(name)) {
  connection.Register(parser);
  parser.AddBool("json", &json, "print the response as JSON (proto field names)");
  parser.AddBool("help", &help, "show this help");
}

absl::StatusOr<std::optional<std::vector<std::string>>> Command::Parse(
    const std::vector<std::string>& args, const char* usage, std::ostream& out) {
  absl::StatusOr<std::vector<std::string>> positional = parser.Parse(args);
  if (!positional.ok()) return positional.status();
  if (help) {
    out << usage << "\n" << parser.Usage() << "\n" << kConnectionHelp;
    return std::optional<std::vector<std::string>>();
  }
  for (const std::string& p : *positional) {
    if (p.size() > 1 && p[0] == '-' && p != "-") {
      return absl::InvalidArgumentError(absl::StrCat(
          "unknown option '", p, "'; flags take two dashes, e.g. --json\n", usage));
    }
  }
  return std::optional<std::vector<std::string>>(std::move(*positional));
}

absl::StatusOr<client::CoordinatorClients> Command::Connect() {
  absl::StatusOr<client::ConnectionOptions> options = connection.Resolve(parser);
  if (!options.ok()) return options.status();
  return client::ConnectCoordinator(*options);
}

absl::Status Usage(const std::string& what, const char* usage) {
  return absl::InvalidArgumentError(absl::StrCat(what, "\n", usage));
}

absl::Status WithJobHint(const absl::Status& s) {
  if (s.code() != absl::StatusCode::kNotFound) return s;
  return absl::Status(s.code(), absl::StrCat(s.message(), "; 'shardctl job list' lists the jobs"));
}

absl::Status CheckJobId(const std::string& id, const std::string& what) {
  bool ok = !id.empty() && id.size() <= 63 && absl::ascii_islower(id[0]);
  for (char c : id) ok = ok && (absl::ascii_islower(c) || absl::ascii_isdigit(c) || c == '-');
  if (ok) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      what, "'", id, "' is not a job id: 1 to 63 characters of a-z, 0-9 and '-', starting "
      "with a letter, e.g. shakespeare-2"));
}

void Print(std::ostream& out, const std::string& text) {
  out << text;
  if (!text.empty() && text.back() != '\n') out << "\n";
  out.flush();
}

}  // namespace shardline::shardctl
