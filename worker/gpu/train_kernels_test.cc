// Every kernel of the GPU plugin's training math (gpu_ops.h) against its CPU
// twin in worker/train/ops.h: random inputs on the host, both paths, compared
// within fp32 tolerance, including the accumulate (parameter gradients) vs
// overwrite (activation gradients, outputs: pre-filled with NaN) contract and
// the vocab-parallel split. Runs only where a GPU is present; elsewhere every
// test is skipped with the CUDA error as the reason (tagged "external", so a
// skip is never replayed from the cache on a GPU machine).
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "worker/gpu/gpu_ops.h"
#include "worker/gpu/gpu_plugin.h"
#include "worker/train/adamw.h"
#include "worker/train/device.h"
#include "worker/train/ops.h"

namespace shardline::worker {
namespace {

namespace ops = ::shardline::worker::train;

// Runfiles-relative. train_kernels_emu_test runs this file against the CPU
// emulation of the plugin (BUILD, testing/cuda_emu/) instead.
#ifdef SHARDLINE_TRAIN_KERNELS_EMU
constexpr char kPlugin[] = "worker/gpu/testing/libshardline_gpu_emu.so";
#else
constexpr char kPlugin[] = "worker/gpu/libshardline_gpu.so";
#endif
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

// Elementwise kernels: |gpu - cpu| <= kElementwise * max(|cpu|, 1e-2 * max|cpu|)
// (entries far below the tensor's scale are compared at 1e-6 of the scale).
constexpr double kElementwise = 1e-4;
// Products (cuBLAS vs OpenBLAS, different summation orders): relative L2
// error. fp32 gives ~1e-6 here; TF32 tensor cores would show as ~1e-3.
constexpr double kGemmRelL2 = 1e-4;

std::vector<float> Random(int64_t n, uint32_t seed, float lo = -1.0f, float hi = 1.0f) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = dist(gen);
  return v;
}

std::vector<int32_t> RandomTokens(int64_t n, int32_t vocab, uint32_t seed) {
  std::mt19937 gen(seed);
  std::uniform_int_distribution<int32_t> dist(0, vocab - 1);
  std::vector<int32_t> v(n);
  for (int32_t& x : v) x = dist(gen);
  return v;
}

// |gpu - cpu| <= rtol * max(|cpu|, floor * max|cpu|): entries far below the
// tensor's scale are compared against the scale instead.
void ExpectNear(const std::vector<float>& gpu, const std::vector<float>& cpu, double rtol,
                const std::string& what, double floor = 1e-2) {
  ASSERT_EQ(gpu.size(), cpu.size()) << what;
  double scale = 0.0;
  for (float c : cpu) scale = std::max(scale, std::fabs(static_cast<double>(c)));
  int bad = 0;
  for (size_t i = 0; i < cpu.size(); ++i) {
    const double c = cpu[i];
    const double bound = rtol * std::max(std::fabs(c), floor * scale);
    const bool ok = std::isnan(c) ? std::isnan(gpu[i]) : std::fabs(gpu[i] - c) <= bound;
    if (!ok && ++bad <= 5) {
      ADD_FAILURE() << what << "[" << i << "]: gpu " << gpu[i] << " cpu " << c << " (bound "
                    << bound << ")";
    }
  }
  EXPECT_EQ(bad, 0) << what << ": " << bad << " of " << cpu.size() << " elements differ";
}

void ExpectRelL2(const std::vector<float>& gpu, const std::vector<float>& cpu, double tol,
                 const std::string& what) {
  ASSERT_EQ(gpu.size(), cpu.size()) << what;
  double diff = 0.0;
  double norm = 0.0;
  bool finite = true;
  for (size_t i = 0; i < cpu.size(); ++i) {
    finite = finite && std::isfinite(gpu[i]);
    const double d = static_cast<double>(gpu[i]) - cpu[i];
    diff += d * d;
    norm += static_cast<double>(cpu[i]) * cpu[i];
  }
  EXPECT_TRUE(finite) << what << ": the GPU result has NaN/inf (an entry not written?)";
  EXPECT_LE(std::sqrt(diff), tol * std::sqrt(norm))
      << what << ": relative L2 error " << std::sqrt(diff / std::max(norm, 1e-300));
}

class TrainKernelsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto plugin = GpuPlugin::Load(kPlugin);
    ASSERT_TRUE(plugin.ok()) << plugin.status();
    ASSERT_NE(plugin->train_api(), nullptr) << "the real plugin must have the training table";
    auto gpu = GpuOps::Create(*plugin, 0);
    if (absl::IsUnavailable(gpu.status())) {
      GTEST_SKIP() << "no GPU: " << gpu.status().message();
    }
    ASSERT_TRUE(gpu.ok()) << gpu.status();
    gpu_ = std::move(*gpu);
    ops::SetIntraOpThreads(1);
  }

  void TearDown() override {
    for (void* p : allocated_) gpu_->Free(p);
  }

  // Device copy of `host`, freed in TearDown.
  template <typename T>
  T* Up(const std::vector<T>& host) {
    absl::StatusOr<T*> d = gpu_->Alloc<T>(static_cast<int64_t>(host.size()));
    EXPECT_TRUE(d.ok()) << d.status();
    if (!d.ok()) return nullptr;
    allocated_.push_back(*d);
    const absl::Status s = gpu_->CopyToDevice(*d, host.data(), host.size() * sizeof(T));
    EXPECT_TRUE(s.ok()) << s;
    return *d;
  }

  // Device buffer of n NaNs: what an overwriting kernel must not read.
  float* UpNaN(int64_t n) { return Up(std::vector<float>(n, kNaN)); }

  template <typename T>
  std::vector<T> Down(const T* device, int64_t n) {
    std::vector<T> host(n);
    const absl::Status s = gpu_->CopyToHost(host.data(), device, n * sizeof(T));
    EXPECT_TRUE(s.ok()) << s;
    return host;
  }

  std::unique_ptr<GpuOps> gpu_;
  std::vector<void*> allocated_;
};

