#include "server/rendezvous.h"

#include <malloc.h>

#include <algorithm>
#include <limits>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"

namespace shardline::server {
namespace {

// Keys, scopes and values are caller bytes: escape them and show at most
// kShown bytes in messages.
std::string Quote(absl::string_view s, size_t shown = 64) {
  if (s.size() <= shown) return absl::StrCat("\"", absl::CHexEscape(s), "\"");
  return absl::StrCat("\"", absl::CHexEscape(s.substr(0, shown)), "...\" (", s.size(), " bytes)");
}

std::string Where(absl::string_view job_id, uint64_t generation, absl::string_view scope) {
  return absl::StrCat("scope ", Quote(scope), " of job ", Quote(job_id), " generation ",
                      generation);
}

std::string EndedMessage(absl::string_view job_id, uint64_t generation) {
  return absl::StrCat("generation ", generation, " of job ", Quote(job_id),
                      " has ended; its rendezvous keys and barriers are dropped. Abort "
                      "communicators and re-join (JoinJob) to get the current generation");
}

std::string DroppedMessage(absl::string_view job_id) {
  return absl::StrCat("job ", Quote(job_id),
                      " has been dropped (cancelled, completed or failed); its rendezvous keys "
                      "and barriers are gone");
}

absl::Status ValidateJobAndScope(absl::string_view job_id, absl::string_view scope) {
  if (job_id.empty()) return absl::InvalidArgumentError("job_id is empty; pass the fence's job_id");
  if (scope.size() > kMaxScopeBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("scope is ", scope.size(), " bytes; at most ", kMaxScopeBytes,
                     " (kMaxScopeBytes) are allowed, e.g. a ProcessGroup name like \"tp/3\""));
  }
  return absl::OkStatus();
}

// A key or barrier name: 1..kMaxKeyBytes bytes.
absl::Status ValidateName(absl::string_view field, absl::string_view name) {
  if (name.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, " is empty; it needs 1..", kMaxKeyBytes, " bytes"));
  }
  if (name.size() > kMaxKeyBytes) {
    return absl::InvalidArgumentError(absl::StrCat(field, " is ", name.size(), " bytes; at most ",
                                                   kMaxKeyBytes, " (kMaxKeyBytes) are allowed"));
  }
  return absl::OkStatus();
}

absl::Status ValidateValue(absl::string_view field, absl::string_view value) {
  if (value.size() > kMaxValueBytes) {
    return absl::InvalidArgumentError(absl::StrCat(field, " is ", value.size(), " bytes; at most ",
                                                   kMaxValueBytes,
                                                   " (1 MiB, kMaxValueBytes) are allowed"));
  }
  return absl::OkStatus();
}

absl::StatusOr<absl::Duration> ResolveTimeout(std::optional<absl::Duration> timeout) {
  if (!timeout.has_value()) return kDefaultWaitTimeout;
  if (*timeout < absl::ZeroDuration()) {
    return absl::InvalidArgumentError(absl::StrCat("timeout is ", absl::FormatDuration(*timeout),
                                                   "; it must be >= 0 (0 checks once)"));
  }
  if (*timeout > kMaxWaitTimeout) {
    return absl::InvalidArgumentError(absl::StrCat(
        "timeout is ", absl::FormatDuration(*timeout), "; at most ",
        absl::FormatDuration(kMaxWaitTimeout), " (kMaxWaitTimeout) is allowed; leave it unset for ",
        absl::FormatDuration(kDefaultWaitTimeout)));
  }
  return *timeout;
}

// When a blocking call gives up, in real time, and how to say so.
struct Deadline {
  absl::Time start;
  absl::Time at;
  bool rpc_bound = false;  // the RPC deadline comes first

  static Deadline From(absl::Duration timeout, absl::Time rpc_deadline) {
    Deadline d;
    d.start = absl::Now();
    d.at = d.start + timeout;
    if (rpc_deadline < d.at) {
      d.at = rpc_deadline;
      d.rpc_bound = true;
    }
    return d;
  }
  std::string Describe() const {
    return rpc_bound
               ? absl::StrCat("before the RPC deadline (",
                              absl::FormatDuration(std::max(at - start, absl::ZeroDuration())), ")")
               : absl::StrCat("within the timeout of ", absl::FormatDuration(at - start));
  }
};

// Strict decimal text of an int64: an optional '-' and 1+ digits.
bool ParseCounter(absl::string_view text, int64_t* out) {
  absl::string_view digits = text;
  if (!digits.empty() && digits.front() == '-') digits.remove_prefix(1);
  if (digits.empty()) return false;
  for (char c : digits) {
    if (!absl::ascii_isdigit(static_cast<unsigned char>(c))) return false;
  }
  return absl::SimpleAtoi(text, out);
}

// A blocking call: its asynchronous form `start(done)`, then a wait for
// `done` until the deadline, then Withdraw. `answer` and `woken` outlive the
// wait: `done` runs (under the Rendezvous's lock) before Withdraw returns
// nullopt, never after.
template <typename T, typename Start>
absl::StatusOr<T> BlockOn(Rendezvous* rv, Start start) {
  absl::Notification woken;
  absl::StatusOr<T> answer = absl::UnknownError("not answered");
  Rendezvous::Arrival<T> arrival = start([&](absl::StatusOr<T> a) {
    answer = std::move(a);
    woken.Notify();
  });
  if (arrival.answer.has_value()) return *std::move(arrival.answer);
  woken.WaitForNotificationWithDeadline(arrival.deadline);
  if (std::optional<absl::Status> gave_up = rv->Withdraw(arrival.wait_id)) return *gave_up;
  return answer;
}

}  // namespace

