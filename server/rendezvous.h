// Rendezvous: the coordinator's key-value store and barriers for
// control-plane agreement between the workers of one generation (NCCL unique
// ids, Gloo addresses, commit votes). Serves proto/shardline/v1/rendezvous.proto
// minus the fence check: the coordinator validates the caller's fence, then
// calls in with the fence's job_id and generation. No gRPC in here.
//
//   RealClock clock;
//   Rendezvous rv(&clock);
//   // rank 0 of tp group 3:
//   rv.Set("j1", /*generation=*/4, /*scope=*/"tp/3", "ncclUniqueId", id);
//   // ranks 1..7 of it:
//   absl::StatusOr<std::optional<std::string>> v =
//       rv.Get("j1", 4, "tp/3", "ncclUniqueId", /*wait=*/true, absl::Seconds(60));
//   // node lost: the coordinator re-forms the job and ends generation 4;
//   // every call still blocked on generation <= 4 returns ABORTED.
//   rv.EndGeneration("j1", 4);
//
// Namespacing. Every key and barrier lives in (job_id, generation, scope);
// different scopes, generations and jobs never see each other's keys. The
// scope "" is the generation-wide scope.
//
// Lifecycle of a generation's state:
//
//   (nothing) --first write or wait--> LIVE --EndGeneration(job, g' >= g)--> ENDED
//                                        |                                   ^
//                                        +---------- DropJob(job) -----------+
//
// A LIVE generation holds keys and barriers; its state is created on demand
// and freed again when it holds nothing. ENDED is final: its keys and
// barriers are dropped, every call blocked on it returns ABORTED at once, and
// every later call for it returns ABORTED. Generations newer than the ended
// one are untouched. The record that a job's generations ended (job id and
// one integer) is kept for the life of this object, so a call that passed
// the coordinator's fence check just before EndGeneration/DropJob can never
// resurrect dropped state; ForgetJob drops even that record, for a job the
// coordinator deleted (whose fences can never pass again).
//
// Waiting. A call that waits (Get with wait, Wait, Barrier) is a record
// registered under the one key (or barrier) it waits for, not a thread: the
// write that creates the key (the arrival that opens the barrier) answers it
// at once, under the lock. Servers use the asynchronous forms (AwaitKey,
// AwaitKeys, BarrierArrive: an answer callback and Withdraw), so a waiting
// RPC holds no thread; the blocking forms are those plus a wait.
//
// Time. Timeouts are durations of real time (absl::Now()): a waiting call
// ends when the key appears, the generation ends, or real time passes its
// deadline. The Clock is used only for timestamps (Usage::last_write);
// advancing a FakeClock never ends a wait.
//
// Errors common to every method that takes (job_id, generation, scope):
//   InvalidArgument: job_id is empty; scope is longer than kMaxScopeBytes.
//   Aborted: the generation has ended (EndGeneration of it or a newer one)
//     or the job was dropped -- before the call or while it was blocked.
//     The caller aborts its communicators and re-joins (JoinJob).
// Each method's comment lists its other errors. Argument checks
// (InvalidArgument) come before state checks (Aborted, then the rest).
//
// Thread-safety: thread-safe. One mutex guards all state; a write touches
// only the calls waiting for the key it creates. No call-outs (Clock
// included) while holding the mutex, except the answer callbacks of the
// asynchronous forms (documented at AwaitKey).
#ifndef SHARDLINE_SERVER_RENDEZVOUS_H_
#define SHARDLINE_SERVER_RENDEZVOUS_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/clock.h"