// host_alloc: page-locked host memory that copies to and from the device
// read and write (the trainer's checkpoint copies).
TEST_F(TrainKernelsTest, PinnedHostMemoryTakesCopiesBothWays) {
  const auto x = Random(1000, 30);
  absl::StatusOr<void*> host = gpu_->HostAllocBytes(x.size() * sizeof(float));
  ASSERT_TRUE(host.ok()) << host.status();
  float* pinned = static_cast<float*>(*host);
  std::copy(x.begin(), x.end(), pinned);
  float* d = UpNaN(static_cast<int64_t>(x.size()));
  ASSERT_TRUE(gpu_->CopyToDevice(d, pinned, x.size() * sizeof(float)).ok());
  std::fill(pinned, pinned + x.size(), 0.0f);
  ASSERT_TRUE(gpu_->CopyToHost(pinned, d, x.size() * sizeof(float)).ok());
  EXPECT_EQ(std::vector<float>(pinned, pinned + x.size()), x);
  gpu_->HostFree(pinned);
  gpu_->HostFree(nullptr);
}

// copy_to_host_async: a copy on the copy stream takes the values of the
// work enqueued before it; work enqueued after order_after_host_copies (a
// write of the copied buffer) does not reach it; the recorded copies can be
// waited for from another thread, more than once. (Under the emulator
// streams are synchronous: this checks the calls and their arguments; on a
// GPU it checks the ordering too.)
TEST_F(TrainKernelsTest, CopiesToHostBesideTheStreamTakeTheValuesBeforeLaterWrites) {
  const auto x = Random(1 << 20, 31);
  const int64_t n = static_cast<int64_t>(x.size());
  absl::StatusOr<void*> host = gpu_->HostAllocBytes(x.size() * sizeof(float));
  ASSERT_TRUE(host.ok()) << host.status();
  float* pinned = static_cast<float*>(*host);
  // A copy recorded before any copy stream exists is done at once.
  absl::StatusOr<std::shared_ptr<GpuHostCopies>> none = gpu_->RecordHostCopies();
  ASSERT_TRUE(none.ok()) << none.status();
  EXPECT_TRUE((*none)->Wait().ok());
  float* d = Up(x);
  ASSERT_TRUE(gpu_->Scale(d, 2.0f, n).ok());  // enqueued before the copy: in it
  ASSERT_TRUE(gpu_->CopyToHostAsync(pinned, d, x.size() * sizeof(float)).ok());
  absl::StatusOr<std::shared_ptr<GpuHostCopies>> copies = gpu_->RecordHostCopies();
  ASSERT_TRUE(copies.ok()) << copies.status();
  ASSERT_TRUE(gpu_->OrderAfterHostCopies().ok());
  ASSERT_TRUE(gpu_->Scale(d, 3.0f, n).ok());  // after: not in it
  absl::Status waited;
  std::thread writer([&] { waited = (*copies)->Wait(); });
  writer.join();
  ASSERT_TRUE(waited.ok()) << waited;
  EXPECT_TRUE((*copies)->Wait().ok());
  std::vector<float> twice(x.size()), six_times(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    twice[i] = x[i] * 2.0f;
    six_times[i] = x[i] * 2.0f * 3.0f;
  }
  EXPECT_EQ(std::vector<float>(pinned, pinned + x.size()), twice);
  EXPECT_EQ(Down(d, n), six_times);
  EXPECT_TRUE(gpu_->CopyToHostAsync(pinned, d, 0).ok());
  gpu_->HostFree(pinned);
}

TEST_F(TrainKernelsTest, GemmAllTransposesOverwriteAndAccumulate) {
  const int64_t m = 37, n = 53, k = 29;  // odd sizes: no tile is full
  for (bool ta : {false, true}) {
    for (bool tb : {false, true}) {
      for (float beta : {0.0f, 0.5f}) {
        const std::string what = "gemm ta=" + std::to_string(ta) + " tb=" + std::to_string(tb) +
                                 " beta=" + std::to_string(beta);
        const auto a = Random(m * k, 1);
        const auto b = Random(k * n, 2);
        // beta == 0 must ignore C entirely, even NaN.
        auto c = beta == 0.0f ? std::vector<float>(m * n, kNaN) : Random(m * n, 3);
        float* da = Up(a);
        float* db = Up(b);
        float* dc = Up(c);
        ASSERT_TRUE(gpu_->Gemm(ta, tb, m, n, k, 0.75f, da, db, beta, dc).ok());
        ops::Gemm(ta, tb, m, n, k, 0.75f, a.data(), b.data(), beta, c.data());
        ExpectRelL2(Down(dc, m * n), c, kGemmRelL2, what);
      }
    }
  }
}

