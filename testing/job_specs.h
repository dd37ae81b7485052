// Job specs for tests: one small GPT job every coordinator, client and
// worker test can start from (instead of a builder per test file).
//
//   v1::JobSpec spec = fixtures::SmallSpec(/*min_workers=*/2, /*max_workers=*/3,
//                                          /*global_batch=*/12);
#ifndef SHARDLINE_TESTING_JOB_SPECS_H_
#define SHARDLINE_TESTING_JOB_SPECS_H_

#include <cstdint>

#include "absl/time/time.h"
#include "shardline/v1/job.pb.h"

namespace shardline::fixtures {

namespace v1 = ::shardline::v1;

// L=2, h=8, 2 heads, V=256, s=4, tp=pp=1; global_batch samples of
// micro-batch 1 from /data/tinyshakespeare.txt (never read by the
// coordinator); heartbeat every 200 ms, timeout `heartbeat_timeout`
// (default 10 s); last call 1 s.
inline v1::JobSpec SmallSpec(int min_workers, int max_workers, int global_batch,
                             absl::Duration heartbeat_timeout = absl::Seconds(10)) {
  v1::JobSpec spec;
  spec.set_name("test");
  v1::ModelConfig* m = spec.mutable_model();
  m->set_num_layers(2);
  m->set_hidden_size(8);
  m->set_num_heads(2);
  m->set_vocab_size(256);
  m->set_seq_length(4);
  spec.mutable_parallel()->set_tp(1);
  spec.mutable_parallel()->set_pp(1);
  spec.mutable_training()->set_global_batch(global_batch);
  spec.mutable_training()->set_micro_batch(1);
  spec.mutable_training()->set_train_steps(100);
  spec.mutable_data()->set_dataset_path("/data/tinyshakespeare.txt");
  v1::ElasticPolicy* e = spec.mutable_elastic();
  e->set_min_workers(min_workers);
  e->set_max_workers(max_workers);
  e->mutable_heartbeat_interval()->set_nanos(200 * 1000 * 1000);
  const int64_t ms = absl::ToInt64Milliseconds(heartbeat_timeout);
  e->mutable_heartbeat_timeout()->set_seconds(ms / 1000);
  e->mutable_heartbeat_timeout()->set_nanos(static_cast<int32_t>(ms % 1000) * 1000000);
  e->mutable_last_call()->set_seconds(1);
  e->mutable_join_timeout()->set_seconds(60);
  return spec;
}

}  // namespace shardline::fixtures

#endif  // SHARDLINE_TESTING_JOB_SPECS_H_
