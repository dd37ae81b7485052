#include "worker/comm/store.h"

#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"

namespace shardline::worker {
namespace {

// All state under one mutex; waiters use absl::Mutex::AwaitWithTimeout.
class InMemoryStore : public Store {
 public:
  absl::Status Set(const std::string& key, const std::string& value) override {
    absl::MutexLock lock(&mu_);
    map_[key] = value;
    return absl::OkStatus();
  }

  absl::StatusOr<std::string> Get(const std::string& key, absl::Duration timeout) override {
    absl::MutexLock lock(&mu_);
    auto present = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return map_.contains(key); };
    if (!mu_.AwaitWithTimeout(absl::Condition(&present), timeout)) {
      return absl::DeadlineExceededError(
          absl::StrCat("store key '", key, "' was not set within ", absl::FormatDuration(timeout)));
    }
    return map_.at(key);
  }

  absl::StatusOr<int64_t> Add(const std::string& key, int64_t delta) override {
    absl::MutexLock lock(&mu_);
    int64_t value = 0;
    auto it = map_.find(key);
    if (it != map_.end() && !absl::SimpleAtoi(it->second, &value)) {
      return absl::InvalidArgumentError(
          absl::StrCat("store key '", key, "' holds '", it->second, "', not a decimal int64"));
    }
    value += delta;
    map_[key] = absl::StrCat(value);
    return value;
  }

  absl::Status Wait(const std::vector<std::string>& keys, absl::Duration timeout) override {
    absl::MutexLock lock(&mu_);
    auto all = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      for (const auto& k : keys) {
        if (!map_.contains(k)) return false;
      }
      return true;
    };
    if (!mu_.AwaitWithTimeout(absl::Condition(&all), timeout)) {
      for (const auto& k : keys) {
        if (!map_.contains(k)) {
          return absl::DeadlineExceededError(absl::StrCat("store key '", k, "' was not set within ",
                                                          absl::FormatDuration(timeout)));
        }
      }
    }
    return absl::OkStatus();
  }

 private:
  absl::Mutex mu_;
  absl::flat_hash_map<std::string, std::string> map_ ABSL_GUARDED_BY(mu_);
};

class PrefixedStore : public Store {
 public:
  PrefixedStore(std::shared_ptr<Store> base, std::string prefix)
      : base_(std::move(base)), prefix_(std::move(prefix)) {}

  absl::Status Set(const std::string& key, const std::string& value) override {
    return base_->Set(prefix_ + key, value);
  }
  absl::StatusOr<std::string> Get(const std::string& key, absl::Duration timeout) override {
    return base_->Get(prefix_ + key, timeout);
  }
  absl::StatusOr<int64_t> Add(const std::string& key, int64_t delta) override {
    return base_->Add(prefix_ + key, delta);
  }
  absl::Status Wait(const std::vector<std::string>& keys, absl::Duration timeout) override {
    std::vector<std::string> full;
    full.reserve(keys.size());
    for (const auto& k : keys) full.push_back(prefix_ + k);
    return base_->Wait(full, timeout);
  }

 private:
  const std::shared_ptr<Store> base_;
  const std::string prefix_;
};

}  // namespace

std::shared_ptr<Store> NewInMemoryStore() { return std::make_shared<InMemoryStore>(); }

std::shared_ptr<Store> PrefixStore(std::shared_ptr<Store> base, std::string prefix) {
  return std::make_shared<PrefixedStore>(std::move(base), std::move(prefix));
}

}  // namespace shardline::worker