namespace shardline::server {

// Limits from rendezvous.proto (the coordinator enforces the same numbers).
inline constexpr size_t kMaxScopeBytes = 256;                 // -> InvalidArgument
inline constexpr size_t kMaxKeyBytes = 512;                   // >= 1 -> InvalidArgument
inline constexpr size_t kMaxValueBytes = 1048576;             // 1 MiB -> InvalidArgument
inline constexpr size_t kMaxKeysPerRequest = 65536;           // Wait -> InvalidArgument
inline constexpr size_t kMaxKeysPerScope = 65536;             // -> ResourceExhausted
inline constexpr int64_t kMaxBytesPerGeneration = 268435456;  // 256 MiB -> ResourceExhausted
inline constexpr uint32_t kMaxBarrierParticipants = 65536;    // -> InvalidArgument
// Scopes holding keys or barriers in one generation -> ResourceExhausted.
// A generation's ProcessGroups are at most 4 per rank (TP, PP, DP and the
// embedding group, plan.proto): enough for 65536 ranks. kMaxMembersPerJob is
// 131072 (fleet-scale rendezvous), where a layout whose every group holds a
// scope could exceed it; groups of one rank need none.
inline constexpr size_t kMaxScopesPerGeneration = 262144;

// What the kMaxBytesPerGeneration budget charges: every byte an entry costs
// in this process, not just the caller's bytes (issue 14: 659k one-key
// scopes of 248 bytes were counted as 659 KB and cost 288 MB). Each
// constant bounds the bookkeeping of one entry from above; measured with
// mallinfo2 on x86-64, glibc 2.36, Debian 12's Abseil (200k scopes of 248
// bytes with one key: 566 bytes each in the heap, charged 841; 60k keys of
// 21 bytes with 17-byte values: 206 each, charged 245; 60k barriers with
// one arrival: 282 each, charged 446):
//   a key:      key + value bytes + kKeyOverheadBytes (its slot of two
//               std::string in the scope's flat_hash_map, which may be
//               7/16 full after growing, plus the allocator's rounding and
//               headers of the key's and value's heap buffers);
//   a scope:    scope bytes + kScopeOverheadBytes while it holds a key or a
//               barrier (its slot in the generation's map, the Scope with
//               its three maps, its key map's first allocation, the heap
//               copy of its name);
//   a barrier:  name bytes + kBarrierOverheadBytes (slot, BarrierState and
//               its maps);
//   an arrival: participant_id bytes + kArrivalOverheadBytes (a slot of
//               std::string + Arrival in the barrier's map).
inline constexpr int64_t kKeyOverheadBytes = 208;
inline constexpr int64_t kScopeOverheadBytes = 384;
inline constexpr int64_t kBarrierOverheadBytes = 320;
inline constexpr int64_t kArrivalOverheadBytes = 112;
// Gets and Waits that wait hold no thread; what they cost is charged, while
// they wait, to a budget of their own, kMaxWaitingBytesPerGeneration (not
// to kMaxBytesPerGeneration: waiting calls must never keep out the write
// that would answer them). A waiting call is charged its keys'
// bytes, kWaitedKeyOverheadBytes per key (the std::string in its list and
// its heap buffer) and kKeyWaitOverheadBytes (the wait record, its copies
// of job id, scope and deadline text, its slot in the wait index, the
// waited key's entry in the scope's map of waiters and its set). Measured
// as above with a 21-byte job id: 60k one-key waits on distinct ~20-byte
// keys cost 645 bytes each (charged 724), 60k on one key 393 each; 1000
// waits of 1000 ~20-byte keys 64 bytes a key (charged 84).
inline constexpr int64_t kKeyWaitOverheadBytes = 640;
inline constexpr int64_t kWaitedKeyOverheadBytes = 64;
// Charged bytes of the Gets and Waits waiting at once in one generation ->
// ResourceExhausted (256 MiB: ~370k one-key waits, or 7 Waits of 65536
// keys of kMaxKeyBytes).
inline constexpr int64_t kMaxWaitingBytesPerGeneration = 268435456;
inline constexpr absl::Duration kDefaultWaitTimeout = absl::Seconds(300);
inline constexpr absl::Duration kMaxWaitTimeout = absl::Seconds(3600);

class Rendezvous {
 public:
  // Result of CompareAndSet (KvCompareAndSetResponse).
  struct CasResult {
    bool swapped = false;                // true when `desired` was stored
    std::optional<std::string> current;  // value after the call; nullopt = key missing
  };

