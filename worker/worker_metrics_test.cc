#include "worker/worker_metrics.h"

#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "metrics/metrics.h"
#include "testing/process_harness.h"

namespace shardline::worker {
namespace {

using ::testing::HasSubstr;

TEST(WorkerMetricsTest, RendersStepsCheckpointsAndPlace) {
  WorkerMetrics m("shake\"speare", "node0:cpu");
  m.SetPlace(3, 1);
  train::StepStats s;
  s.step = 9;  // the tenth step
  s.loss = 2.5;
  s.tokens = 1000;
  s.time = absl::Milliseconds(250);
  s.comm_time = absl::Milliseconds(50);
  m.ObserveStep(s);
  m.ObserveStep(s);
  m.ObserveCheckpoint(absl::Milliseconds(500));
  m.ObserveRestore();
  const std::string text = m.Render();
  const std::string labels = "{job=\"shake\\\"speare\",worker_id=\"node0:cpu\"}";
  EXPECT_THAT(text, HasSubstr("shardline_worker_generation" + labels + " 3\n"));
  EXPECT_THAT(text, HasSubstr("shardline_worker_rank" + labels + " 1\n"));
  EXPECT_THAT(text, HasSubstr("shardline_worker_step" + labels + " 10\n"));
  EXPECT_THAT(text, HasSubstr("shardline_worker_loss" + labels + " 2.5\n"));
  EXPECT_THAT(text, HasSubstr("shardline_worker_tokens_per_second" + labels + " 4000\n"));
  EXPECT_THAT(text, HasSubstr("shardline_worker_step_seconds_total" + labels + " 0.5\n"));
  EXPECT_THAT(text, HasSubstr("shardline_worker_comm_seconds_total" + labels + " 0.10000000000000001\n"));
  EXPECT_THAT(text, HasSubstr("shardline_worker_steps_total" + labels + " 2\n"));
  EXPECT_THAT(text, HasSubstr("shardline_worker_checkpoint_seconds_total" + labels + " 0.5\n"));
  EXPECT_THAT(text, HasSubstr("shardline_worker_restores_total" + labels + " 1\n"));
  // No communicator was ever aborted in this process.
  EXPECT_THAT(text, HasSubstr("shardline_worker_gloo_stalled_op_threads" + labels + " 0\n"));
  EXPECT_THAT(text, HasSubstr("# TYPE shardline_worker_steps_total counter\n"));
}

// The HTTP server serves any renderer (the worker's series).
TEST(WorkerMetricsTest, ServedOverHttp) {
  WorkerMetrics m("j", "w");
  m.SetPlace(1, 0);
  auto server = metrics::MetricsHttpServer::Start("127.0.0.1", 0, [&m] { return m.Render(); });
  ASSERT_TRUE(server.ok()) << server.status();
  const std::string response = HttpGet((*server)->port(), "/metrics");
  EXPECT_THAT(response, HasSubstr("200 OK"));
  EXPECT_THAT(response, HasSubstr("shardline_worker_generation{job=\"j\",worker_id=\"w\"} 1\n"));
}

}  // namespace
}  // namespace shardline::worker