Rendezvous::Doomed::~Doomed() {
  int64_t bytes = 0;
  for (const auto& gen : gens) bytes += gen->bytes;
  gens.clear();
  // glibc keeps freed small chunks in the process (RSS stayed +320 MB after
  // 659k scopes were freed); hand a large generation's pages back.
  if (bytes >= kTrimAfterFreeingBytes) malloc_trim(0);
}

Rendezvous::Rendezvous(Clock* clock) : clock_(clock) {}

Rendezvous::~Rendezvous() = default;

// ---------------------------------------------------------------------------
// State helpers (mu_ held).

absl::Status Rendezvous::CheckLiveLocked(absl::string_view job_id, uint64_t generation) const {
  auto it = jobs_.find(job_id);
  if (it == jobs_.end()) return absl::OkStatus();
  if (it->second.dropped) return absl::AbortedError(DroppedMessage(job_id));
  if (generation < it->second.first_live_generation) {
    return absl::AbortedError(EndedMessage(job_id, generation));
  }
  return absl::OkStatus();
}

Rendezvous::GenerationState* Rendezvous::FindGenerationLocked(absl::string_view job_id,
                                                              uint64_t generation) const {
  auto job = jobs_.find(job_id);
  if (job == jobs_.end()) return nullptr;
  auto gen = job->second.generations.find(generation);
  return gen == job->second.generations.end() ? nullptr : gen->second.get();
}

Rendezvous::Scope* Rendezvous::FindScopeLocked(absl::string_view job_id, uint64_t generation,
                                               absl::string_view scope) const {
  GenerationState* gen = FindGenerationLocked(job_id, generation);
  if (gen == nullptr) return nullptr;
  auto it = gen->scopes.find(scope);
  return it == gen->scopes.end() ? nullptr : it->second.get();
}

Rendezvous::Scope* Rendezvous::EnsureScopeLocked(absl::string_view job_id, uint64_t generation,
                                                 absl::string_view scope) {
  std::unique_ptr<GenerationState>& gen = jobs_[job_id].generations[generation];
  if (gen == nullptr) gen = std::make_unique<GenerationState>();
  std::unique_ptr<Scope>& sc = gen->scopes[scope];
  if (sc == nullptr) sc = std::make_unique<Scope>();
  return sc.get();
}

void Rendezvous::MaybeEraseScopeLocked(absl::string_view job_id, uint64_t generation,
                                       absl::string_view scope) {
  auto job = jobs_.find(job_id);
  if (job == jobs_.end()) return;
  JobState& js = job->second;
  auto gen_it = js.generations.find(generation);
  if (gen_it != js.generations.end()) {
    GenerationState& gen = *gen_it->second;
    auto sc_it = gen.scopes.find(scope);
    if (sc_it != gen.scopes.end()) {
      Scope& sc = *sc_it->second;
      if (sc.charged && sc.kv.empty() && sc.barriers.empty()) {
        sc.charged = false;
        --gen.scopes_charged;
        gen.bytes -= static_cast<int64_t>(scope.size()) + kScopeOverheadBytes;
      }
      if (sc.kv.empty() && sc.key_waiters.empty() && sc.barriers.empty()) gen.scopes.erase(sc_it);
    }
    if (gen.scopes.empty() && gen.waiters == 0) js.generations.erase(gen_it);
  }
  // A job that never ended a generation needs no record once it holds nothing.
  if (js.generations.empty() && js.first_live_generation == 0 && !js.dropped) jobs_.erase(job);
}

absl::Status Rendezvous::ChargeLocked(GenerationState* gen, Scope* sc, absl::string_view job_id,
                                      uint64_t generation, absl::string_view scope, int64_t bytes,
                                      const std::string& what) {
  if (!sc->charged) {
    if (gen->scopes_charged >= static_cast<int64_t>(kMaxScopesPerGeneration)) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "generation ", generation, " of job ", Quote(job_id), " already holds ",
          gen->scopes_charged,
          " scopes, the most kMaxScopesPerGeneration = ", kMaxScopesPerGeneration, " allows; ",
          what, " would open another one, ", Where(job_id, generation, scope),
          ". Delete keys no longer needed (KvDelete) or reuse a scope"));
    }
    bytes += static_cast<int64_t>(scope.size()) + kScopeOverheadBytes;
  }
  if (gen->bytes + bytes > kMaxBytesPerGeneration) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "generation ", generation, " of job ", Quote(job_id), " holds ", gen->bytes,
        " bytes of rendezvous state (keys, values, names and their bookkeeping); ", what, " (",
        bytes, " bytes) would pass kMaxBytesPerGeneration = ", kMaxBytesPerGeneration,
        ". Delete keys no longer needed (KvDelete)"));
  }
  if (!sc->charged) {
    sc->charged = true;
    ++gen->scopes_charged;
  }
  gen->bytes += bytes;
  return absl::OkStatus();
}