TEST_F(TrainKernelsTest, GemmWithAnEmptyInnerDimensionScalesC) {
  const int64_t m = 5, n = 7;
  for (float beta : {0.0f, 2.0f}) {
    auto c = beta == 0.0f ? std::vector<float>(m * n, kNaN) : Random(m * n, 4);
    float* dc = Up(c);
    const std::vector<float> none(1, 0.0f);
    float* dummy = Up(none);
    ASSERT_TRUE(gpu_->Gemm(false, false, m, n, 0, 1.0f, dummy, dummy, beta, dc).ok());
    ops::Gemm(false, false, m, n, 0, 1.0f, none.data(), none.data(), beta, c.data());
    ExpectNear(Down(dc, m * n), c, 0.0, "k=0 gemm beta=" + std::to_string(beta));
  }
}

TEST_F(TrainKernelsTest, LinearForwardWithAndWithoutBias) {
  const int64_t rows = 24, in = 40, out = 72;
  const auto x = Random(rows * in, 5), w = Random(out * in, 6), b = Random(out, 7);
  float* dx = Up(x);
  float* dw = Up(w);
  float* dbias = Up(b);
  for (bool bias : {true, false}) {
    std::vector<float> y(rows * out);
    float* dy = UpNaN(rows * out);
    ASSERT_TRUE(gpu_->LinearForward(dx, dw, bias ? dbias : nullptr, dy, rows, in, out).ok());
    ops::LinearForward(x.data(), w.data(), bias ? b.data() : nullptr, y.data(), rows, in, out);
    ExpectRelL2(Down(dy, rows * out), y, kGemmRelL2, bias ? "y (bias)" : "y (no bias)");
  }
}

// set_bf16_products: the dense products read their inputs as bf16 (tensor
// cores) with fp32 accumulation, so on inputs that are not bf16-exact they
// give the product of the rounded inputs, not the fp32 one; attention is
// not affected; turning it off gives fp32 again.
TEST_F(TrainKernelsTest, Bf16ProductsReadBf16Inputs) {
  const int64_t rows = 32, in = 64, out = 48;
  const auto x = Random(rows * in, 70), w = Random(out * in, 71);
  auto rx = x, rw = w;
  ops::RoundToBFloat16(rx.data(), rows * in);
  ops::RoundToBFloat16(rw.data(), out * in);
  std::vector<float> fp32(rows * out), bf16(rows * out);
  ops::LinearForward(x.data(), w.data(), nullptr, fp32.data(), rows, in, out);
  ops::LinearForward(rx.data(), rw.data(), nullptr, bf16.data(), rows, in, out);
  float* d_x = Up(x);
  float* d_w = Up(w);
  float* d_y = UpNaN(rows * out);
  ASSERT_TRUE(gpu_->SetBf16Products(true).ok());
  ASSERT_TRUE(gpu_->LinearForward(d_x, d_w, nullptr, d_y, rows, in, out).ok());
  const std::vector<float> got = Down(d_y, rows * out);
  ExpectRelL2(got, bf16, kGemmRelL2, "y with bf16 products");
  double diff = 0, norm = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    diff += (static_cast<double>(got[i]) - fp32[i]) * (static_cast<double>(got[i]) - fp32[i]);
    norm += static_cast<double>(fp32[i]) * fp32[i];
  }
  EXPECT_GT(std::sqrt(diff / norm), 1e-4) << "the product did not read bf16 inputs";
  ASSERT_TRUE(gpu_->SetBf16Products(false).ok());
  ASSERT_TRUE(gpu_->LinearForward(d_x, d_w, nullptr, d_y, rows, in, out).ok());
  ExpectRelL2(Down(d_y, rows * out), fp32, kGemmRelL2, "y with fp32 products again");
}

TEST_F(TrainKernelsTest, LinearBackwardOverwritesDxAndAccumulatesDwDb) {
  const int64_t rows = 24, in = 40, out = 72;
  const auto x = Random(rows * in, 8), w = Random(out * in, 9), g = Random(rows * out, 10);
  for (bool optional : {true, false}) {  // with dx and db, then both null
    auto dw = Random(out * in, 11);  // previous micro-batches' sums
    auto db = Random(out, 12);
    std::vector<float> dx(rows * in);
    float* d_x = Up(x);
    float* d_w = Up(w);
    float* d_g = Up(g);
    float* d_dx = optional ? UpNaN(rows * in) : nullptr;
    float* d_dw = Up(dw);
    float* d_db = optional ? Up(db) : nullptr;
    ASSERT_TRUE(gpu_->LinearBackward(d_x, d_w, d_g, d_dx, d_dw, d_db, rows, in, out).ok());
    ops::LinearBackward(x.data(), w.data(), g.data(), optional ? dx.data() : nullptr, dw.data(),
                        optional ? db.data() : nullptr, rows, in, out);
    ExpectRelL2(Down(d_dw, out * in), dw, kGemmRelL2, "dw");
    if (optional) {
      ExpectRelL2(Down(d_dx, rows * in), dx, kGemmRelL2, "dx");
      ExpectNear(Down(d_db, out), db, kElementwise, "db");
    }
  }
}