  // What one generation holds (for operators and tests).
  struct Usage {
    int64_t keys = 0;    // keys in all scopes
    int64_t scopes = 0;  // scopes holding keys or barriers (kMaxScopesPerGeneration)
    // Bytes charged to the kMaxBytesPerGeneration budget: keys, values,
    // scope and barrier names, participant ids and the overheads above.
    int64_t bytes = 0;
    int64_t barriers = 0;  // barriers created (open or not)
    int64_t waiters = 0;   // calls waiting right now (Get with wait, Wait, Barrier)
    // Bytes of the Gets and Waits waiting right now, charged to
    // kMaxWaitingBytesPerGeneration (kKeyWaitOverheadBytes ...).
    int64_t waiting_bytes = 0;
    absl::Time last_write = absl::InfinitePast();  // Clock time of the last successful write
  };

  // `clock` is not owned and must outlive this object.
  explicit Rendezvous(Clock* clock);
  ~Rendezvous();
  Rendezvous(const Rendezvous&) = delete;
  Rendezvous& operator=(const Rendezvous&) = delete;

  // Timeouts (`timeout` of Get, Wait, Barrier and their asynchronous
  // forms): nullopt (unset in the proto) means kDefaultWaitTimeout; 0 means
  // check once without waiting. A waiting call ends with DeadlineExceeded
  // at the earlier of now + timeout and `rpc_deadline` (the gRPC deadline,
  // absl::Now() time; pass absl::InfiniteFuture() when there is none).
  // InvalidArgument: timeout < 0 or > kMaxWaitTimeout.
  //
  // The asynchronous forms (AwaitKey, AwaitKeys, BarrierArrive), for
  // servers that answer from callbacks (server/rpc/rendezvous_service.cc),
  // do what the blocking call does and answer the same. When the answer is
  // known at once (the key is set, the barrier opened, an error, or
  // timeout 0 and nothing to wait for), it is in Arrival::answer and `done`
  // is dropped. Otherwise the call waits (Arrival::wait_id), and exactly
  // one of these ends it:
  //   * `done` is called with the answer, *with the Rendezvous's lock held*
  //     (so it must only hand the answer on, e.g. finish an RPC, and never
  //     call into the Rendezvous or wait for a lock that is held while
  //     calling it): when the keys are set or the barrier opens, or Aborted
  //     when the generation ends (the blocking call's messages);
  //   * Withdraw(wait_id) before that, which the caller must call at
  //     Arrival::deadline (real time: the earlier of now + timeout and
  //     rpc_deadline) or when it gives up (cancelled).
  // Each blocking call is its asynchronous form and a wait for `done` until
  // the deadline, then Withdraw.
  template <typename T>
  using Done = std::function<void(absl::StatusOr<T>)>;
  template <typename T>
  struct Arrival {
    std::optional<absl::StatusOr<T>> answer;  // set: answered at once
    uint64_t wait_id = 0;                     // else: the waiting call
    absl::Time deadline;                      // ... and when to withdraw it

    static Arrival Answered(absl::StatusOr<T> a) {
      Arrival out;
      out.answer = std::move(a);
      return out;
    }
  };
  // Get's and Wait's answer: the key's value (AwaitKey); nullopt (AwaitKeys).
  using KeyAnswer = std::optional<std::string>;
  using KeyArrival = Arrival<KeyAnswer>;
  using BarrierArrival = Arrival<uint32_t>;

  // Stores `value` under `key`, overwriting any previous value, and wakes
  // the calls waiting for `key`. Errors:
  //   InvalidArgument: key empty or longer than kMaxKeyBytes; value longer
  //     than kMaxValueBytes.
  //   ResourceExhausted: a new key in a scope that already holds
  //     kMaxKeysPerScope keys; a new scope in a generation that already
  //     holds kMaxScopesPerGeneration; or the generation's charged bytes
  //     (see kKeyOverheadBytes) would pass kMaxBytesPerGeneration. The
  //     message names the limit. Nothing is changed.
  absl::Status Set(absl::string_view job_id, uint64_t generation, absl::string_view scope,
                   absl::string_view key, absl::string_view value) ABSL_LOCKS_EXCLUDED(mu_);

