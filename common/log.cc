#include "common/log.h"

#include <unistd.h>

#include <cerrno>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"

namespace shardline {
namespace {

absl::Mutex g_mu(absl::kConstInit);
std::string* g_program ABSL_GUARDED_BY(g_mu) = nullptr;

std::string Program() {
  absl::MutexLock lock(&g_mu);
  return g_program == nullptr ? std::string("shardline") : *g_program;
}

void Write(const std::string& line) {
  size_t done = 0;
  while (done < line.size()) {
    const ssize_t n = ::write(STDERR_FILENO, line.data() + done, line.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;  // nowhere to report a failing stderr
    done += static_cast<size_t>(n);
  }
}

}  // namespace

void SetLogProgram(absl::string_view program) {
  absl::MutexLock lock(&g_mu);
  if (g_program == nullptr) g_program = new std::string();  // never freed: lines at exit
  g_program->assign(program.data(), program.size());
}

std::string FormatLogLine(absl::Time now, absl::string_view program, absl::string_view context,
                          absl::string_view text) {
  return absl::StrCat(absl::FormatTime("%Y-%m-%dT%H:%M:%E3SZ", now, absl::UTCTimeZone()), " ",
                      program, context.empty() ? "" : " ", context, ": ", text);
}

void LogLine(absl::string_view text) { LogLine("", text); }

void LogLine(absl::string_view context, absl::string_view text) {
  Write(absl::StrCat(FormatLogLine(absl::Now(), Program(), context, text), "\n"));
}

}  // namespace shardline