absl::Status Rendezvous::StoreLocked(GenerationState* gen, Scope* sc, absl::string_view job_id,
                                     uint64_t generation, absl::string_view scope,
                                     absl::string_view key, std::string value, absl::Time now) {
  auto it = sc->kv.find(key);
  const bool is_new = it == sc->kv.end();
  const int64_t delta_bytes =
      is_new ? static_cast<int64_t>(key.size() + value.size()) + kKeyOverheadBytes
             : static_cast<int64_t>(value.size()) - static_cast<int64_t>(it->second.size());
  if (is_new && sc->kv.size() >= kMaxKeysPerScope) {
    return absl::ResourceExhaustedError(
        absl::StrCat(Where(job_id, generation, scope), " already holds ", sc->kv.size(),
                     " keys (kMaxKeysPerScope); cannot add key ", Quote(key),
                     ". Delete keys no longer needed (KvDelete) or use another scope"));
  }
  if (absl::Status s = ChargeLocked(
          gen, sc, job_id, generation, scope, delta_bytes,
          absl::StrCat("storing key ", Quote(key), " (", value.size(), " value bytes)"));
      !s.ok()) {
    return s;
  }
  if (is_new) {
    sc->kv.emplace(std::string(key), std::move(value));
    ++gen->keys;
    if (auto waiting = sc->key_waiters.find(key); waiting != sc->key_waiters.end()) {
      absl::flat_hash_set<KeyWait*> woken = std::move(waiting->second);
      sc->key_waiters.erase(waiting);
      for (KeyWait* w : woken) {
        KeyAnswer answer;
        if (KeysReadyLocked(sc, w, &answer)) {
          --gen->waiters;
          gen->waiting_bytes -= w->bytes;
          AnswerKeyWaitLocked(w, std::move(answer));
        } else {  // a Wait with more keys missing: on to the next one
          sc->key_waiters[w->keys[w->next]].insert(w);
        }
      }
    }
  } else {
    it->second = std::move(value);
  }
  gen->last_write = std::max(gen->last_write, now);
  return absl::OkStatus();
}

Rendezvous::KeyArrival Rendezvous::StartKeyWaitLocked(std::unique_ptr<KeyWait> w,
                                                      absl::Time deadline) {
  if (absl::Status s = CheckLiveLocked(w->job_id, w->generation); !s.ok()) {
    return KeyArrival::Answered(s);
  }
  const Scope* found = FindScopeLocked(w->job_id, w->generation, w->scope);
  KeyAnswer answer;
  if (KeysReadyLocked(found, w.get(), &answer)) return KeyArrival::Answered(std::move(answer));
  if (absl::Now() >= deadline) {  // timeout 0, or the RPC deadline passed
    return KeyArrival::Answered(GaveUpLocked(found, *w, /*cancelled=*/false));
  }
  Scope* sc = EnsureScopeLocked(w->job_id, w->generation, w->scope);
  GenerationState* gen = FindGenerationLocked(w->job_id, w->generation);
  if (gen->waiting_bytes + w->bytes > kMaxWaitingBytesPerGeneration) {
    const int64_t held = gen->waiting_bytes;
    MaybeEraseScopeLocked(w->job_id, w->generation, w->scope);
    return KeyArrival::Answered(absl::ResourceExhaustedError(absl::StrCat(
        "generation ", w->generation, " of job ", Quote(w->job_id), " already has ", held,
        " bytes of waiting KvGet/KvWait calls; waiting for ",
        w->keys.size() == 1 ? absl::StrCat("key ", Quote(w->keys[0]))
                            : absl::StrCat(w->keys.size(), " keys"),
        " in ", Where(w->job_id, w->generation, w->scope), " (", w->bytes,
        " bytes) would pass kMaxWaitingBytesPerGeneration = ", kMaxWaitingBytesPerGeneration,
        w->keys.size() == 1 ? ". Retry once fewer calls wait"
                            : ". Wait for fewer keys at once, or retry once fewer calls wait")));
  }
  gen->waiting_bytes += w->bytes;
  ++gen->waiters;
  w->wait_id = next_wait_id_++;
  sc->key_waiters[w->keys[w->next]].insert(w.get());
  KeyArrival out;
  out.wait_id = w->wait_id;
  out.deadline = deadline;
  key_waits_.emplace(w->wait_id, std::move(w));
  return out;
}

bool Rendezvous::KeysReadyLocked(const Scope* sc, KeyWait* w, KeyAnswer* value) const {
  if (sc == nullptr) return false;
  if (w->want_value) {
    auto it = sc->kv.find(w->keys[0]);
    if (it == sc->kv.end()) return false;
    *value = it->second;
    return true;
  }
  // keys[0..next) were set when last looked at; once the rest are, a final
  // pass confirms that all are set at once (one may have been deleted).
  while (w->next < w->keys.size() && sc->kv.contains(w->keys[w->next])) ++w->next;
  if (w->next < w->keys.size()) return false;
  w->next = 0;
  while (w->next < w->keys.size() && sc->kv.contains(w->keys[w->next])) ++w->next;
  if (w->next < w->keys.size()) return false;
  *value = std::nullopt;
  return true;
}

