#include "worker/comm/shm_segment.h"

#include <dirent.h>
#include <fcntl.h>
#include <linux/futex.h>
#include <poll.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace shardline::worker::shm {

namespace {

constexpr size_t kPage = 4096;
constexpr size_t kHeaderBytes = kPage;
constexpr size_t kControlBytes = 256;
constexpr char kNamePrefix[] = "shardline-";

size_t RoundUp(size_t n, size_t to) { return (n + to - 1) / to * to; }

size_t ControlsBytes(int ranks) { return RoundUp(static_cast<size_t>(ranks) * kControlBytes, kPage); }

std::string ErrnoText(int err) { return std::strerror(err); }

absl::Status SystemError(const std::string& what, int err) {
  return absl::UnavailableError(absl::StrCat(what, ": ", ErrnoText(err)));
}

// Inode of /proc/self/ns/<kind>, or 0.
uint64_t Namespace(const char* kind) {
  struct stat st;
  if (::stat(absl::StrCat("/proc/self/ns/", kind).c_str(), &st) != 0) return 0;
  return static_cast<uint64_t>(st.st_ino);
}
uint64_t PidNamespace() { return Namespace("pid"); }

std::string ReadFirstLine(const char* path) {
  std::ifstream f(path);
  std::string line;
  if (!f || !std::getline(f, line)) return "";
  return line;
}

}  // namespace

size_t Segment::SizeFor(int ranks, size_t buffer_bytes) {
  return kHeaderBytes + ControlsBytes(ranks) +
         static_cast<size_t>(ranks) * kBuffers * buffer_bytes;
}

RankControl* Segment::control(int local) const {
  return reinterpret_cast<RankControl*>(base_ + kHeaderBytes + local * kControlBytes);
}

char* Segment::buffer(int local, int which) const {
  return base_ + kHeaderBytes + ControlsBytes(ranks_) +
         (static_cast<size_t>(local) * kBuffers + which) * buffer_bytes_;
}