  // Reads `key`. When it is missing: with wait = false returns nullopt at
  // once; with wait = true blocks until it is set (then returns its value)
  // or the timeout passes. Errors:
  //   InvalidArgument: key as for Set; timeout (see above), checked even
  //     when wait = false.
  //   DeadlineExceeded: wait = true and the key was not set in time; the
  //     message names the key, scope and how long it waited.
  //   ResourceExhausted: wait = true, the key is missing, and the waiting
  //     call (see kKeyWaitOverheadBytes) would pass
  //     kMaxWaitingBytesPerGeneration.
  absl::StatusOr<std::optional<std::string>> Get(
      absl::string_view job_id, uint64_t generation, absl::string_view scope, absl::string_view key,
      bool wait, std::optional<absl::Duration> timeout = std::nullopt,
      absl::Time rpc_deadline = absl::InfiniteFuture()) ABSL_LOCKS_EXCLUDED(mu_);

  // Adds `delta` to the counter `key` and returns the new value. A missing
  // key counts as 0; the result is stored (also when delta = 0, which creates
  // a missing key as "0") as decimal ASCII text: an optional '-' and digits,
  // no spaces or '+', e.g. "3". Wakes the calls waiting for a new key.
  // Errors:
  //   InvalidArgument: key as for Set.
  //   FailedPrecondition: the key holds something other than such text of
  //     an int64 (the message shows the value, escaped, first 32 bytes).
  //   OutOfRange: value + delta overflows int64; the counter is unchanged.
  //   ResourceExhausted: as for Set (a new key, or a longer text).
  absl::StatusOr<int64_t> Add(absl::string_view job_id, uint64_t generation,
                              absl::string_view scope, absl::string_view key, int64_t delta)
      ABSL_LOCKS_EXCLUDED(mu_);

  // Stores `desired` when `key` holds `expected` (nullopt: when `key` is
  // missing, i.e. create-if-absent). Returns whether it swapped and the
  // key's value after the call. Errors:
  //   InvalidArgument: key as for Set; desired or expected longer than
  //     kMaxValueBytes (the message names which).
  //   ResourceExhausted: as for Set, only when the comparison held; nothing
  //     is changed.
  absl::StatusOr<CasResult> CompareAndSet(absl::string_view job_id, uint64_t generation,
                                          absl::string_view scope, absl::string_view key,
                                          std::optional<absl::string_view> expected,
                                          absl::string_view desired) ABSL_LOCKS_EXCLUDED(mu_);

  // Blocks until every key in `keys` exists at the same time (duplicates are
  // allowed), or the timeout passes. Errors:
  //   InvalidArgument: keys is empty or has more than kMaxKeysPerRequest
  //     entries; keys[i] empty or longer than kMaxKeyBytes (the message
  //     names i); timeout (see above).
  //   DeadlineExceeded: some keys still missing; the message names the
  //     first 16 missing keys and how many are missing.
  //   ResourceExhausted: some keys are missing, and the waiting call (its
  //     keys, see kKeyWaitOverheadBytes) would pass
  //     kMaxWaitingBytesPerGeneration.
  absl::Status Wait(absl::string_view job_id, uint64_t generation, absl::string_view scope,
                    const std::vector<std::string>& keys,
                    std::optional<absl::Duration> timeout = std::nullopt,
                    absl::Time rpc_deadline = absl::InfiniteFuture()) ABSL_LOCKS_EXCLUDED(mu_);

  // Get with wait = true and Wait without blocking a thread (see "The
  // asynchronous forms" above): the same checks, answers and errors. A
  // waiting call's Withdraw answers DeadlineExceeded as the blocking call
  // would, or Cancelled ("the caller cancelled while waiting ...").
  KeyArrival AwaitKey(absl::string_view job_id, uint64_t generation, absl::string_view scope,
                      absl::string_view key, std::optional<absl::Duration> timeout,
                      absl::Time rpc_deadline, Done<KeyAnswer> done) ABSL_LOCKS_EXCLUDED(mu_);
  KeyArrival AwaitKeys(absl::string_view job_id, uint64_t generation, absl::string_view scope,
                       std::vector<std::string> keys, std::optional<absl::Duration> timeout,
                       absl::Time rpc_deadline, Done<KeyAnswer> done) ABSL_LOCKS_EXCLUDED(mu_);

  // Deletes `key`; returns true when it existed (deleting a missing key is
  // not an error). Frees its bytes and its slot in the scope. Errors:
  //   InvalidArgument: key as for Set.
  absl::StatusOr<bool> Delete(absl::string_view job_id, uint64_t generation,
                              absl::string_view scope, absl::string_view key)
      ABSL_LOCKS_EXCLUDED(mu_);