absl::Status Rendezvous::GaveUpLocked(const Scope* sc, const KeyWait& w, bool cancelled) const {
  const std::string where = Where(w.job_id, w.generation, w.scope);
  if (w.want_value) {
    if (cancelled) {
      return absl::CancelledError(absl::StrCat("the caller cancelled while waiting for key ",
                                               Quote(w.keys[0]), " in ", where));
    }
    return absl::DeadlineExceededError(absl::StrCat("key ", Quote(w.keys[0]), " in ", where,
                                                    " was not set ", w.deadline_description));
  }
  std::string names;
  size_t missing = 0;
  for (const std::string& k : w.keys) {
    if (sc != nullptr && sc->kv.contains(k)) continue;
    if (++missing <= 16) absl::StrAppend(&names, names.empty() ? "" : ", ", Quote(k));
  }
  if (missing > 16) absl::StrAppend(&names, ", ...");
  if (cancelled) {
    return absl::CancelledError(absl::StrCat("the caller cancelled while waiting for ", missing,
                                             " of ", w.keys.size(), " keys in ", where,
                                             "; missing: ", names));
  }
  return absl::DeadlineExceededError(absl::StrCat(missing, " of ", w.keys.size(), " keys in ",
                                                  where, " were not set ",
                                                  w.deadline_description, "; missing: ", names));
}

void Rendezvous::AnswerKeyWaitLocked(KeyWait* w, absl::StatusOr<KeyAnswer> answer) {
  Done<KeyAnswer> done = std::move(w->done);
  key_waits_.erase(w->wait_id);  // frees *w
  done(std::move(answer));
}

void Rendezvous::AnswerBarrierWaitLocked(BarrierWait* w, absl::StatusOr<uint32_t> answer) {
  Done<uint32_t> done = std::move(w->done);
  barrier_waits_.erase(w->wait_id);  // frees *w
  done(std::move(answer));
}

void Rendezvous::OpenBarrierLocked(GenerationState* gen, BarrierState* b) {
  std::vector<std::pair<uint64_t, Participant*>> order;
  order.reserve(b->arrived.size());
  for (auto& [id, arrival] : b->arrived) order.emplace_back(arrival.seq, &arrival);
  std::sort(order.begin(), order.end(),
            [](const auto& x, const auto& y) { return x.first < y.first; });
  for (size_t i = 0; i < order.size(); ++i) order[i].second->position = static_cast<uint32_t>(i);
  b->open = true;
  for (BarrierWait* w : b->waiters) {
    AnswerBarrierWaitLocked(w, b->arrived.find(w->participant_id)->second.position);
  }
  gen->waiters -= static_cast<int64_t>(b->waiters.size());
  b->waiters.clear();
}

void Rendezvous::AbortWaitersLocked(GenerationState* gen, const std::string& message) {
  for (auto& [name, sc] : gen->scopes) {
    for (auto& [key, waiters] : sc->key_waiters) {
      for (KeyWait* w : waiters) AnswerKeyWaitLocked(w, absl::AbortedError(message));
    }
    sc->key_waiters.clear();
    for (auto& [barrier_name, b] : sc->barriers) {
      for (BarrierWait* w : b->waiters) AnswerBarrierWaitLocked(w, absl::AbortedError(message));
      b->waiters.clear();
    }
  }
  gen->waiters = 0;
}

// ---------------------------------------------------------------------------
// Public API.

absl::Status Rendezvous::Set(absl::string_view job_id, uint64_t generation, absl::string_view scope,
                             absl::string_view key, absl::string_view value) {
  if (absl::Status s = ValidateJobAndScope(job_id, scope); !s.ok()) return s;
  if (absl::Status s = ValidateName("key", key); !s.ok()) return s;
  if (absl::Status s = ValidateValue("value", value); !s.ok()) return s;
  const absl::Time now = clock_->Now();
  std::string copy(value);  // copied before taking the lock

  absl::MutexLock lock(&mu_);
  if (absl::Status s = CheckLiveLocked(job_id, generation); !s.ok()) return s;
  Scope* sc = EnsureScopeLocked(job_id, generation, scope);
  absl::Status s = StoreLocked(FindGenerationLocked(job_id, generation), sc, job_id, generation,
                               scope, key, std::move(copy), now);
  if (!s.ok()) MaybeEraseScopeLocked(job_id, generation, scope);
  return s;
}

absl::StatusOr<std::optional<std::string>> Rendezvous::Get(
    absl::string_view job_id, uint64_t generation, absl::string_view scope, absl::string_view key,
    bool wait, std::optional<absl::Duration> timeout, absl::Time rpc_deadline) {
  if (wait) {
    return BlockOn<KeyAnswer>(this, [&](Done<KeyAnswer> done) {
      return AwaitKey(job_id, generation, scope, key, timeout, rpc_deadline, std::move(done));
    });
  }
  if (absl::Status s = ValidateJobAndScope(job_id, scope); !s.ok()) return s;
  if (absl::Status s = ValidateName("key", key); !s.ok()) return s;
  if (absl::StatusOr<absl::Duration> t = ResolveTimeout(timeout); !t.ok()) return t.status();

  absl::MutexLock lock(&mu_);
  if (absl::Status s = CheckLiveLocked(job_id, generation); !s.ok()) return s;
  if (const Scope* sc = FindScopeLocked(job_id, generation, scope); sc != nullptr) {
    if (auto it = sc->kv.find(key); it != sc->kv.end())
      return std::optional<std::string>(it->second);
  }
  return std::optional<std::string>();
}