namespace {

absl::Status CheckShape(int ranks, size_t buffer_bytes) {
  if (ranks < 1 || ranks > kMaxLocalRanks) {
    return absl::InvalidArgumentError(
        absl::StrCat("shared memory ranks=", ranks, " out of range [1,", kMaxLocalRanks, "]"));
  }
  if (buffer_bytes < kMinBufferBytes || buffer_bytes > kMaxBufferBytes ||
      buffer_bytes % kPage != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("shm_buffer_bytes=", buffer_bytes, " must be a multiple of 4096 in [",
                     kMinBufferBytes, ",", kMaxBufferBytes, "]"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<Segment>> Segment::Create(const std::string& name, int ranks,
                                                         size_t buffer_bytes, uint64_t nonce) {
  if (absl::Status s = CheckShape(ranks, buffer_bytes); !s.ok()) return s;
  const size_t size = SizeFor(ranks, buffer_bytes);
  const int fd = ::shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR | O_CLOEXEC, 0600);
  if (fd < 0) {
    const int err = errno;
    if (err == EEXIST) return absl::AlreadyExistsError(absl::StrCat("shm_open ", name, ": exists"));
    return SystemError(absl::StrCat("shm_open ", name), err);
  }
  // Reserve every page now: tmpfs otherwise hands out pages on first touch
  // and a full /dev/shm would kill the process with SIGBUS mid-collective.
  const int err = ::posix_fallocate(fd, 0, static_cast<off_t>(size));
  if (err != 0) {
    ::close(fd);
    ::shm_unlink(name.c_str());
    if (err == ENOSPC || err == ENOMEM || err == EFBIG) {
      return absl::ResourceExhaustedError(absl::StrFormat(
          "/dev/shm has no room for a shared memory segment of %.1f MiB (%s); free space there "
          "or lower GlooOptions::shm_buffer_bytes",
          static_cast<double>(size) / (1 << 20), ErrnoText(err)));
    }
    return SystemError(absl::StrCat("posix_fallocate ", name), err);
  }
  void* base = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  const int map_err = errno;
  ::close(fd);
  if (base == MAP_FAILED) {
    ::shm_unlink(name.c_str());
    return SystemError(absl::StrCat("mmap ", name), map_err);
  }
  auto seg = std::unique_ptr<Segment>(new Segment(base, size, ranks, buffer_bytes));
  // fallocate gave zeroed pages: every RankControl starts kUnset, arrived 0.
  Header* h = seg->header();
  h->version = Header::kVersion;
  h->ranks = static_cast<uint32_t>(ranks);
  h->buffer_bytes = buffer_bytes;
  h->nonce = nonce;
  h->magic.store(Header::kMagic, std::memory_order_release);
  return seg;
}

absl::StatusOr<std::unique_ptr<Segment>> Segment::Open(const std::string& name, int ranks,
                                                       size_t buffer_bytes, uint64_t nonce) {
  if (absl::Status s = CheckShape(ranks, buffer_bytes); !s.ok()) return s;
  const size_t size = SizeFor(ranks, buffer_bytes);
  const int fd = ::shm_open(name.c_str(), O_RDWR | O_CLOEXEC, 0);
  if (fd < 0) {
    const int err = errno;
    if (err == ENOENT) {
      return absl::NotFoundError(absl::StrCat(
          "shared memory segment ", name, " does not exist here (is this rank on another host "
          "than the segment's creator, or in another /dev/shm?)"));
    }
    return SystemError(absl::StrCat("shm_open ", name), err);
  }
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    return SystemError(absl::StrCat("fstat ", name), err);
  }
  if (static_cast<size_t>(st.st_size) != size) {
    ::close(fd);
    return absl::FailedPreconditionError(absl::StrCat("shared memory segment ", name, " has ",
                                                      st.st_size, " bytes, expected ", size));
  }
  void* base = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  const int map_err = errno;
  ::close(fd);
  if (base == MAP_FAILED) return SystemError(absl::StrCat("mmap ", name), map_err);
  auto seg = std::unique_ptr<Segment>(new Segment(base, size, ranks, buffer_bytes));
  const Header* h = seg->header();
  const uint64_t magic = h->magic.load(std::memory_order_acquire);
  if (magic != Header::kMagic || h->version != Header::kVersion ||
      h->ranks != static_cast<uint32_t>(ranks) || h->buffer_bytes != buffer_bytes ||
      h->nonce != nonce) {
    return absl::FailedPreconditionError(
        absl::StrCat("shared memory segment ", name,
                     " is not the one this group's rendezvous described (magic, version, ranks, "
                     "buffer size or nonce differ)"));
  }
  return seg;
}

absl::Status Segment::Unlink(const std::string& name) {
  if (::shm_unlink(name.c_str()) != 0 && errno != ENOENT) {
    return SystemError(absl::StrCat("shm_unlink ", name), errno);
  }
  return absl::OkStatus();
}

Segment::~Segment() { ::munmap(base_, size_); }

uint64_t ProcessStartTime(pid_t pid) {
  const std::string path = absl::StrCat("/proc/", pid, "/stat");
  std::ifstream f(path);
  if (!f) return 0;
  std::stringstream ss;
  ss << f.rdbuf();
  const std::string text = ss.str();
  // "pid (comm) state ppid ..."; comm may hold spaces and parentheses.
  const size_t close = text.rfind(')');
  if (close == std::string::npos) return 0;
  std::vector<std::string> fields = absl::StrSplit(text.substr(close + 1), ' ', absl::SkipEmpty());
  // fields[0] is the state (field 3); starttime is field 22.
  if (fields.size() < 20) return 0;
  if (fields[0] == "Z" || fields[0] == "X") return 0;  // exited, not reaped yet
  uint64_t start = 0;
  if (!absl::SimpleAtoi(fields[19], &start)) return 0;
  return start;
}

ProcessId ThisProcess() {
  static const ProcessId id = [] {
    ProcessId p;
    p.pid = ::getpid();
    p.start_time = ProcessStartTime(p.pid);
    return p;
  }();
  ProcessId p = id;
  if (p.pid != ::getpid()) {  // a fork()ed child
    p.pid = ::getpid();
    p.start_time = ProcessStartTime(p.pid);
  }
  return p;
}

std::string ThisHostIdentity() {
  std::string boot = ReadFirstLine("/proc/sys/kernel/random/boot_id");
  struct stat shm;
  const uint64_t pidns = PidNamespace();
  if (boot.empty() || ::stat("/dev/shm", &shm) != 0 || pidns == 0) return "";
  // A network namespace of its own stands for another host (deploy/netns
  // runs "hosts" that way): a cut-off host must not go on talking to the
  // others through memory.
  return absl::StrCat("boot=", boot, " devshm=", shm.st_dev, ":", shm.st_ino, " pidns=", pidns,
                      " netns=", Namespace("net"));
}

std::string SegmentName(const std::string& tag, uint64_t nonce) {
  std::string clean;
  for (char c : tag) {
    if (clean.size() >= 24) break;
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9');
    clean.push_back(ok ? c : '_');
  }
  if (clean.empty()) clean = "group";
  const ProcessId me = ThisProcess();
  return absl::StrFormat("/%s%d-%d-%d-%s-%016x", kNamePrefix, PidNamespace(), me.pid,
                         me.start_time, clean, nonce);
}

int ReapStaleSegments() {
  const std::string mine = absl::StrCat(kNamePrefix, PidNamespace(), "-");
  DIR* dir = ::opendir("/dev/shm");
  if (dir == nullptr) return 0;
  int removed = 0;
  while (struct dirent* e = ::readdir(dir)) {
    absl::string_view name = e->d_name;
    if (!absl::ConsumePrefix(&name, mine)) continue;
    // "<pid>-<start>-<tag>-<nonce>"
    std::vector<absl::string_view> parts = absl::StrSplit(name, absl::MaxSplits('-', 2));
    if (parts.size() != 3) continue;
    int64_t pid = 0;
    uint64_t start = 0;
    if (!absl::SimpleAtoi(parts[0], &pid) || !absl::SimpleAtoi(parts[1], &start) || pid <= 0) {
      continue;
    }
    if (ProcessStartTime(static_cast<pid_t>(pid)) == start && start != 0) continue;  // running
    if (::shm_unlink(absl::StrCat("/", e->d_name).c_str()) == 0) ++removed;
  }
  ::closedir(dir);
  return removed;
}

ProcessWatch::ProcessWatch(ProcessId id) : id_(id) {
#ifdef SYS_pidfd_open
  pidfd_ = static_cast<int>(::syscall(SYS_pidfd_open, id.pid, 0));
  if (pidfd_ >= 0 && id.start_time != 0 && ProcessStartTime(id.pid) != id.start_time) {
    // The pid already belongs to another process: ours has exited. Keep
    // the fd closed and let Exited() report it through /proc.
    ::close(pidfd_);
    pidfd_ = -1;
  }
#endif
}

ProcessWatch::~ProcessWatch() {
  if (pidfd_ >= 0) ::close(pidfd_);
}

ProcessWatch::ProcessWatch(ProcessWatch&& other) noexcept : id_(other.id_), pidfd_(other.pidfd_) {
  other.pidfd_ = -1;
  other.id_ = ProcessId();
}

ProcessWatch& ProcessWatch::operator=(ProcessWatch&& other) noexcept {
  if (this != &other) {
    if (pidfd_ >= 0) ::close(pidfd_);
    id_ = other.id_;
    pidfd_ = other.pidfd_;
    other.pidfd_ = -1;
    other.id_ = ProcessId();
  }
  return *this;
}

bool ProcessWatch::Exited() const {
  if (id_.pid <= 0) return false;
  if (pidfd_ >= 0) {
    struct pollfd p = {pidfd_, POLLIN, 0};
    return ::poll(&p, 1, 0) > 0 && (p.revents & (POLLIN | POLLHUP | POLLERR)) != 0;
  }
  if (id_.start_time == 0) return ::kill(id_.pid, 0) != 0 && errno == ESRCH;
  return ProcessStartTime(id_.pid) != id_.start_time;
}

void FutexWait(std::atomic<uint32_t>* word, uint32_t expected, absl::Duration timeout) {
  if (timeout <= absl::ZeroDuration()) return;
  const struct timespec ts = absl::ToTimespec(timeout);
  ::syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAIT, expected, &ts, nullptr, 0);
}

void FutexWake(std::atomic<uint32_t>* word) {
  ::syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAKE, INT32_MAX, nullptr, nullptr,
            0);
}

}  // namespace shardline::worker::shm
