// ExitWatchdog: bounds how long a worker may take to wind down once it
// knows it must stop. A rank the coordinator evicted (LOSS_REASON_HUNG:
// its training thread is stuck, e.g. in a hung kernel or data loader, or
// the --inject-fault stall) gets STOP on its heartbeat thread, but the
// thread that would act on it never returns. Armed at STOP, the watchdog
// waits `grace` for the main loop to say it returned (Disarm), and else
// calls `on_expiry` (the worker logs one line and _exit(1)s: nothing a
// stuck thread holds can be cleaned up anyway).
//
//   ExitWatchdog watchdog(absl::Seconds(5), [](absl::Duration grace) {
//     Log("training thread did not return within 5 s after STOP: exiting");
//     _exit(1);
//   });
//   agent->SetDirectiveCallback([&](const v1::Directive& d) {
//     if (d.has_stop()) watchdog.Arm();
//   });
//   ... main loop returns ...
//   watchdog.Disarm();
//
// Thread-safety: thread-safe. Arm and Disarm are idempotent; Disarm before
// or after Arm means on_expiry never runs. The destructor disarms and joins
// its thread.
#ifndef SHARDLINE_WORKER_EXIT_WATCHDOG_H_
#define SHARDLINE_WORKER_EXIT_WATCHDOG_H_

#include <functional>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace shardline::worker {

class ExitWatchdog {
 public:
  // Runs `on_expiry(grace)` on the watchdog's thread if Disarm does not
  // follow Arm within `grace`.
  ExitWatchdog(absl::Duration grace, std::function<void(absl::Duration)> on_expiry);
  ~ExitWatchdog();
  ExitWatchdog(const ExitWatchdog&) = delete;
  ExitWatchdog& operator=(const ExitWatchdog&) = delete;

  // Starts the countdown (the first call counts).
  void Arm() ABSL_LOCKS_EXCLUDED(mu_);
  // The main loop returned: the countdown never expires.
  void Disarm() ABSL_LOCKS_EXCLUDED(mu_);

 private:
  void Loop() ABSL_LOCKS_EXCLUDED(mu_);

  const absl::Duration grace_;
  const std::function<void(absl::Duration)> on_expiry_;
  absl::Mutex mu_;
  bool armed_ ABSL_GUARDED_BY(mu_) = false;
  bool disarmed_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace shardline::worker

#endif  // SHARDLINE_WORKER_EXIT_WATCHDOG_H_
