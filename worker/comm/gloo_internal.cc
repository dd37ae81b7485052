#include "worker/comm/gloo_internal.h"

#include <arpa/inet.h>
#include <netinet/in.h>

#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "gloo/transport/pair.h"
#include "gloo/transport/tcp/address.h"
#include "worker/comm/float16.h"

namespace shardline::worker::gloo_internal {

std::string GlooName(const sockaddr_storage& ss) { return gloo::transport::tcp::Address(ss).str(); }

std::vector<std::string> NamesInAddressBlob(const std::string& blob, int size) {
  std::vector<std::string> out;
  if (size < 2 || blob.empty() || blob.size() % (size - 1) != 0) return out;
  const size_t entry = blob.size() / (size - 1);
  if (entry < sizeof(sockaddr_storage)) return out;
  for (size_t off = 0; off + entry <= blob.size(); off += entry) {
    sockaddr_storage ss;
    std::memcpy(&ss, blob.data() + off, sizeof(ss));
    if (ss.ss_family == AF_INET || ss.ss_family == AF_INET6) out.push_back(GlooName(ss));
  }
  return out;
}

// One ESTABLISHED socket from /proc/self/net/tcp{,6}.
std::vector<KernelSocket> EstablishedSockets() {
  std::vector<KernelSocket> out;
  for (int family : {AF_INET, AF_INET6}) {
    std::FILE* f =
        std::fopen(family == AF_INET ? "/proc/self/net/tcp" : "/proc/self/net/tcp6", "r");
    if (f == nullptr) continue;
    char line[512];
    while (std::fgets(line, sizeof(line), f) != nullptr) {
      // "  sl  local_address rem_address   st ..." with addresses "HEX:PORT";
      // the address is the raw in-memory words printed as %08X each.
      char local[128], remote[128];
      unsigned state = 0;
      if (std::sscanf(line, " %*s %127s %127s %x", local, remote, &state) != 3) continue;
      if (state != 1) continue;  // TCP_ESTABLISHED
      const char* lp = std::strrchr(local, ':');
      const char* rp = std::strrchr(remote, ':');
      if (lp == nullptr || rp == nullptr) continue;
      KernelSocket ks{};
      ks.local_port = static_cast<uint16_t>(std::strtoul(lp + 1, nullptr, 16));
      const uint16_t remote_port = static_cast<uint16_t>(std::strtoul(rp + 1, nullptr, 16));
      const std::string hex(remote, rp - remote);
      if (family == AF_INET && hex.size() == 8) {
        auto* sin = reinterpret_cast<sockaddr_in*>(&ks.remote);
        sin->sin_family = AF_INET;
        sin->sin_port = htons(remote_port);
        sin->sin_addr.s_addr = static_cast<uint32_t>(std::strtoul(hex.c_str(), nullptr, 16));
      } else if (family == AF_INET6 && hex.size() == 32) {
        auto* sin6 = reinterpret_cast<sockaddr_in6*>(&ks.remote);
        sin6->sin6_family = AF_INET6;
        sin6->sin6_port = htons(remote_port);
        for (int w = 0; w < 4; ++w) {
          const uint32_t word =
              static_cast<uint32_t>(std::strtoul(hex.substr(8 * w, 8).c_str(), nullptr, 16));
          std::memcpy(reinterpret_cast<char*>(&sin6->sin6_addr) + 4 * w, &word, 4);
        }
      } else {
        continue;
      }
      out.push_back(ks);
    }
    std::fclose(f);
  }
  return out;
}

void AddPeerNames(gloo::rendezvous::Context& context, const StoreAdapter& adapter,
                  const std::function<int(int)>& to_group_rank,
                  std::vector<std::vector<std::string>>* names) {
  const std::vector<KernelSocket> sockets = EstablishedSockets();
  for (int r = 0; r < context.size; ++r) {
    if (r == context.rank) continue;
    std::vector<std::string>& out = (*names)[to_group_rank(r)];
    auto it = adapter.seen().find(std::to_string(r));
    if (it != adapter.seen().end()) {
      for (std::string& n : NamesInAddressBlob(it->second, context.size)) out.push_back(std::move(n));
    }
    const auto* self =
        dynamic_cast<const gloo::transport::tcp::Address*>(&context.getPair(r)->address());
    if (self == nullptr) continue;
    const sockaddr_storage& ss = self->getSockaddr();
    uint16_t listen_port = 0;
    if (ss.ss_family == AF_INET) {
      listen_port = ntohs(reinterpret_cast<const sockaddr_in*>(&ss)->sin_port);
    } else if (ss.ss_family == AF_INET6) {
      listen_port = ntohs(reinterpret_cast<const sockaddr_in6*>(&ss)->sin6_port);
    }
    for (const KernelSocket& ks : sockets) {
      if (listen_port != 0 && ks.local_port == listen_port) out.push_back(GlooName(ks.remote));
    }
  }
}

bool Mentions(const std::string& msg, const std::string& needle) {
  for (size_t pos = msg.find(needle); pos != std::string::npos; pos = msg.find(needle, pos + 1)) {
    const size_t end = pos + needle.size();
    if (end >= msg.size() || !std::isdigit(static_cast<unsigned char>(msg[end]))) return true;
  }
  return false;
}

ReduceFn Fp32Reducer(ReduceOp op) {
  switch (op) {
    case ReduceOp::kMax:
      return [](void* c, const void* a, const void* b, size_t n) {
        auto* o = static_cast<float*>(c);
        auto* x = static_cast<const float*>(a);
        auto* y = static_cast<const float*>(b);
        for (size_t i = 0; i < n; ++i) o[i] = std::max(x[i], y[i]);
      };
    case ReduceOp::kMin:
      return [](void* c, const void* a, const void* b, size_t n) {
        auto* o = static_cast<float*>(c);
        auto* x = static_cast<const float*>(a);
        auto* y = static_cast<const float*>(b);
        for (size_t i = 0; i < n; ++i) o[i] = std::min(x[i], y[i]);
      };
    case ReduceOp::kSum:
    case ReduceOp::kAvg:
    default:
      return [](void* c, const void* a, const void* b, size_t n) {
        auto* o = static_cast<float*>(c);
        auto* x = static_cast<const float*>(a);
        auto* y = static_cast<const float*>(b);
        for (size_t i = 0; i < n; ++i) o[i] = x[i] + y[i];
      };
  }
}

void ToFloat32(const void* in, DType dtype, size_t n, float* out) {
  if (dtype == DType::kFloat32) {
    std::memcpy(out, in, n * 4);
    return;
  }
  const auto* h = static_cast<const uint16_t*>(in);
  if (dtype == DType::kFloat16) {
    for (size_t i = 0; i < n; ++i) out[i] = HalfToFloat(h[i]);
  } else {
    for (size_t i = 0; i < n; ++i) out[i] = BFloat16ToFloat(h[i]);
  }
}

void FromFloat32(const float* in, size_t n, DType dtype, void* out) {
  if (dtype == DType::kFloat32) {
    std::memmove(out, in, n * 4);
    return;
  }
  auto* h = static_cast<uint16_t*>(out);
  if (dtype == DType::kFloat16) {
    for (size_t i = 0; i < n; ++i) h[i] = FloatToHalf(in[i]);
  } else {
    for (size_t i = 0; i < n; ++i) h[i] = FloatToBFloat16(in[i]);
  }
}

}  // namespace shardline::worker::gloo_internal
