// The shared memory segment of one communicator group's ranks on one host:
// its layout, creation and mapping, the futex-based waits on its flags,
// which processes are alive, and the removal of segments whose creator died.
// The collectives over it are in shm_group.h; the Gloo backend
// (gloo_backend.cc, gloo_shm.cc) decides which ranks use it.
//
//   std::string name = shm::SegmentName("dp_0", nonce);
//   absl::StatusOr<std::unique_ptr<shm::Segment>> seg =
//       shm::Segment::Create(name, /*ranks=*/4, /*buffer_bytes=*/1 << 20, nonce);
//   // ... every other local rank: shm::Segment::Open(name, 4, 1 << 20, nonce)
//   shm::Segment::Unlink(name);  // once every rank has mapped it
//
// Layout (every offset a multiple of 4 KiB):
//   Header                       magic, version, ranks, buffer_bytes, nonce
//   RankControl[ranks]           one 256-byte block per local rank: its
//                                sync counter (a futex word), the number of
//                                threads sleeping on it, its state, its
//                                process and the descriptors of its calls
//   buffers[ranks][kBuffers]     each rank's staging buffers of
//                                buffer_bytes; only their owner writes them
//
// Names: "/shardline-<pid namespace>-<pid>-<start time>-<tag>-<nonce>" (the
// creator's process, so a segment whose creator died before unlinking it is
// recognised and removed by ReapStaleSegments).
//
// Thread-safety: Segment is immutable after construction (the memory it maps
// is shared and synchronised by its atomics); the functions are thread-safe.
#ifndef SHARDLINE_WORKER_COMM_SHM_SEGMENT_H_
#define SHARDLINE_WORKER_COMM_SHM_SEGMENT_H_

#include <sys/types.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "worker/comm/gloo_checks.h"

namespace shardline::worker::shm {

// Limits of GlooOptions::shm_buffer_bytes (bytes of each staging buffer).
constexpr size_t kMinBufferBytes = size_t{4} << 10;
constexpr size_t kMaxBufferBytes = size_t{256} << 20;
// Local ranks in one segment (group sizes are at most this anyway: a host
// rarely holds more than a few hundred ranks).
constexpr int kMaxLocalRanks = 1024;
// Staging buffers per rank (shm_group.h says why three).
constexpr int kBuffers = 3;

// A rank's state in its RankControl.
enum RankState : uint32_t {
  kUnset = 0,  // not mapped yet
  kAlive = 1,  // taking part
  kGone = 2,   // aborted, destroyed or failed: its peers stop waiting for it
};

struct Header {
  std::atomic<uint64_t> magic;  // kMagic once initialised (release)
  uint32_t version;
  uint32_t ranks;
  uint64_t buffer_bytes;
  uint64_t nonce;
  static constexpr uint64_t kMagic = 0x314d48534c48530aull;  // "\nSHLSHM1"
  static constexpr uint32_t kVersion = 1;
};

struct RankControl {
  // Sync points this rank has reached (mod 2^32). The futex word its peers
  // sleep on.
  alignas(64) std::atomic<uint32_t> arrived;
  // Threads sleeping on `arrived` (its owner wakes them only when non-zero).
  std::atomic<uint32_t> sleepers;
  alignas(64) std::atomic<uint32_t> state;  // RankState
  int32_t pid;                              // its process
  uint64_t start_time;  // of that process, clock ticks after boot (/proc/PID/stat)
  // The descriptor of the collective whose first sync point is sync k, in
  // desc[k % 2] (read by the peers after sync k, rewritten after sync k + 1:
  // see shm_group.h).
  gloo_checks::CallDesc desc[2];
};
static_assert(sizeof(RankControl) <= 256, "RankControl is one 256-byte block");
static_assert(std::atomic<uint32_t>::is_always_lock_free, "futex words must be plain words");

// One mapping of a segment. Destruction unmaps it (the segment lives on
// while another rank maps it).
class Segment {
 public:
  // Creates and maps segment `name` (see SegmentName), sized for `ranks`
  // local ranks with kBuffers buffers of `buffer_bytes` each (a multiple of 4 KiB
  // in [kMinBufferBytes, kMaxBufferBytes]), its pages reserved up front so
  // that a full /dev/shm fails here (ResourceExhausted) rather than with
  // SIGBUS later. Possible errors:
  //   InvalidArgument: ranks or buffer_bytes out of range.
  //   AlreadyExists: a segment of that name exists.
  //   ResourceExhausted: /dev/shm has no room for it (names the size).
  //   Unavailable: another system error (names the call and errno).
  static absl::StatusOr<std::unique_ptr<Segment>> Create(const std::string& name, int ranks,
                                                         size_t buffer_bytes, uint64_t nonce);
  // Maps an existing segment and checks that it is the one described.
  // Possible errors: NotFound (no such segment), FailedPrecondition (its
  // size, magic, ranks, buffer size or nonce differ), Unavailable (a system
  // error, e.g. EACCES for another user's segment).
  static absl::StatusOr<std::unique_ptr<Segment>> Open(const std::string& name, int ranks,
                                                       size_t buffer_bytes, uint64_t nonce);
  // Removes the name (mappings stay valid). OK when it is already gone.
  static absl::Status Unlink(const std::string& name);
  // Bytes of a segment of `ranks` ranks with `buffer_bytes` buffers.
  static size_t SizeFor(int ranks, size_t buffer_bytes);