TEST_F(TrainKernelsTest, LayerNormForwardAndBackward) {
  // Widths below, at and above the 256-thread block; rows with a large mean.
  for (int64_t width : {50, 256, 769}) {
    const int64_t rows = 13;
    auto x = Random(rows * width, 13, 2.0f, 4.0f);
    const auto gamma = Random(width, 14, 0.5f, 1.5f), beta = Random(width, 15);
    std::vector<float> y(rows * width), mean(rows), rstd(rows);
    float* d_x = Up(x);
    float* d_gamma = Up(gamma);
    float* d_beta = Up(beta);
    float* d_y = UpNaN(rows * width);
    float* d_mean = UpNaN(rows);
    float* d_rstd = UpNaN(rows);
    ASSERT_TRUE(
        gpu_->LayerNormForward(d_x, d_gamma, d_beta, d_y, d_mean, d_rstd, rows, width).ok());
    ops::LayerNormForward(x.data(), gamma.data(), beta.data(), y.data(), mean.data(), rstd.data(),
                          rows, width);
    const std::string w = " width=" + std::to_string(width);
    ExpectNear(Down(d_y, rows * width), y, kElementwise, "y" + w);
    ExpectNear(Down(d_mean, rows), mean, kElementwise, "mean" + w);
    ExpectNear(Down(d_rstd, rows), rstd, kElementwise, "rstd" + w);

    // Backward from the CPU's saved statistics, so only the backward is tested.
    const auto g = Random(rows * width, 16);
    auto dgamma = Random(width, 17), dbeta = Random(width, 18);
    std::vector<float> dx(rows * width);
    float* d_cmean = Up(mean);
    float* d_crstd = Up(rstd);
    float* d_g = Up(g);
    float* d_dx = UpNaN(rows * width);
    float* d_dgamma = Up(dgamma);
    float* d_dbeta = Up(dbeta);
    ASSERT_TRUE(gpu_->LayerNormBackward(d_x, d_gamma, d_cmean, d_crstd, d_g, d_dx, d_dgamma,
                                        d_dbeta, rows, width)
                    .ok());
    ops::LayerNormBackward(x.data(), gamma.data(), mean.data(), rstd.data(), g.data(), dx.data(),
                           dgamma.data(), dbeta.data(), rows, width);
    ExpectNear(Down(d_dx, rows * width), dx, kElementwise, "dx" + w);
    ExpectNear(Down(d_dgamma, width), dgamma, kElementwise, "dgamma" + w);
    ExpectNear(Down(d_dbeta, width), dbeta, kElementwise, "dbeta" + w);
  }
}

TEST_F(TrainKernelsTest, GeluForwardAndBackwardAlsoInPlace) {
  const int64_t n = 10007;
  const auto x = Random(n, 19, -6.0f, 6.0f), g = Random(n, 20);
  std::vector<float> y(n), dx(n);
  ops::GeluForward(x.data(), y.data(), n);
  ops::GeluBackward(x.data(), g.data(), dx.data(), n);
  float* d_x = Up(x);
  float* d_y = UpNaN(n);
  ASSERT_TRUE(gpu_->GeluForward(d_x, d_y, n).ok());
  ExpectNear(Down(d_y, n), y, kElementwise, "gelu y");
  float* d_g = Up(g);
  float* d_dx = UpNaN(n);
  ASSERT_TRUE(gpu_->GeluBackward(d_x, d_g, d_dx, n).ok());
  // gelu' contains v * (1 - tanh^2) * du: where tanh is near +-1, a 1-2 ulp
  // difference between CUDA's and glibc's tanhf is amplified ~6x, so small
  // entries are compared at 1e-5 of the scale.
  constexpr double kGeluGradFloor = 0.1;
  ExpectNear(Down(d_dx, n), dx, kElementwise, "gelu dx", kGeluGradFloor);
  // dx may alias dy; y may alias x (checked last: it overwrites d_x).
  ASSERT_TRUE(gpu_->GeluBackward(d_x, d_g, d_g, n).ok());
  ExpectNear(Down(d_g, n), dx, kElementwise, "gelu dx in place", kGeluGradFloor);
  ASSERT_TRUE(gpu_->GeluForward(d_x, d_x, n).ok());
  ExpectNear(Down(d_x, n), y, kElementwise, "gelu y in place");
}