Rendezvous::KeyArrival Rendezvous::AwaitKey(absl::string_view job_id, uint64_t generation,
                                            absl::string_view scope, absl::string_view key,
                                            std::optional<absl::Duration> timeout,
                                            absl::Time rpc_deadline, Done<KeyAnswer> done) {
  if (absl::Status s = ValidateJobAndScope(job_id, scope); !s.ok()) return KeyArrival::Answered(s);
  if (absl::Status s = ValidateName("key", key); !s.ok()) return KeyArrival::Answered(s);
  return StartKeyWait(job_id, generation, scope, {std::string(key)}, /*want_value=*/true, timeout,
                      rpc_deadline, std::move(done));
}

Rendezvous::KeyArrival Rendezvous::AwaitKeys(absl::string_view job_id, uint64_t generation,
                                             absl::string_view scope,
                                             std::vector<std::string> keys,
                                             std::optional<absl::Duration> timeout,
                                             absl::Time rpc_deadline, Done<KeyAnswer> done) {
  if (absl::Status s = ValidateJobAndScope(job_id, scope); !s.ok()) return KeyArrival::Answered(s);
  if (keys.empty() || keys.size() > kMaxKeysPerRequest) {
    return KeyArrival::Answered(absl::InvalidArgumentError(
        absl::StrCat("keys has ", keys.size(), " entries; KvWait needs 1..", kMaxKeysPerRequest,
                     " (kMaxKeysPerRequest)")));
  }
  for (size_t i = 0; i < keys.size(); ++i) {
    if (absl::Status s = ValidateName(absl::StrCat("keys[", i, "]"), keys[i]); !s.ok()) {
      return KeyArrival::Answered(s);
    }
  }
  return StartKeyWait(job_id, generation, scope, std::move(keys), /*want_value=*/false, timeout,
                      rpc_deadline, std::move(done));
}

Rendezvous::KeyArrival Rendezvous::StartKeyWait(absl::string_view job_id, uint64_t generation,
                                                absl::string_view scope,
                                                std::vector<std::string> keys, bool want_value,
                                                std::optional<absl::Duration> timeout,
                                                absl::Time rpc_deadline, Done<KeyAnswer> done) {
  absl::StatusOr<absl::Duration> resolved = ResolveTimeout(timeout);
  if (!resolved.ok()) return KeyArrival::Answered(resolved.status());
  const Deadline deadline = Deadline::From(*resolved, rpc_deadline);
  auto w = std::make_unique<KeyWait>();
  w->done = std::move(done);
  w->job_id = std::string(job_id);
  w->generation = generation;
  w->scope = std::string(scope);
  w->keys = std::move(keys);
  w->want_value = want_value;
  w->bytes = kKeyWaitOverheadBytes;
  for (const std::string& k : w->keys) {
    w->bytes += kWaitedKeyOverheadBytes + static_cast<int64_t>(k.size());
  }
  w->deadline_description = deadline.Describe();

  absl::MutexLock lock(&mu_);
  return StartKeyWaitLocked(std::move(w), deadline.at);
}

absl::StatusOr<int64_t> Rendezvous::Add(absl::string_view job_id, uint64_t generation,
                                        absl::string_view scope, absl::string_view key,
                                        int64_t delta) {
  if (absl::Status s = ValidateJobAndScope(job_id, scope); !s.ok()) return s;
  if (absl::Status s = ValidateName("key", key); !s.ok()) return s;
  const absl::Time now = clock_->Now();

  absl::MutexLock lock(&mu_);
  if (absl::Status s = CheckLiveLocked(job_id, generation); !s.ok()) return s;
  int64_t current = 0;
  if (const Scope* sc = FindScopeLocked(job_id, generation, scope); sc != nullptr) {
    if (auto it = sc->kv.find(key); it != sc->kv.end() && !ParseCounter(it->second, &current)) {
      return absl::FailedPreconditionError(absl::StrCat(
          "key ", Quote(key), " in ", Where(job_id, generation, scope), " holds ",
          Quote(it->second, 32),
          ", which is not the decimal text of an int64 (e.g. \"-12\"); KvAdd works only on "
          "counters. Use another key, or KvDelete this one first"));
    }
  }
  int64_t result = 0;
  if (__builtin_add_overflow(current, delta, &result)) {
    return absl::OutOfRangeError(absl::StrCat(
        "counter ", Quote(key), " in ", Where(job_id, generation, scope), " = ", current,
        "; adding ", delta, " overflows int64 (range ", std::numeric_limits<int64_t>::min(), "..",
        std::numeric_limits<int64_t>::max(), "). The counter is unchanged"));
  }
  Scope* sc = EnsureScopeLocked(job_id, generation, scope);
  absl::Status s = StoreLocked(FindGenerationLocked(job_id, generation), sc, job_id, generation,
                               scope, key, absl::StrCat(result), now);
  if (!s.ok()) {
    MaybeEraseScopeLocked(job_id, generation, scope);
    return s;
  }
  return result;
}