  // Counts the keys set in (job_id, generation, scope) now, counters
  // included (torch's Store.num_keys); 0 for a scope that holds none.
  // Linearizable with the other calls (taken under the one mutex). Errors:
  // the common ones only (InvalidArgument scope; Aborted ended generation).
  absl::StatusOr<uint64_t> NumKeys(absl::string_view job_id, uint64_t generation,
                                   absl::string_view scope) const ABSL_LOCKS_EXCLUDED(mu_);

  // Arrives at the single-use barrier `name` as `participant_id` (the
  // caller's worker_id) and blocks until `participants` distinct
  // participants have arrived; returns the caller's 0-based arrival
  // position among them (positions 0..participants-1, in order of
  // arrival). Once open the barrier stays open: a repeated arrival of a
  // counted participant returns its position at once. A participant that
  // arrives again while it waits (an RPC retry) is counted once; a caller
  // that times out is withdrawn (when it has no other call still waiting)
  // and no longer counts. Errors:
  //   InvalidArgument: name empty or longer than kMaxKeyBytes;
  //     participant_id empty; participants not in 1..kMaxBarrierParticipants;
  //     timeout (see above).
  //   FailedPrecondition: `participants` differs from the number the
  //     barrier was created with (the message names both); or the barrier
  //     is already open and `participant_id` is not one of its
  //     participants (more distinct arrivals than `participants`).
  //   DeadlineExceeded: the barrier did not open in time; the message names
  //     the barrier and how many of `participants` had arrived.
  //   ResourceExhausted: a new barrier or arrival would pass
  //     kMaxBytesPerGeneration, or a new scope kMaxScopesPerGeneration.
  absl::StatusOr<uint32_t> Barrier(absl::string_view job_id, uint64_t generation,
                                   absl::string_view scope, absl::string_view name,
                                   absl::string_view participant_id, uint32_t participants,
                                   std::optional<absl::Duration> timeout = std::nullopt,
                                   absl::Time rpc_deadline = absl::InfiniteFuture())
      ABSL_LOCKS_EXCLUDED(mu_);

  // Barrier without blocking a thread (see "The asynchronous forms"
  // above): the same arrival, checks, answers and errors.
  BarrierArrival BarrierArrive(absl::string_view job_id, uint64_t generation,
                               absl::string_view scope, absl::string_view name,
                               absl::string_view participant_id, uint32_t participants,
                               std::optional<absl::Duration> timeout, absl::Time rpc_deadline,
                               Done<uint32_t> done) ABSL_LOCKS_EXCLUDED(mu_);

  // Withdraws the waiting call `wait_id` (of AwaitKey, AwaitKeys or
  // BarrierArrive) as a timed-out blocking call is withdrawn, and returns
  // its answer: DeadlineExceeded (the blocking call's message), or
  // Cancelled (the message says the caller cancelled while waiting) when
  // `cancelled`. nullopt when `done` was already called (or `wait_id` is
  // unknown): nothing is changed.
  std::optional<absl::Status> Withdraw(uint64_t wait_id, bool cancelled = false)
      ABSL_LOCKS_EXCLUDED(mu_);

  // Ends `generation` and every older generation of `job_id`: drops their
  // keys and barriers, makes every call blocked on them return Aborted
  // ("generation N ... ended; re-join"), and makes later calls for them
  // Aborted. Newer generations are untouched. Idempotent; ending an older
  // generation than one already ended is a no-op. Never fails (an empty
  // job_id is a no-op).
  void EndGeneration(absl::string_view job_id, uint64_t generation) ABSL_LOCKS_EXCLUDED(mu_);

  // Ends every generation of `job_id`, present and future (the job was
  // cancelled, completed or failed). Idempotent; never fails.
  void DropJob(absl::string_view job_id) ABSL_LOCKS_EXCLUDED(mu_);

  // What (job_id, generation) holds now; all zero for a generation that
  // holds nothing or has ended.
  Usage GetUsage(absl::string_view job_id, uint64_t generation) const ABSL_LOCKS_EXCLUDED(mu_);
  // The same, summed over every generation of `job_id` (last_write: the
  // latest); all zero once its generations ended or it was dropped.
  Usage GetJobUsage(absl::string_view job_id) const ABSL_LOCKS_EXCLUDED(mu_);