  ~Segment();
  Segment(const Segment&) = delete;
  Segment& operator=(const Segment&) = delete;

  int ranks() const { return ranks_; }
  size_t buffer_bytes() const { return buffer_bytes_; }
  Header* header() const { return reinterpret_cast<Header*>(base_); }
  RankControl* control(int local) const;
  // Local rank `local`'s buffer `which` (0 .. kBuffers - 1); buffer_bytes() long,
  // 4 KiB aligned.
  char* buffer(int local, int which) const;

 private:
  Segment(void* base, size_t size, int ranks, size_t buffer_bytes)
      : base_(static_cast<char*>(base)), size_(size), ranks_(ranks), buffer_bytes_(buffer_bytes) {}

  char* base_;
  size_t size_;
  int ranks_;
  size_t buffer_bytes_;
};

// This process and its start time (for RankControl and segment names).
struct ProcessId {
  pid_t pid = 0;
  uint64_t start_time = 0;  // clock ticks after boot; 0 when unknown
};
ProcessId ThisProcess();
// The start time of process `pid` (field 22 of /proc/PID/stat), or 0 when
// it does not exist (or /proc cannot be read).
uint64_t ProcessStartTime(pid_t pid);

// Which processes can share a segment: the same kernel boot, the same
// /dev/shm and the same pid namespace (so that a peer's pid means the same
// process here); and the same network namespace, since one of its own
// simulates another host (deploy/netns). "" when it cannot be told (then
// nothing is shared).
std::string ThisHostIdentity();

// "/shardline-<pidns>-<pid>-<start>-<tag>-<nonce hex>"; `tag` (e.g. the
// group's name) is reduced to [A-Za-z0-9_] and 24 characters.
std::string SegmentName(const std::string& tag, uint64_t nonce);

// Removes segments of this pid namespace named by SegmentName whose creator
// is no longer running (it died between creating and unlinking them, e.g.
// SIGKILL during bootstrap). Returns how many it removed. Best effort: errors
// are ignored.
int ReapStaleSegments();

// Watches whether one peer process is still running: through a pidfd where
// the kernel has them (it reports a SIGKILLed process as exited at once,
// before it is reaped), else through /proc/PID/stat (a zombie counts as
// exited). Not thread-safe; one owner.
class ProcessWatch {
 public:
  ProcessWatch() = default;
  explicit ProcessWatch(ProcessId id);
  ~ProcessWatch();
  ProcessWatch(ProcessWatch&& other) noexcept;
  ProcessWatch& operator=(ProcessWatch&& other) noexcept;

  // True once the process has exited (or was replaced by another with its
  // pid). A default-constructed watch never reports an exit.
  bool Exited() const;

 private:
  ProcessId id_;
  int pidfd_ = -1;
};

// Futex operations on a word of a MAP_SHARED mapping (so they reach other
// processes). FutexWait sleeps while *word == expected, at most `timeout`;
// spurious wakes are possible. FutexWake wakes every sleeper.
void FutexWait(std::atomic<uint32_t>* word, uint32_t expected, absl::Duration timeout);
void FutexWake(std::atomic<uint32_t>* word);

}  // namespace shardline::worker::shm

#endif  // SHARDLINE_WORKER_COMM_SHM_SEGMENT_H_