absl::StatusOr<Rendezvous::CasResult> Rendezvous::CompareAndSet(
    absl::string_view job_id, uint64_t generation, absl::string_view scope, absl::string_view key,
    std::optional<absl::string_view> expected, absl::string_view desired) {
  if (absl::Status s = ValidateJobAndScope(job_id, scope); !s.ok()) return s;
  if (absl::Status s = ValidateName("key", key); !s.ok()) return s;
  if (expected.has_value()) {
    if (absl::Status s = ValidateValue("expected", *expected); !s.ok()) return s;
  }
  if (absl::Status s = ValidateValue("desired", desired); !s.ok()) return s;
  const absl::Time now = clock_->Now();
  std::string copy(desired);

  CasResult result;
  {
    absl::MutexLock lock(&mu_);
    if (absl::Status s = CheckLiveLocked(job_id, generation); !s.ok()) return s;
    const std::string* current = nullptr;
    if (const Scope* sc = FindScopeLocked(job_id, generation, scope); sc != nullptr) {
      if (auto it = sc->kv.find(key); it != sc->kv.end()) current = &it->second;
    }
    const bool holds =
        expected.has_value() ? (current != nullptr && *current == *expected) : current == nullptr;
    if (!holds) {
      if (current != nullptr) result.current = *current;
      return result;
    }
    Scope* sc = EnsureScopeLocked(job_id, generation, scope);
    absl::Status s = StoreLocked(FindGenerationLocked(job_id, generation), sc, job_id, generation,
                                 scope, key, std::move(copy), now);
    if (!s.ok()) {
      MaybeEraseScopeLocked(job_id, generation, scope);
      return s;
    }
  }
  result.swapped = true;
  result.current = std::string(desired);
  return result;
}

absl::Status Rendezvous::Wait(absl::string_view job_id, uint64_t generation,
                              absl::string_view scope, const std::vector<std::string>& keys,
                              std::optional<absl::Duration> timeout, absl::Time rpc_deadline) {
  return BlockOn<KeyAnswer>(this,
                            [&](Done<KeyAnswer> done) {
                              return AwaitKeys(job_id, generation, scope, keys, timeout,
                                               rpc_deadline, std::move(done));
                            })
      .status();
}

absl::StatusOr<bool> Rendezvous::Delete(absl::string_view job_id, uint64_t generation,
                                        absl::string_view scope, absl::string_view key) {
  if (absl::Status s = ValidateJobAndScope(job_id, scope); !s.ok()) return s;
  if (absl::Status s = ValidateName("key", key); !s.ok()) return s;
  const absl::Time now = clock_->Now();
  std::string freed;  // destroyed after the lock is released

  absl::MutexLock lock(&mu_);
  if (absl::Status s = CheckLiveLocked(job_id, generation); !s.ok()) return s;
  Scope* sc = FindScopeLocked(job_id, generation, scope);
  if (sc == nullptr) return false;
  auto it = sc->kv.find(key);
  if (it == sc->kv.end()) return false;
  GenerationState* gen = FindGenerationLocked(job_id, generation);
  gen->bytes -= static_cast<int64_t>(it->first.size() + it->second.size()) + kKeyOverheadBytes;
  --gen->keys;
  gen->last_write = std::max(gen->last_write, now);
  freed = std::move(it->second);
  sc->kv.erase(it);
  MaybeEraseScopeLocked(job_id, generation, scope);
  return true;
}

absl::StatusOr<uint64_t> Rendezvous::NumKeys(absl::string_view job_id, uint64_t generation,
                                             absl::string_view scope) const {
  if (absl::Status s = ValidateJobAndScope(job_id, scope); !s.ok()) return s;
  absl::MutexLock lock(&mu_);
  if (absl::Status s = CheckLiveLocked(job_id, generation); !s.ok()) return s;
  const Scope* sc = FindScopeLocked(job_id, generation, scope);
  return sc == nullptr ? uint64_t{0} : static_cast<uint64_t>(sc->kv.size());
}

absl::StatusOr<uint32_t> Rendezvous::Barrier(absl::string_view job_id, uint64_t generation,
                                             absl::string_view scope, absl::string_view name,
                                             absl::string_view participant_id,
                                             uint32_t participants,
                                             std::optional<absl::Duration> timeout,
                                             absl::Time rpc_deadline) {
  return BlockOn<uint32_t>(this, [&](Done<uint32_t> done) {
    return BarrierArrive(job_id, generation, scope, name, participant_id, participants, timeout,
                         rpc_deadline, std::move(done));
  });
}