  // Jobs that hold keys, barriers or waiters in some generation (the
  // server's tick drops those whose job finished or is gone, so that a job
  // that ends without a GenerationEnded -- COMPLETED, FAILED -- frees its
  // state too).
  std::vector<std::string> JobsHoldingState() const ABSL_LOCKS_EXCLUDED(mu_);

  // Drops `job_id` as DropJob does, then forgets even the record that it
  // was dropped: for a job the coordinator no longer knows (deleted), whose
  // fence can never pass again. Idempotent; never fails.
  void ForgetJob(absl::string_view job_id) ABSL_LOCKS_EXCLUDED(mu_);

 private:
  // A waiting Get or Wait (AwaitKey, AwaitKeys; the blocking forms too),
  // registered under keys[next], the first key found missing, until
  // answered through `done` or withdrawn.
  struct KeyWait {
    Done<KeyAnswer> done;
    uint64_t wait_id = 0;
    std::string job_id;
    uint64_t generation = 0;
    std::string scope;
    std::vector<std::string> keys;  // AwaitKey: the one key
    bool want_value = false;        // AwaitKey: answer the key's value
    size_t next = 0;
    int64_t bytes = 0;                 // charged (waiting_bytes) while it waits
    std::string deadline_description;  // "within the timeout of 5s" ...
  };
  // A waiting barrier arrival (BarrierArrive; Barrier too), until answered
  // through `done` or withdrawn.
  struct BarrierWait {
    Done<uint32_t> done;
    uint64_t wait_id = 0;
    std::string job_id;
    uint64_t generation = 0;
    std::string scope, name, participant_id;
    int64_t arrival_bytes = 0;
    std::string description;           // "barrier 'x' in ..."
    std::string deadline_description;  // "within the timeout of 5s" ...
  };
  struct Participant {
    uint64_t seq = 0;       // order of arrival (withdrawn ones leave gaps)
    int waiting_calls = 0;  // calls of this participant waiting right now
    uint32_t position = 0;  // valid once the barrier is open
  };
  struct BarrierState {
    uint32_t participants = 0;
    bool open = false;
    uint64_t next_seq = 0;
    absl::flat_hash_map<std::string, Participant> arrived;  // by participant_id
    absl::flat_hash_set<BarrierWait*> waiters;
  };
  struct Scope {
    // Whether the scope's name and overhead are charged to the generation
    // (while it holds keys or barriers).
    bool charged = false;
    absl::flat_hash_map<std::string, std::string> kv;
    // Waiting Gets and Waits by the missing key they wait for; an entry is
    // removed whole when the key is created.
    absl::flat_hash_map<std::string, absl::flat_hash_set<KeyWait*>> key_waiters;
    absl::flat_hash_map<std::string, std::unique_ptr<BarrierState>> barriers;
  };
  struct GenerationState {
    absl::flat_hash_map<std::string, std::unique_ptr<Scope>> scopes;
    int64_t keys = 0;
    int64_t scopes_charged = 0;  // scopes holding keys or barriers
    int64_t bytes = 0;           // charged bytes (see kKeyOverheadBytes)
    int64_t waiters = 0;
    int64_t waiting_bytes = 0;  // charged to kMaxWaitingBytesPerGeneration
    absl::Time last_write = absl::InfinitePast();
  };
  struct JobState {
    // Generations below this have ended. Meaningless once `dropped`.
    uint64_t first_live_generation = 0;
    bool dropped = false;
    absl::flat_hash_map<uint64_t, std::unique_ptr<GenerationState>> generations;
  };
  // Generations taken out under mu_, freed when this goes out of scope
  // (declare it before the MutexLock, so after unlocking). Freeing at least
  // kTrimAfterFreeingBytes (charged) returns free heap pages to the system
  // (malloc_trim).
  static constexpr int64_t kTrimAfterFreeingBytes = 16 << 20;
  struct Doomed {
    std::vector<std::unique_ptr<GenerationState>> gens;
    ~Doomed();
  };