// The fused bias + GELU against the CPU's, both ways, fp32 and bf16 (then
// every output is bf16-exact and within one bf16 step, 2^-7 relative, of the
// CPU's: a 1-ulp fp32 difference of tanh may round the other way), also in
// place.
TEST_F(TrainKernelsTest, BiasGeluForwardAndBackwardAlsoInPlace) {
  const int64_t rows = 97, width = 103, n = rows * width;
  const auto x = Random(n, 21, -6.0f, 6.0f), b = Random(width, 22, -1.0f, 1.0f),
             g = Random(n, 23);
  for (bool bf16 : {false, true}) {
    SCOPED_TRACE(bf16 ? "bf16" : "fp32");
    std::vector<float> y(n), dx(n);
    ops::BiasGeluForward(x.data(), b.data(), y.data(), rows, width, bf16);
    ops::BiasGeluBackward(x.data(), b.data(), g.data(), dx.data(), rows, width, bf16);
    float* d_x = Up(x);
    float* d_b = Up(b);
    float* d_y = UpNaN(n);
    ASSERT_TRUE(gpu_->BiasGeluForward(d_x, d_b, d_y, rows, width, bf16).ok());
    const double rtol = bf16 ? 1.0 / 128 : kElementwise;
    const std::vector<float> gy = Down(d_y, n);
    ExpectNear(gy, y, rtol, "bias+gelu y");
    float* d_g = Up(g);
    float* d_dx = UpNaN(n);
    ASSERT_TRUE(gpu_->BiasGeluBackward(d_x, d_b, d_g, d_dx, rows, width, bf16).ok());
    const std::vector<float> gdx = Down(d_dx, n);
    ExpectNear(gdx, dx, rtol, "bias+gelu dx", /*floor=*/0.1);
    if (bf16) {
      std::vector<float> ry = gy, rdx = gdx;
      ops::RoundToBFloat16(ry.data(), n);
      ops::RoundToBFloat16(rdx.data(), n);
      EXPECT_EQ(ry, gy) << "y not bf16";
      EXPECT_EQ(rdx, gdx) << "dx not bf16";
    }
    // dx may alias dy; y may alias x (last: it overwrites d_x).
    ASSERT_TRUE(gpu_->BiasGeluBackward(d_x, d_b, d_g, d_g, rows, width, bf16).ok());
    EXPECT_EQ(Down(d_g, n), gdx);
    ASSERT_TRUE(gpu_->BiasGeluForward(d_x, d_b, d_x, rows, width, bf16).ok());
    EXPECT_EQ(Down(d_x, n), gy);
  }
}

struct AttentionShape {
  int64_t batch, seq, heads, head_dim;
};

// bf16 (ops.h's bf16 attention): bf16 inputs, probabilities and score
// gradients rounded to bf16, every product on bf16 operands. A 1-ulp
// difference in an fp32 probability can round to the neighbouring bf16
// value, so bf16 compares elements within one bf16 ulp (2^-7 relative) and
// the products within kBf16RelL2.
TEST_F(TrainKernelsTest, AttentionForwardAndBackward) {
  constexpr double kBf16Ulp = 1.0 / 128;
  constexpr double kBf16RelL2 = 1e-3;
  for (const bool bf16 : {false, true}) {
    // seq 33: rows longer than a warp; seq 300: longer than the 256-thread
    // block (fp32 only: the emulator takes 15 s for it, and bf16 changes
    // nothing in how a row is split over the block).
    for (const AttentionShape& s : {AttentionShape{2, 33, 3, 16}, AttentionShape{1, 300, 2, 8},
                                    AttentionShape{3, 1, 2, 4}}) {
      if (bf16 && s.seq > 256) continue;
      const std::string what = std::string(bf16 ? " bf16" : " fp32") +
                               " b=" + std::to_string(s.batch) + " s=" + std::to_string(s.seq) +
                               " h=" + std::to_string(s.heads) + " d=" + std::to_string(s.head_dim);
      const double elementwise = bf16 ? kBf16Ulp : kElementwise;
      const double rel_l2 = bf16 ? kBf16RelL2 : kGemmRelL2;
      const int64_t qkv_n = s.batch * s.seq * s.heads * 3 * s.head_dim;
      const int64_t y_n = s.batch * s.seq * s.heads * s.head_dim;
      const int64_t p_n = s.batch * s.heads * s.seq * s.seq;
      auto qkv = Random(qkv_n, 21, -2.0f, 2.0f);
      if (bf16) ops::RoundToBFloat16(qkv.data(), qkv_n);
      std::vector<float> probs(p_n), y(y_n);
      ops::AttentionForward(qkv.data(), probs.data(), y.data(), s.batch, s.seq, s.heads,
                            s.head_dim, bf16);
      float* d_qkv = Up(qkv);
      float* d_probs = UpNaN(p_n);
      float* d_y = UpNaN(y_n);
      ASSERT_TRUE(
          gpu_->AttentionForward(d_qkv, d_probs, d_y, s.batch, s.seq, s.heads, s.head_dim, bf16)
              .ok());
      const auto got_probs = Down(d_probs, p_n);
      ExpectNear(got_probs, probs, elementwise, "probs" + what);
      ExpectRelL2(Down(d_y, y_n), y, rel_l2, "y" + what);
      if (bf16) {
        // Rounded as written: every probability is a bf16 value.
        int64_t not_bf16 = 0;
        for (float v : got_probs) {
          uint32_t bits;
          std::memcpy(&bits, &v, 4);
          not_bf16 += (bits & 0xffffu) != 0;
        }
        EXPECT_EQ(not_bf16, 0) << "probs" << what;
      }

      auto g = Random(y_n, 22);
      if (bf16) ops::RoundToBFloat16(g.data(), y_n);
      std::vector<float> dqkv(qkv_n);
      ops::AttentionBackward(qkv.data(), probs.data(), g.data(), dqkv.data(), s.batch, s.seq,
                             s.heads, s.head_dim, bf16);
      float* d_cprobs = Up(probs);  // the CPU's, so only the backward is tested
      float* d_g = Up(g);
      float* d_dqkv = UpNaN(qkv_n);
      ASSERT_TRUE(gpu_->AttentionBackward(d_qkv, d_cprobs, d_g, d_dqkv, s.batch, s.seq, s.heads,
                                          s.head_dim, bf16)
                      .ok());
      const auto got = Down(d_dqkv, qkv_n);
      ExpectRelL2(got, dqkv, rel_l2, "dqkv" + what);
      // Per slice too, so a wrong q/k/v offset cannot hide in the total.
      for (int part = 0; part < 3; ++part) {
        std::vector<float> g_part, c_part;
        for (int64_t i = 0; i < qkv_n; ++i) {
          if ((i / s.head_dim) % 3 == part) {
            g_part.push_back(got[i]);
            c_part.push_back(dqkv[i]);
          }
        }
        if (s.seq > 1 || part == 2) {  // with seq 1, dq = dk = 0 exactly
          ExpectRelL2(g_part, c_part, rel_l2, "dqkv part " + std::to_string(part) + what);
        } else {
          ExpectNear(g_part, c_part, elementwise, "dqkv part " + std::to_string(part) + what);
        }
      }
    }
  }
}