Rendezvous::BarrierArrival Rendezvous::BarrierArrive(
    absl::string_view job_id, uint64_t generation, absl::string_view scope, absl::string_view name,
    absl::string_view participant_id, uint32_t participants,
    std::optional<absl::Duration> timeout, absl::Time rpc_deadline, Done<uint32_t> done) {
  auto answer = [](absl::StatusOr<uint32_t> a) { return BarrierArrival::Answered(std::move(a)); };
  if (absl::Status s = ValidateJobAndScope(job_id, scope); !s.ok()) return answer(s);
  if (absl::Status s = ValidateName("name", name); !s.ok()) return answer(s);
  if (participant_id.empty()) {
    return answer(absl::InvalidArgumentError(
        "participant_id is empty; pass the caller's worker_id (fence.worker.worker_id)"));
  }
  if (participants < 1 || participants > kMaxBarrierParticipants) {
    return answer(absl::InvalidArgumentError(
        absl::StrCat("participants is ", participants, "; it must be in 1..",
                     kMaxBarrierParticipants, " (kMaxBarrierParticipants)")));
  }
  absl::StatusOr<absl::Duration> resolved = ResolveTimeout(timeout);
  if (!resolved.ok()) return answer(resolved.status());
  const Deadline deadline = Deadline::From(*resolved, rpc_deadline);
  std::string barrier_desc =
      absl::StrCat("barrier ", Quote(name), " in ", Where(job_id, generation, scope));

  absl::MutexLock lock(&mu_);
  if (absl::Status s = CheckLiveLocked(job_id, generation); !s.ok()) return answer(s);
  Scope* sc = EnsureScopeLocked(job_id, generation, scope);
  GenerationState* gen = FindGenerationLocked(job_id, generation);
  auto slot = sc->barriers.find(name);
  if (slot == sc->barriers.end()) {
    if (absl::Status s = ChargeLocked(gen, sc, job_id, generation, scope,
                                      static_cast<int64_t>(name.size()) + kBarrierOverheadBytes,
                                      absl::StrCat("creating barrier ", Quote(name)));
        !s.ok()) {
      MaybeEraseScopeLocked(job_id, generation, scope);
      return answer(s);
    }
    auto fresh = std::make_unique<BarrierState>();
    fresh->participants = participants;
    slot = sc->barriers.emplace(std::string(name), std::move(fresh)).first;
  }
  BarrierState* b = slot->second.get();
  if (b->participants != participants) {
    return answer(absl::FailedPreconditionError(
        absl::StrCat(barrier_desc, " was created with participants = ", b->participants,
                     " but this arrival gives participants = ", participants,
                     "; every arrival must give the same number (or use a new barrier name)")));
  }
  auto it = b->arrived.find(participant_id);
  if (b->open) {
    if (it != b->arrived.end()) return answer(it->second.position);
    return answer(absl::FailedPreconditionError(absl::StrCat(
        barrier_desc, " already opened with its ", b->participants, " participants; ",
        Quote(participant_id), " is not one of them (more distinct arrivals than participants = ",
        b->participants, "). Check the participant count, or use a new barrier name")));
  }
  const int64_t arrival_bytes = static_cast<int64_t>(participant_id.size()) + kArrivalOverheadBytes;
  if (it == b->arrived.end()) {
    if (absl::Status s = ChargeLocked(gen, sc, job_id, generation, scope, arrival_bytes,
                                      absl::StrCat("arriving at ", barrier_desc));
        !s.ok()) {
      return answer(s);
    }
    it = b->arrived.emplace(std::string(participant_id), Participant{b->next_seq++, 0, 0}).first;
    if (b->arrived.size() == b->participants) {
      OpenBarrierLocked(FindGenerationLocked(job_id, generation), b);
      return answer(b->arrived.find(participant_id)->second.position);
    }
  }
  ++it->second.waiting_calls;
  BarrierArrival out;
  out.wait_id = next_wait_id_++;
  out.deadline = deadline.at;
  auto wait = std::make_unique<BarrierWait>();
  wait->job_id = std::string(job_id);
  wait->generation = generation;
  wait->scope = std::string(scope);
  wait->name = std::string(name);
  wait->participant_id = std::string(participant_id);
  wait->arrival_bytes = arrival_bytes;
  wait->description = std::move(barrier_desc);
  wait->deadline_description = deadline.Describe();
  wait->done = std::move(done);
  wait->wait_id = out.wait_id;
  b->waiters.insert(wait.get());
  ++FindGenerationLocked(job_id, generation)->waiters;
  barrier_waits_.emplace(out.wait_id, std::move(wait));
  return out;
}

std::optional<absl::Status> Rendezvous::Withdraw(uint64_t wait_id, bool cancelled) {
  absl::MutexLock lock(&mu_);
  if (auto found = key_waits_.find(wait_id); found != key_waits_.end()) {
    std::unique_ptr<KeyWait> w = std::move(found->second);
    key_waits_.erase(found);
    return WithdrawKeyWaitLocked(std::move(w), cancelled);
  }
  if (auto found = barrier_waits_.find(wait_id); found != barrier_waits_.end()) {
    std::unique_ptr<BarrierWait> w = std::move(found->second);
    barrier_waits_.erase(found);
    return WithdrawBarrierWaitLocked(std::move(w), cancelled);
  }
  return std::nullopt;  // answered through `done`
}