  // OK, or Aborted when (job_id, generation) has ended or the job was dropped.
  absl::Status CheckLiveLocked(absl::string_view job_id, uint64_t generation) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // nullptr when the generation or scope holds nothing.
  GenerationState* FindGenerationLocked(absl::string_view job_id, uint64_t generation) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  Scope* FindScopeLocked(absl::string_view job_id, uint64_t generation,
                         absl::string_view scope) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Creates the generation and scope when missing. Precondition: live.
  Scope* EnsureScopeLocked(absl::string_view job_id, uint64_t generation, absl::string_view scope)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Frees the scope, then the generation, when they hold nothing.
  void MaybeEraseScopeLocked(absl::string_view job_id, uint64_t generation, absl::string_view scope)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Charges `bytes` (plus the scope's own charge when `sc` is not charged
  // yet) to `gen`, or says which limit it would pass; `what` names the
  // thing added, for the message.
  absl::Status ChargeLocked(GenerationState* gen, Scope* sc, absl::string_view job_id,
                            uint64_t generation, absl::string_view scope, int64_t bytes,
                            const std::string& what) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Stores key = value under the limits; wakes the waiters of a new key.
  absl::Status StoreLocked(GenerationState* gen, Scope* sc, absl::string_view job_id,
                           uint64_t generation, absl::string_view scope, absl::string_view key,
                           std::string value, absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // AwaitKey's and AwaitKeys' common part, after their checks of job_id,
  // scope and the keys: checks the timeout, makes the wait record and
  // starts it (StartKeyWaitLocked).
  KeyArrival StartKeyWait(absl::string_view job_id, uint64_t generation, absl::string_view scope,
                          std::vector<std::string> keys, bool want_value,
                          std::optional<absl::Duration> timeout, absl::Time rpc_deadline,
                          Done<KeyAnswer> done) ABSL_LOCKS_EXCLUDED(mu_);
  // Starts the wait `w` (job_id, generation, scope and keys filled in):
  // answers at once when its keys are set, or when its deadline has passed;
  // else charges it and registers it under its first missing key.
  KeyArrival StartKeyWaitLocked(std::unique_ptr<KeyWait> w, absl::Time deadline)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Whether every key of `w` is set in `sc` (may be null) now; the answer in
  // *value (AwaitKey: the key's value). Else w->next is a missing key.
  bool KeysReadyLocked(const Scope* sc, KeyWait* w, KeyAnswer* value) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The answer of a wait that gave up: DeadlineExceeded naming what is still
  // missing in `sc` (may be null), or Cancelled.
  absl::Status GaveUpLocked(const Scope* sc, const KeyWait& w, bool cancelled) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Calls w->done with `answer` and forgets the wait (frees *w); the caller
  // has deregistered it and refunded its charge.
  void AnswerKeyWaitLocked(KeyWait* w, absl::StatusOr<KeyAnswer> answer)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Withdraw's halves.
  absl::Status WithdrawKeyWaitLocked(std::unique_ptr<KeyWait> w, bool cancelled)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status WithdrawBarrierWaitLocked(std::unique_ptr<BarrierWait> w, bool cancelled)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Calls w->done with `answer` and forgets the wait (frees *w).
  void AnswerBarrierWaitLocked(BarrierWait* w, absl::StatusOr<uint32_t> answer)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Assigns positions and answers the barrier's waiting arrivals.
  void OpenBarrierLocked(GenerationState* gen, BarrierState* b) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Answers every waiting call of `gen` with `message` (Aborted) and
  // deregisters them.
  void AbortWaitersLocked(GenerationState* gen, const std::string& message)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  Clock* const clock_;  // Not owned.
  mutable absl::Mutex mu_;
  absl::flat_hash_map<std::string, JobState> jobs_ ABSL_GUARDED_BY(mu_);
  // Waiting calls by wait_id (one sequence for both kinds).
  absl::flat_hash_map<uint64_t, std::unique_ptr<KeyWait>> key_waits_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<uint64_t, std::unique_ptr<BarrierWait>> barrier_waits_ ABSL_GUARDED_BY(mu_);
  uint64_t next_wait_id_ ABSL_GUARDED_BY(mu_) = 1;
};

}  // namespace shardline::server

#endif  // SHARDLINE_SERVER_RENDEZVOUS_H_