TEST_F(TrainKernelsTest, VocabParallelEmbeddingForwardAndBackward) {
  const int64_t rows = 40, width = 24, vocab = 50;
  const auto tokens = RandomTokens(rows, vocab, 23);  // repeats: the scatter must add them
  const auto table = Random(vocab * width, 24);
  const auto g = Random(rows * width, 25);
  int32_t* d_tokens = Up(tokens);
  float* d_g = Up(g);
  for (int64_t begin : {int64_t{0}, int64_t{25}}) {  // tp = 2: two halves of the vocabulary
    const int64_t local = 25;
    const std::vector<float> shard(table.begin() + begin * width,
                                   table.begin() + (begin + local) * width);
    std::vector<float> y(rows * width);
    ops::EmbeddingForward(tokens.data(), shard.data(), y.data(), rows, width, begin, local);
    float* d_shard = Up(shard);
    float* d_y = UpNaN(rows * width);
    ASSERT_TRUE(gpu_->EmbeddingForward(d_tokens, d_shard, d_y, rows, width, begin, local).ok());
    ExpectNear(Down(d_y, rows * width), y, 0.0, "embedding y begin=" + std::to_string(begin));

    auto dtable = Random(local * width, 26);  // accumulates
    float* d_dtable = Up(dtable);
    ops::EmbeddingBackward(tokens.data(), g.data(), dtable.data(), rows, width, begin, local);
    ASSERT_TRUE(
        gpu_->EmbeddingBackward(d_tokens, d_g, d_dtable, rows, width, begin, local).ok());
    ExpectNear(Down(d_dtable, local * width), dtable, kElementwise,
               "embedding dtable begin=" + std::to_string(begin));
  }
}

TEST_F(TrainKernelsTest, PositionAddForwardAndBackward) {
  const int64_t seq = 17, width = 40;
  for (int64_t rows : {3 * seq, int64_t{5}}) {  // full batches; fewer rows than seq
    const auto pos = Random(seq * width, 27), y0 = Random(rows * width, 28);
    auto y = y0;
    ops::AddPositionForward(pos.data(), y.data(), rows, seq, width);
    float* d_pos = Up(pos);
    float* d_y = Up(y0);
    ASSERT_TRUE(gpu_->AddPositionForward(d_pos, d_y, rows, seq, width).ok());
    ExpectNear(Down(d_y, rows * width), y, kElementwise, "pos y rows=" + std::to_string(rows));

    const auto g = Random(rows * width, 29);
    auto dpos = Random(seq * width, 30);  // accumulates; rows >= min(rows, seq) untouched
    float* d_g = Up(g);
    float* d_dpos = Up(dpos);
    ops::AddPositionBackward(g.data(), dpos.data(), rows, seq, width);
    ASSERT_TRUE(gpu_->AddPositionBackward(d_g, d_dpos, rows, seq, width).ok());
    ExpectNear(Down(d_dpos, seq * width), dpos, kElementwise,
               "dpos rows=" + std::to_string(rows));
  }
}

