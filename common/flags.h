// A small command-line parser for shardctl's subcommands: each subcommand
// declares its own flags, so a flag that belongs elsewhere is an error, and
// flag names keep the dashes users type (--micro-batches).
//
//   ArgParser args("shardctl plan");
//   int64_t tp = 1;
//   args.AddInt("tp", &tp, "tensor-parallel degree");
//   absl::StatusOr<std::vector<std::string>> positional = args.Parse(argv_tail);
//
// Accepts "--name value", "--name=value", "--flag" for booleans (and
// "--flag=true|false"), and "--" to end flags. Not thread-safe; use one per
// parse.
#ifndef SHARDLINE_COMMON_FLAGS_H_
#define SHARDLINE_COMMON_FLAGS_H_

#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <optional>
#include <vector>

#include "absl/status/statusor.h"

namespace shardline {

class ArgParser {
 public:
  explicit ArgParser(std::string command) : command_(std::move(command)) {}

  // Registers a flag; `out` (not owned) keeps its value unless the flag is
  // given. `help` is one line for Usage(). `value_name` names the value in
  // Usage() and in the missing-value error ("--lose WORKER[,WORKER...]");
  // empty means "VALUE" in Usage() and no name in the error.
  void AddInt(const std::string& name, int64_t* out, const std::string& help,
              const std::string& value_name = "");
  void AddString(const std::string& name, std::string* out, const std::string& help,
                 const std::string& value_name = "");
  void AddBool(const std::string& name, bool* out, const std::string& help);
  // A repeatable flag: every occurrence appends its value to `out` (the one
  // kind of flag that may be given more than once).
  void AddStrings(const std::string& name, std::vector<std::string>* out,
                  const std::string& help, const std::string& value_name = "");

  // Parses `args` (without the program and subcommand words) and returns the
  // positional arguments. Errors (InvalidArgument, naming the flag and what
  // would be valid): an unknown flag, a missing value, a value that is not
  // an integer, a flag other than an AddStrings one given twice. A value
  // flag followed by "--" or by another of this parser's flags ("--lose
  // --json") lacks its value: the next word is not taken as it ("--name=V"
  // still gives any value).
  absl::StatusOr<std::vector<std::string>> Parse(const std::vector<std::string>& args);

  bool WasSet(const std::string& name) const { return set_.count(name) > 0; }

  // Whether flag `name` (without "--") takes a value (true) or is a bool
  // (false); nullopt when no such flag is registered.
  std::optional<bool> TakesValue(const std::string& name) const {
    auto it = flags_.find(name);
    if (it == flags_.end()) return std::nullopt;
    return it->second.type != Type::kBool;
  }

  // "Flags of <command>:" then one line per flag, sorted by name.
  std::string Usage() const;

 private:
  enum class Type { kInt, kString, kBool, kStrings };
  struct Flag {
    Type type;
    void* out;
    std::string help;
    std::string value_name;
  };
  // Whether `arg` is "--" or one of the registered flags (with or without
  // "=value").
  bool IsFlag(const std::string& arg) const;
  absl::Status Assign(const std::string& name, const Flag& flag, const std::string& value);

  std::string command_;
  std::map<std::string, Flag> flags_;
  std::set<std::string> set_;
};

}  // namespace shardline

#endif  // SHARDLINE_COMMON_FLAGS_H_