absl::Status Rendezvous::WithdrawKeyWaitLocked(std::unique_ptr<KeyWait> w, bool cancelled) {
  // Still registered (a write or an abort would have answered it), so the
  // generation and scope are alive.
  Scope* sc = FindScopeLocked(w->job_id, w->generation, w->scope);
  GenerationState* gen = FindGenerationLocked(w->job_id, w->generation);
  auto waiting = sc->key_waiters.find(w->keys[w->next]);
  waiting->second.erase(w.get());
  if (waiting->second.empty()) sc->key_waiters.erase(waiting);
  --gen->waiters;
  gen->waiting_bytes -= w->bytes;
  absl::Status answer = GaveUpLocked(sc, *w, cancelled);
  MaybeEraseScopeLocked(w->job_id, w->generation, w->scope);
  return answer;
}

absl::Status Rendezvous::WithdrawBarrierWaitLocked(std::unique_ptr<BarrierWait> wait,
                                                   bool cancelled) {
  const BarrierWait& a = *wait;
  // Still registered (opening or aborting would have answered it), so the
  // generation and barrier are alive.
  BarrierState* b =
      FindScopeLocked(a.job_id, a.generation, a.scope)->barriers.find(a.name)->second.get();
  b->waiters.erase(wait.get());
  --FindGenerationLocked(a.job_id, a.generation)->waiters;
  const size_t arrived = b->arrived.size();
  auto it = b->arrived.find(a.participant_id);
  const bool withdrawn = --it->second.waiting_calls == 0;
  if (withdrawn) {
    b->arrived.erase(it);
    FindGenerationLocked(a.job_id, a.generation)->bytes -= a.arrival_bytes;
  }
  const std::string counts = absl::StrCat(
      arrived, " of ", b->participants, " participants had arrived (this caller included); ",
      withdrawn ? "this caller is withdrawn and no longer counts"
                : "this participant still counts (another of its calls is waiting)");
  if (cancelled) {
    return absl::CancelledError(
        absl::StrCat(a.description, ": the caller cancelled while waiting; ", counts));
  }
  return absl::DeadlineExceededError(
      absl::StrCat(a.description, " did not open ", a.deadline_description, ": ", counts));
}

void Rendezvous::EndGeneration(absl::string_view job_id, uint64_t generation) {
  if (job_id.empty()) return;
  Doomed doomed;  // freed after unlocking
  absl::MutexLock lock(&mu_);
  JobState& js = jobs_[job_id];
  if (js.dropped || generation < js.first_live_generation) return;
  if (generation == std::numeric_limits<uint64_t>::max()) {
    js.dropped = true;
  } else {
    js.first_live_generation = generation + 1;
  }
  for (auto it = js.generations.begin(); it != js.generations.end();) {
    if (it->first <= generation) {
      AbortWaitersLocked(it->second.get(), absl::StrCat(EndedMessage(job_id, it->first),
                                                        " (it ended while this call waited)"));
      doomed.gens.push_back(std::move(it->second));
      js.generations.erase(it++);
    } else {
      ++it;
    }
  }
}

void Rendezvous::DropJob(absl::string_view job_id) {
  if (job_id.empty()) return;
  Doomed doomed;  // freed after unlocking
  absl::MutexLock lock(&mu_);
  JobState& js = jobs_[job_id];
  js.dropped = true;
  for (auto& [generation, gen] : js.generations) {
    AbortWaitersLocked(gen.get(), absl::StrCat(DroppedMessage(job_id),
                                               " (it was dropped while this call waited in "
                                               "generation ",
                                               generation, ")"));
    doomed.gens.push_back(std::move(gen));
  }
  js.generations.clear();
}

void Rendezvous::ForgetJob(absl::string_view job_id) {
  DropJob(job_id);
  absl::MutexLock lock(&mu_);
  jobs_.erase(job_id);
}

std::vector<std::string> Rendezvous::JobsHoldingState() const {
  absl::MutexLock lock(&mu_);
  std::vector<std::string> out;
  for (const auto& [job_id, js] : jobs_) {
    if (!js.generations.empty()) out.push_back(job_id);
  }
  return out;
}

Rendezvous::Usage Rendezvous::GetJobUsage(absl::string_view job_id) const {
  absl::MutexLock lock(&mu_);
  Usage usage;
  auto job = jobs_.find(job_id);
  if (job == jobs_.end()) return usage;
  for (const auto& [generation, gen] : job->second.generations) {
    usage.keys += gen->keys;
    usage.scopes += gen->scopes_charged;
    usage.bytes += gen->bytes;
    usage.waiters += gen->waiters;
    usage.waiting_bytes += gen->waiting_bytes;
    usage.last_write = std::max(usage.last_write, gen->last_write);
    for (const auto& [name, sc] : gen->scopes) usage.barriers += sc->barriers.size();
  }
  return usage;
}

Rendezvous::Usage Rendezvous::GetUsage(absl::string_view job_id, uint64_t generation) const {
  absl::MutexLock lock(&mu_);
  Usage usage;
  const GenerationState* gen = FindGenerationLocked(job_id, generation);
  if (gen == nullptr) return usage;
  usage.keys = gen->keys;
  usage.scopes = gen->scopes_charged;
  usage.bytes = gen->bytes;
  usage.waiters = gen->waiters;
  usage.waiting_bytes = gen->waiting_bytes;
  usage.last_write = gen->last_write;
  for (const auto& [name, sc] : gen->scopes) usage.barriers += sc->barriers.size();
  return usage;
}

}  // namespace shardline::server