TEST_F(TrainKernelsTest, VocabParallelCrossEntropyPieces) {
  // tp = 2 over a vocabulary of 2 * 300 (rows longer than the block).
  const int64_t rows = 9, local = 300, vocab = 2 * local;
  const auto full = Random(rows * vocab, 31, -5.0f, 5.0f);
  auto targets = RandomTokens(rows, static_cast<int32_t>(vocab), 32);
  targets[0] = 7;  // row 0: a dominant target in rank 0 (softmax ~ 1)
  targets[1] = static_cast<int32_t>(local + 3);  // row 1: in rank 1
  int32_t* d_targets = Up(targets);
  std::vector<float> cpu_max(rows, -INFINITY), cpu_sum(rows, 0.0f), cpu_target(rows, 0.0f);
  std::vector<std::vector<float>> shards;
  for (int64_t r = 0; r < 2; ++r) {
    std::vector<float> shard(rows * local);
    for (int64_t t = 0; t < rows; ++t) {
      for (int64_t j = 0; j < local; ++j) shard[t * local + j] = full[t * vocab + r * local + j];
    }
    if (r == 0) shard[0 * local + 7] = 40.0f;
    shards.push_back(shard);
  }
  // Step 1 per rank, then the all-reduce MAX on the host.
  std::vector<float> row_max(rows, -INFINITY);
  for (int64_t r = 0; r < 2; ++r) {
    std::vector<float> m(rows);
    ops::LocalRowMax(shards[r].data(), m.data(), rows, local);
    float* d_l = Up(shards[r]);
    float* d_m = UpNaN(rows);
    ASSERT_TRUE(gpu_->LocalRowMax(d_l, d_m, rows, local).ok());
    ExpectNear(Down(d_m, rows), m, 0.0, "row_max rank " + std::to_string(r));
    for (int64_t t = 0; t < rows; ++t) row_max[t] = std::max(row_max[t], m[t]);
  }
  // Step 2 per rank with the global max, then the all-reduce SUM.
  std::vector<float> sum_exp(rows, 0.0f), target_logit(rows, 0.0f);
  float* d_row_max = Up(row_max);
  for (int64_t r = 0; r < 2; ++r) {
    std::vector<float> s(rows), tl(rows);
    ops::LocalSumExpAndTarget(shards[r].data(), row_max.data(), targets.data(), s.data(),
                              tl.data(), rows, r * local, local);
    float* d_l = Up(shards[r]);
    float* d_s = UpNaN(rows);
    float* d_tl = UpNaN(rows);
    ASSERT_TRUE(gpu_->LocalSumExpAndTarget(d_l, d_row_max, d_targets, d_s, d_tl, rows, r * local,
                                           local)
                    .ok());
    ExpectNear(Down(d_s, rows), s, kElementwise, "sum_exp rank " + std::to_string(r));
    ExpectNear(Down(d_tl, rows), tl, 0.0, "target_logit rank " + std::to_string(r));
    for (int64_t t = 0; t < rows; ++t) {
      sum_exp[t] += s[t];
      target_logit[t] += tl[t];
    }
  }
  // Step 3.
  std::vector<float> loss(rows);
  ops::TokenLoss(row_max.data(), sum_exp.data(), target_logit.data(), loss.data(), rows);
  float* d_sum = Up(sum_exp);
  float* d_tl = Up(target_logit);
  float* d_loss = UpNaN(rows);
  ASSERT_TRUE(gpu_->TokenLoss(d_row_max, d_sum, d_tl, d_loss, rows).ok());
  ExpectNear(Down(d_loss, rows), loss, kElementwise, "loss");
  // Backward per rank (overwrites dlogits).
  const float scale = 1.0f / rows;
  for (int64_t r = 0; r < 2; ++r) {
    std::vector<float> dl(rows * local);
    ops::CrossEntropyBackward(shards[r].data(), row_max.data(), sum_exp.data(), targets.data(),
                              scale, dl.data(), rows, r * local, local);
    float* d_l = Up(shards[r]);
    float* d_dl = UpNaN(rows * local);
    ASSERT_TRUE(gpu_->CrossEntropyBackward(d_l, d_row_max, d_sum, d_targets, scale, d_dl, rows,
                                           r * local, local)
                    .ok());
    ExpectNear(Down(d_dl, rows * local), dl, kElementwise, "dlogits rank " + std::to_string(r));
  }
}

TEST_F(TrainKernelsTest, AddInPlace) {
  const int64_t n = 1000;
  const auto x = Random(n, 33);
  auto y = Random(n, 34);
  float* d_x = Up(x);
  float* d_y = Up(y);
  ops::AddInPlace(x.data(), y.data(), n);
  ASSERT_TRUE(gpu_->AddInPlace(d_x, d_y, n).ok());
  ExpectNear(Down(d_y, n), y, kElementwise, "add");
}

// The optimizer's state kernels against adamw.h / the CPU loops. n spans
// several blocks, and the masked sum more blocks than the plugin's cap of
// partial sums (so blocks take several grid-stride elements each).
TEST_F(TrainKernelsTest, AdamWStepWithAndWithoutDecayMask) {
  const int64_t n = 3000;
  ops::AdamWConfig config;
  config.weight_decay = 0.1;
  std::vector<uint8_t> mask(n);
  for (int64_t i = 0; i < n; ++i) mask[i] = (i % 3) != 0;
  for (const bool masked : {true, false}) {
    auto p = Random(n, 40), m = Random(n, 41, -0.1f, 0.1f), v = Random(n, 42, 0.0f, 0.01f);
    const auto g = Random(n, 43);
    float* d_p = Up(p);
    float* d_m = Up(m);
    float* d_v = Up(v);
    float* d_g = Up(g);
    const uint8_t* d_mask = masked ? Up(mask) : nullptr;
    const ops::AdamWScalars k = ops::AdamWScalarsFor(config, 3e-3f, 7);
    const ShardlineAdamWScalars scalars{k.step_size, k.inv_sqrt_bc2, k.b1, k.b2,
                                        k.one_minus_b1, k.one_minus_b2, k.eps, k.decay};
    ops::AdamWStep(config, 3e-3f, 7, p.data(), g.data(), m.data(), v.data(),
                   masked ? mask.data() : nullptr, n);
    ASSERT_TRUE(gpu_->AdamWStep(scalars, d_p, d_g, d_m, d_v, d_mask, n).ok());
    const std::string what = masked ? "adamw (masked) " : "adamw ";
    ExpectNear(Down(d_p, n), p, kElementwise, what + "param");
    ExpectNear(Down(d_m, n), m, kElementwise, what + "exp_avg");
    ExpectNear(Down(d_v, n), v, kElementwise, what + "exp_avg_sq");
  }
}

