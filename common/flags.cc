#include "common/flags.h"

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace shardline {

void ArgParser::AddInt(const std::string& name, int64_t* out, const std::string& help,
                       const std::string& value_name) {
  flags_[name] = {Type::kInt, out, help, value_name};
}
void ArgParser::AddString(const std::string& name, std::string* out, const std::string& help,
                          const std::string& value_name) {
  flags_[name] = {Type::kString, out, help, value_name};
}
void ArgParser::AddBool(const std::string& name, bool* out, const std::string& help) {
  flags_[name] = {Type::kBool, out, help, ""};
}
void ArgParser::AddStrings(const std::string& name, std::vector<std::string>* out,
                           const std::string& help, const std::string& value_name) {
  flags_[name] = {Type::kStrings, out, help, value_name};
}

bool ArgParser::IsFlag(const std::string& arg) const {
  if (arg == "--") return true;
  if (!absl::StartsWith(arg, "--")) return false;
  const size_t eq = arg.find('=');
  return flags_.count(arg.substr(2, eq == std::string::npos ? std::string::npos : eq - 2)) > 0;
}

absl::Status ArgParser::Assign(const std::string& name, const Flag& flag,
                               const std::string& value) {
  switch (flag.type) {
    case Type::kInt:
      if (!absl::SimpleAtoi(value, static_cast<int64_t*>(flag.out))) {
        return absl::InvalidArgumentError(
            absl::StrCat("--", name, "='", value, "' is not an integer; give a whole number, e.g. --",
                         name, "=2"));
      }
      break;
    case Type::kString:
      *static_cast<std::string*>(flag.out) = value;
      break;
    case Type::kStrings:
      static_cast<std::vector<std::string>*>(flag.out)->push_back(value);
      break;
    case Type::kBool:
      if (value == "true" || value == "1") {
        *static_cast<bool*>(flag.out) = true;
      } else if (value == "false" || value == "0") {
        *static_cast<bool*>(flag.out) = false;
      } else {
        return absl::InvalidArgumentError(
            absl::StrCat("--", name, "='", value, "' is not a boolean; use --", name, " or --",
                         name, "=false"));
      }
      break;
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<std::string>> ArgParser::Parse(const std::vector<std::string>& args) {
  std::vector<std::string> positional;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& arg = args[i];
    if (arg == "--") {
      positional.insert(positional.end(), args.begin() + i + 1, args.end());
      break;
    }
    if (!absl::StartsWith(arg, "--") || arg.size() == 2) {
      positional.push_back(arg);
      continue;
    }
    const size_t eq = arg.find('=');
    const std::string name = arg.substr(2, eq == std::string::npos ? std::string::npos : eq - 2);
    auto it = flags_.find(name);
    if (it == flags_.end()) {
      std::vector<std::string> names;
      for (const auto& [n, f] : flags_) names.push_back("--" + n);
      return absl::InvalidArgumentError(absl::StrCat("unknown flag --", name, " for '", command_,
                                                     "'; valid flags: ",
                                                     absl::StrJoin(names, " ")));
    }
    if (!set_.insert(name).second && it->second.type != Type::kStrings) {
      return absl::InvalidArgumentError(
          absl::StrCat("--", name, " is given more than once; give it once"));
    }
    std::string value;
    if (eq != std::string::npos) {
      value = arg.substr(eq + 1);
    } else if (it->second.type == Type::kBool) {
      value = "true";
    } else if (i + 1 < args.size() && !IsFlag(args[i + 1])) {
      value = args[++i];
    } else {
      // "--lose needs a value: WORKER[,WORKER...]; worker ids to ...".
      const Flag& f = it->second;
      std::string what = f.value_name;
      if (!f.help.empty()) absl::StrAppend(&what, what.empty() ? "" : "; ", f.help);
      return absl::InvalidArgumentError(
          absl::StrCat("--", name, " needs a value", what.empty() ? "" : ": ", what));
    }
    if (absl::Status s = Assign(name, it->second, value); !s.ok()) return s;
  }
  return positional;
}

std::string ArgParser::Usage() const {
  std::string out = absl::StrCat("Flags of ", command_, ":\n");
  for (const auto& [name, flag] : flags_) {
    const std::string left =
        absl::StrCat("  --", name,
                     flag.type == Type::kBool
                         ? ""
                         : absl::StrCat(" ", flag.value_name.empty() ? "VALUE" : flag.value_name));
    absl::StrAppend(&out, left, std::string(left.size() < 28 ? 28 - left.size() : 1, ' '),
                    flag.help, "\n");
  }
  return out;
}

}  // namespace shardline