TEST_F(TrainKernelsTest, ScaleCopyAndMaskedSumOfSquares) {
  const int64_t n = 300000;  // > 1024 blocks of 256 threads
  auto x = Random(n, 50);
  std::vector<uint8_t> mask(n);
  for (int64_t i = 0; i < n; ++i) mask[i] = (i % 7) != 0;
  float* d_x = Up(x);
  const uint8_t* d_mask = Up(mask);
  ASSERT_TRUE(gpu_->Scale(d_x, 0.25f, n).ok());
  for (float& v : x) v *= 0.25f;
  ExpectNear(Down(d_x, n), x, kElementwise, "scale");
  float* d_copy = UpNaN(n);
  ASSERT_TRUE(gpu_->Copy(d_copy, d_x, n * sizeof(float)).ok());
  ExpectNear(Down(d_copy, n), x, 0.0, "copy");
  double cpu = 1.5, gpu = 1.5;  // both add to what is there
  for (int64_t i = 0; i < n; ++i) {
    if (mask[i]) cpu += static_cast<double>(x[i]) * x[i];
  }
  ASSERT_TRUE(gpu_->AccumulateMaskedSumOfSquares(d_x, d_mask, n, &gpu).ok());
  EXPECT_NEAR(gpu, cpu, 1e-12 * cpu);
  double empty = 2.0;
  ASSERT_TRUE(gpu_->AccumulateMaskedSumOfSquares(d_x, d_mask, 0, &empty).ok());
  EXPECT_EQ(empty, 2.0);
}

// The gradient norm over several units with one read-back: bit for bit
// what one call per piece gives (the same blocks added in the same order),
// an empty piece included, and one host wait instead of one per piece.
TEST_F(TrainKernelsTest, MaskedSumsOfSquaresOfManyPiecesEqualOneCallEachWithOneWait) {
  const std::vector<int64_t> sizes = {300000, 0, 1000, 5};
  std::vector<const float*> xs;
  std::vector<const uint8_t*> masks;
  for (size_t p = 0; p < sizes.size(); ++p) {
    auto x = Random(std::max<int64_t>(sizes[p], 1), 70 + static_cast<int>(p));
    std::vector<uint8_t> mask(x.size());
    for (size_t i = 0; i < mask.size(); ++i) mask[i] = (i % 5) != 1;
    xs.push_back(Up(x));
    masks.push_back(Up(mask));
  }
  double one_each = 0.5;
  for (size_t p = 0; p < sizes.size(); ++p) {
    ASSERT_TRUE(gpu_->AccumulateMaskedSumOfSquares(xs[p], masks[p], sizes[p], &one_each).ok());
  }
  double many = 0.5;
  const int64_t waits = gpu_->host_waits();
  ASSERT_TRUE(gpu_->AccumulateMaskedSumsOfSquares(static_cast<int64_t>(sizes.size()), xs.data(),
                                                  masks.data(), sizes.data(), &many)
                  .ok());
  EXPECT_EQ(gpu_->host_waits() - waits, 1);
  EXPECT_GT(many, 1.0);
  EXPECT_EQ(many, one_each);
  double none = 3.0;
  ASSERT_TRUE(gpu_->AccumulateMaskedSumsOfSquares(0, nullptr, nullptr, nullptr, &none).ok());
  EXPECT_EQ(none, 3.0);
}

// Bit for bit the CPU's rounding (float16.h), ties, NaN and infinities too.
TEST_F(TrainKernelsTest, RoundToBFloat16MatchesTheCpuBitForBit) {
  std::vector<float> x = Random(5000, 60, -100.0f, 100.0f);
  const uint32_t specials[] = {0x3f808000u /* a tie, even below */, 0x3f818000u /* tie, up */,
                               0x7f800000u /* inf */, 0xff800000u, 0x7fc00001u /* NaN */,
                               0x7f7fffffu /* rounds to inf */, 0x00000001u /* denormal */};
  for (uint32_t bits : specials) {
    float f;
    std::memcpy(&f, &bits, 4);
    x.push_back(f);
  }
  float* d_x = Up(x);
  ASSERT_TRUE(gpu_->RoundToBFloat16(d_x, static_cast<int64_t>(x.size())).ok());
  ops::RoundToBFloat16(x.data(), static_cast<int64_t>(x.size()));
  const std::vector<float> got = Down(d_x, static_cast<int64_t>(x.size()));
  int bad = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    if (std::memcmp(&got[i], &x[i], 4) != 0 && ++bad <= 5)
      ADD_FAILURE() << "[" << i << "]: gpu " << got[i] << " cpu " << x[i];
  }
  EXPECT_EQ(bad, 0);
}

TEST_F(TrainKernelsTest, NegativeSizesAreInvalidArgument) {
  const absl::Status s = gpu_->GeluForward(nullptr, nullptr, -1);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_TRUE(gpu_->Synchronize().ok());
}

// On a machine without a GPU: the reason names CUDA's call.
TEST(TrainKernelsNoGpuTest, CreateWithoutAGpuIsUnavailableNamingCuda) {
  const auto plugin = GpuPlugin::Load(kPlugin);
  ASSERT_TRUE(plugin.ok()) << plugin.status();
  if (plugin->Probe().ok()) GTEST_SKIP() << "this machine has a GPU; this checks the no-GPU path";
  const auto gpu = GpuOps::Create(*plugin, 0);
  EXPECT_EQ(gpu.status().code(), absl::StatusCode::kUnavailable) << gpu.status();
  EXPECT_NE(std::string(gpu.status().message()).find("cudaGetDeviceCount"), std::string::npos)
      << gpu.status();
}

}  // namespace
}  // namespace shardline::worker
