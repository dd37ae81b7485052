#include "client/shardctl/job_format.h"

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "google/protobuf/util/json_util.h"
#include "google/protobuf/util/message_differencer.h"
#include "nlohmann/json.hpp"
#include "spec/job_spec.h"

namespace shardline::shardctl {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::Not;

google::protobuf::Timestamp At(int64_t seconds, int32_t nanos = 0) {
  google::protobuf::Timestamp t;
  t.set_seconds(seconds);
  t.set_nanos(nanos);
  return t;
}

// 2024-05-01T10:00:00Z.
constexpr int64_t kMay1 = 1714557600;

v1::Job DemoJob() {
  v1::Job job;
  job.set_job_id("shakespeare");
  v1::JobSpec* s = job.mutable_spec();
  s->set_name("shakespeare");
  s->mutable_model()->set_num_layers(4);
  s->mutable_model()->set_hidden_size(128);
  s->mutable_model()->set_num_heads(4);
  s->mutable_model()->set_vocab_size(256);
  s->mutable_model()->set_seq_length(64);
  s->mutable_parallel()->set_tp(1);
  s->mutable_parallel()->set_pp(2);
  s->mutable_parallel()->set_zero_stage(2);
  s->mutable_training()->set_global_batch(24);
  s->mutable_training()->set_micro_batch(3);
  s->mutable_training()->set_train_steps(2000);
  s->mutable_training()->set_learning_rate(0.001);
  s->mutable_data()->set_dataset_path("data/tinyshakespeare.txt");
  s->mutable_checkpoint()->set_directory("/tmp/shardline-ckpt");
  s->mutable_checkpoint()->set_interval_steps(100);
  s->mutable_checkpoint()->set_keep_last(3);
  s->mutable_elastic()->set_min_workers(4);
  s->mutable_elastic()->set_max_workers(5);
  s->mutable_elastic()->mutable_heartbeat_interval()->set_seconds(1);
  s->mutable_elastic()->mutable_heartbeat_timeout()->set_seconds(10);
  job.set_phase(v1::JOB_PHASE_PENDING);
  job.set_generation(1);
  *job.mutable_create_time() = At(kMay1);
  *job.mutable_update_time() = At(kMay1 + 5);
  return job;
}

TEST(JobFormatTest, PendingJob) {
  EXPECT_EQ(FormatJob(DemoJob()),
            "Job:              shakespeare\n"
            "Name:             shakespeare\n"
            "Phase:            PENDING\n"
            "Generation:       1\n"
            "World:            not formed yet (needs 4 workers)\n"
            "Step:             0 / 2000\n"
            "Last checkpoint:  none\n"
            "Model:            GPT 4 layers, hidden 128, 4 heads, ffn 512, vocab 256, seq 64\n"
            "Parallel:         tp 1, pp 2, vpp 1, ZeRO stage 2, schedule default\n"
            "Training:         global batch 24, micro-batch 3, 2000 steps, lr 0.001, fp32\n"
            "Data:             data/tinyshakespeare.txt\n"
            "Checkpoints:      every 100 steps into /tmp/shardline-ckpt, keep last 3\n"
            "Elastic:          4..5 workers, heartbeat 1s, timeout 10s\n"
            "Hang detection:   progress_timeout auto (max(30s, 10x median step)), evict\n"
            "Straggler check:  1.5x the median compute (and 5ms more) over 10 steps, report\n"
            "Created:          2024-05-01T10:00:00Z\n"
            "Updated:          2024-05-01T10:00:05Z\n");
}

// The hang and straggler settings (job.proto ElasticPolicy) as set, and
// with their defaults (spec/job_spec.h) when unset.
TEST(JobFormatTest, HangAndStragglerSettings) {
  v1::Job job = DemoJob();
  v1::ElasticPolicy* e = job.mutable_spec()->mutable_elastic();
  e->mutable_progress_timeout()->set_seconds(5);
  e->set_hang_policy(v1::HANG_POLICY_REPORT);
  e->set_straggler_factor(2.25);
  e->set_straggler_window_steps(20);
  e->set_straggler_policy(v1::STRAGGLER_POLICY_REPLACE);
  e->mutable_straggler_min_excess()->set_nanos(20000000);
  EXPECT_THAT(FormatJob(job),
              HasSubstr("Elastic:          4..5 workers, heartbeat 1s, timeout 10s\n"
                        "Hang detection:   progress_timeout 5s, report\n"
                        "Straggler check:  2.25x the median compute (and 20ms more) over 20 "
                        "steps, replace by a spare\n"
                        "Created:"));
  e->mutable_progress_timeout()->set_seconds(0);
  e->mutable_progress_timeout()->set_nanos(250000000);
  e->set_hang_policy(v1::HANG_POLICY_EVICT);
  e->set_straggler_policy(v1::STRAGGLER_POLICY_REPORT);
  e->mutable_straggler_min_excess()->set_nanos(0);  // 0s: the factor alone
  EXPECT_THAT(FormatJob(job), AllOf(HasSubstr("Hang detection:   progress_timeout 250ms, evict\n"),
                                    HasSubstr("Straggler check:  2.25x the median compute over 20 "
                                              "steps, report\n")));
  // 0s turns hang detection off.
  e->mutable_progress_timeout()->set_nanos(0);
  EXPECT_THAT(FormatJob(job), HasSubstr("Hang detection:   off (progress_timeout 0s)\n"));
  // An external job is never judged (no progress reports): no such lines.
  job.mutable_spec()->mutable_external()->set_framework("torchrun");
  EXPECT_THAT(FormatJob(job),
              AllOf(Not(HasSubstr("Hang detection")), Not(HasSubstr("Straggler check"))));
}

TEST(JobFormatTest, RunningJobWithCheckpointAndReason) {
  v1::Job job = DemoJob();
  job.set_phase(v1::JOB_PHASE_RECOVERING);
  job.set_phase_reason("rank 2 lost: heartbeat timeout");
  job.set_generation(3);
  job.set_world_size(4);
  job.set_dp(2);
  job.set_num_spares(1);
  job.set_step(120);
  job.mutable_last_checkpoint()->set_checkpoint_id("step-100");
  job.mutable_last_checkpoint()->set_step(100);
  const std::string out = FormatJob(job);
  EXPECT_THAT(out, AllOf(HasSubstr("Phase:            RECOVERING (rank 2 lost: heartbeat timeout)\n"),
                         HasSubstr("World:            4 = tp 1 x pp 2 x dp 2; 1 spare\n"),
                         HasSubstr("Step:             120 / 2000\n"),
                         HasSubstr("Last checkpoint:  step-100 (step 100)\n")));
}

// An external job (job.proto ExternalWorkload): its kind and framework, its
// nodes, no model, plan or train_steps.
TEST(JobFormatTest, ExternalJob) {
  v1::Job job;
  job.set_job_id("ddp");
  job.mutable_spec()->set_name("torchrun-external");
  job.mutable_spec()->mutable_external()->set_framework("torchrun");
  v1::ElasticPolicy* e = job.mutable_spec()->mutable_elastic();
  e->set_min_workers(2);
  e->set_max_workers(4);
  e->mutable_heartbeat_interval()->set_seconds(1);
  e->mutable_heartbeat_timeout()->set_seconds(5);
  e->mutable_last_call()->set_seconds(2);
  job.set_phase(v1::JOB_PHASE_RUNNING);
  job.set_phase_reason("generation 2 formed: world 3, 0 spares");
  job.set_generation(2);
  job.set_world_size(3);
  job.set_step(42);
  job.mutable_create_time()->set_seconds(1714557600);
  job.mutable_update_time()->set_seconds(1714557605);
  EXPECT_EQ(FormatJob(job),
            "Job:          ddp\n"
            "Name:         torchrun-external\n"
            "Kind:         external workload (framework torchrun): no plan; ranks are the "
            "workload's\n"
            "Phase:        RUNNING (generation 2 formed: world 3, 0 spares)\n"
            "Generation:   2\n"
            "World:        3 ranks; 0 spares\n"
            "Step:         42 (as the workload reports it)\n"
            "Checkpoints:  none (no directory)\n"
            "Elastic:      2..4 nodes, heartbeat 1s, timeout 5s, last call 2s\n"
            "Created:      2024-05-01T10:00:00Z\n"
            "Updated:      2024-05-01T10:00:05Z\n");
  // Before it forms: nodes joined against min_workers; no cap shows "any".
  job.set_phase(v1::JOB_PHASE_PENDING);
  job.set_world_size(0);
  e->set_max_workers(1u << 18);
  v1::ListMembersResponse members;
  v1::Member* m = members.add_members();
  m->set_worker_id("node0");
  m->set_state(v1::MEMBER_STATE_JOINING);
  m->set_generation(2);
  const std::string out = FormatJob(job, &members);
  EXPECT_THAT(out, HasSubstr("not formed yet; waiting for workers: 1 joined, needs at least 2 "
                             "(min_workers)"));
  EXPECT_THAT(out, HasSubstr("Elastic:      2..any nodes"));
  EXPECT_THAT(out, ::testing::Not(HasSubstr("Model")));
  // The list shows its step without a train_steps.
  google::protobuf::RepeatedPtrField<v1::Job> jobs;
  *jobs.Add() = job;
  EXPECT_THAT(FormatJobList(jobs), ::testing::ContainsRegex("PENDING +2 +- +42 "));
}

// Before the first generation: who has joined, and the last call once
// enough have (4 workers form pp 2 x dp 2; max_workers 5; last call 10 s).
TEST(JobFormatTest, NotFormedSaysHowFormationStands) {
  v1::Job job = DemoJob();
  job.mutable_spec()->mutable_elastic()->mutable_last_call()->set_seconds(10);
  absl::StatusOr<v1::JobSpec> resolved = spec::ResolveJobSpec(job.spec());
  ASSERT_TRUE(resolved.ok()) << resolved.status();
  *job.mutable_spec() = *resolved;
  job.set_phase_reason("waiting for workers");
  v1::ListMembersResponse members;
  members.set_generation(1);
  auto add = [&](const std::string& id, v1::MemberState state, int64_t joined_at) {
    v1::Member* m = members.add_members();
    m->set_worker_id(id);
    m->set_state(state);
    m->set_generation(1);
    *m->mutable_join_time() = At(kMay1 + joined_at);
  };
  // Joined out of order; a worker that left does not count.
  add("w2", v1::MEMBER_STATE_JOINING, 3);
  add("w0", v1::MEMBER_STATE_JOINING, 1);
  add("gone", v1::MEMBER_STATE_LEFT, 0);
  add("w1", v1::MEMBER_STATE_JOINING, 2);
  EXPECT_THAT(FormatJob(job, &members),
              AllOf(HasSubstr("Phase:            PENDING (waiting for workers)\n"),
                    HasSubstr("World:            not formed yet; waiting for workers: 3 joined, "
                              "needs at least 4 (min_workers)\n")));
  // The fourth worker (joined at +7 s) makes the job formable: the last call
  // runs 10 s from then; a fifth does not move it.
  add("w3", v1::MEMBER_STATE_JOINING, 7);
  const std::string last_call =
      "World:            not formed yet; waiting for workers: 4 of 5 joined (max_workers), last "
      "call until 2024-05-01T10:00:17Z, then it forms with those joined\n";
  EXPECT_THAT(FormatJob(job, &members), HasSubstr(last_call));
  // Without the members (ListMembers failed) the old line.
  EXPECT_THAT(FormatJob(job), HasSubstr("World:            not formed yet (needs 4 workers)\n"));

  job.set_phase(v1::JOB_PHASE_CANCELLED);
  job.set_phase_reason("cancelled: wrong data");
  EXPECT_THAT(FormatJob(job, &members),
              AllOf(HasSubstr("Phase:            CANCELLED (cancelled: wrong data)\n"),
                    HasSubstr("World:            none: cancelled before it formed\n")));
  job.set_phase(v1::JOB_PHASE_FAILED);
  EXPECT_THAT(FormatJob(job), HasSubstr("World:            none: failed before it formed\n"));
}

TEST(JobFormatTest, CreatedJobShowsTheTokenOnceLabelled) {
  v1::CreateJobResponse r;
  *r.mutable_job() = DemoJob();
  r.set_worker_token("wt-secret");
  const std::string out = FormatCreatedJob(r);
  EXPECT_THAT(out, HasSubstr("Worker token (shown only now; give it to this job's workers as "
                             "SHARDLINE_TOKEN):\n  wt-secret\n"));
  EXPECT_EQ(out.find("wt-secret"), out.rfind("wt-secret"));
  r.clear_worker_token();
  EXPECT_THAT(FormatCreatedJob(r), HasSubstr("Worker token: none (the coordinator runs without "
                                             "authentication)"));
}

TEST(JobFormatTest, CreatedJobThatAlreadyExistedSaysSo) {
  v1::CreateJobResponse r;
  *r.mutable_job() = DemoJob();
  r.set_worker_token("wt-secret");
  const std::string out = FormatCreatedJob(r, /*already_existed=*/true);
  EXPECT_EQ(out.rfind("Job shakespeare already existed with this spec; nothing was created (job "
                      "create is idempotent). It is:\n\nJob:              shakespeare\n",
                      0),
            0u)
      << out;
  EXPECT_THAT(out, HasSubstr("Worker token (the one issued when the job was created; give it to "
                             "this job's workers as SHARDLINE_TOKEN):\n  wt-secret\n"));
  EXPECT_THAT(out, Not(HasSubstr("shown only now")));
  // Today's coordinator returns no token for a job that existed.
  r.clear_worker_token();
  EXPECT_THAT(FormatCreatedJob(r, /*already_existed=*/true),
              HasSubstr("Worker token: not shown (the token was shown only at creation"));
}

// Free text from the coordinator cannot send terminal escapes or fake
// output lines, whatever an older coordinator stored.
TEST(JobFormatTest, ServerTextIsPrintedEscaped) {
  EXPECT_EQ(Printable("plain text, caf\xc3\xa9"), "plain text, caf\xc3\xa9");
  EXPECT_EQ(Printable("x\x1b[2J\nPhase: COMPLETED"), "x\\x1b[2J\\nPhase: COMPLETED");
  EXPECT_EQ(Printable("tab\there\x7f"), "tab\\there\\x7f");
  EXPECT_EQ(Printable("csi \xc2\x9b" "2J"), "csi \\u009b2J");  // C1 CSI
  EXPECT_EQ(Printable("bad \xff byte"), "bad \\xff byte");
  EXPECT_EQ(Printable(std::string(10, 'n'), 4), "nnnn...");
  EXPECT_EQ(Printable("ab\xc3\xa9", 3), "ab...");  // not cut inside a character
  EXPECT_EQ(Printable("\xe2\x80\xae" "evil"), "\\u202eevil");  // a bidi override

  v1::Job job = DemoJob();
  job.mutable_spec()->set_name("x\x1b[2J\nPhase: COMPLETED");
  job.set_phase(v1::JOB_PHASE_CANCELLED);
  job.set_phase_reason("cancelled: a\x1b[2Jb\nPhase: fake");
  const std::string out = FormatJob(job);
  EXPECT_THAT(out, HasSubstr("Name:             x\\x1b[2J\\nPhase: COMPLETED\n"));
  EXPECT_THAT(out,
              HasSubstr("Phase:            CANCELLED (cancelled: a\\x1b[2Jb\\nPhase: fake)\n"));
  EXPECT_EQ(out.find('\x1b'), std::string::npos);
  EXPECT_EQ(out.find("\nPhase: fake"), std::string::npos);

  google::protobuf::RepeatedPtrField<v1::Job> jobs;
  v1::Job huge = DemoJob();
  huge.mutable_spec()->set_name(std::string(2000000, 'n'));
  *jobs.Add() = huge;
  *jobs.Add() = DemoJob();
  const std::string list = FormatJobList(jobs);
  EXPECT_LT(list.size(), 1000u);
  EXPECT_THAT(list, HasSubstr(std::string(128, 'n') + "...  PENDING"));

  v1::JobEvent e;
  e.set_sequence(3);
  e.mutable_worker_left()->set_worker_id("w\x1b[1m");
  e.mutable_worker_left()->set_reason("bye\r\nfake");
  EXPECT_THAT(FormatEvent(e), HasSubstr("worker_left w\\x1b[1m incarnation 0: bye\\x0d\\nfake"));
}

TEST(JobFormatTest, JobList) {
  google::protobuf::RepeatedPtrField<v1::Job> jobs;
  v1::Job a = DemoJob();
  a.set_phase(v1::JOB_PHASE_RUNNING);
  a.set_generation(2);
  a.set_world_size(4);
  a.set_step(120);
  *jobs.Add() = a;
  v1::Job b = DemoJob();
  b.set_job_id("tiny");
  b.mutable_spec()->set_name("t");
  *jobs.Add() = b;
  EXPECT_EQ(FormatJobList(jobs),
            "JOB          NAME         PHASE    GEN  WORLD      STEP  CREATED\n"
            "shakespeare  shakespeare  RUNNING    2      4  120/2000  2024-05-01T10:00:00Z\n"
            "tiny         t            PENDING    1      -    0/2000  2024-05-01T10:00:00Z\n");
  EXPECT_EQ(FormatJobList({}), "no jobs\n");
}

TEST(JobFormatTest, Members) {
  v1::ListMembersResponse r;
  r.set_generation(2);
  EXPECT_EQ(FormatMembers("j", r), "no workers have joined job j (generation 2)\n");
  v1::Member* m = r.add_members();
  m->set_worker_id("node0:cuda:0");
  m->set_incarnation(77);
  m->set_host("node0");
  m->set_device("cuda:0");
  m->set_state(v1::MEMBER_STATE_ACTIVE);
  m->set_rank(0);
  m->set_generation(2);
  m->set_step(120);
  m->set_worker_state(v1::WORKER_STATE_TRAINING);
  *m->mutable_last_heartbeat_time() = At(kMay1);
  v1::Member* lost = r.add_members();
  lost->set_worker_id("node1:cuda:0");
  lost->set_incarnation(78);
  lost->set_state(v1::MEMBER_STATE_LOST);
  lost->set_generation(1);
  lost->set_loss_reason(v1::LOSS_REASON_HEARTBEAT_TIMEOUT);
  lost->set_detail("no heartbeat for 10s");
  EXPECT_EQ(FormatMembers("j", r),
            "Job j, generation 2\n"
            "WORKER        INCARNATION  STATE   RANK  GEN  STEP  WORKER STATE  ACTIVITY  "
            "COLLECTIVE  STRAGGLER  HOST   DEVICE  LAST HEARTBEAT        DETAIL\n"
            "node0:cuda:0  77           ACTIVE     0    2   120  TRAINING      -         "
            "-           -          node0  cuda:0  2024-05-01T10:00:00Z\n"
            "node1:cuda:0  78           LOST       -    1     0  -             -         "
            "-           -          -      -       -                     "
            "heartbeat_timeout: no heartbeat for 10s\n");
}

// WORKER STATE is the last heartbeat's report only while the member is
// still in the world (JOINING, ACTIVE, SPARE); a drained (LEFT), LOST or
// FENCED member shows "-", as RANK does.
TEST(JobFormatTest, MembersActivityOnlyForCurrentMembers) {
  v1::ListMembersResponse r;
  r.set_generation(3);
  auto add = [&](const std::string& id, v1::MemberState state, v1::WorkerState activity) {
    v1::Member* m = r.add_members();
    m->set_worker_id(id);
    m->set_incarnation(1);
    m->set_state(state);
    m->set_generation(3);
    m->set_step(40);
    m->set_worker_state(activity);
    return m;
  };
  add("w0", v1::MEMBER_STATE_ACTIVE, v1::WORKER_STATE_TRAINING)->set_rank(0);
  add("w1", v1::MEMBER_STATE_SPARE, v1::WORKER_STATE_WAITING);
  add("w2", v1::MEMBER_STATE_LEFT, v1::WORKER_STATE_TRAINING)->set_detail("drained: upgrade");
  add("w3", v1::MEMBER_STATE_LOST, v1::WORKER_STATE_CHECKPOINTING)
      ->set_loss_reason(v1::LOSS_REASON_STREAM_BROKEN);
  add("w4", v1::MEMBER_STATE_FENCED, v1::WORKER_STATE_TRAINING);
  add("w5", v1::MEMBER_STATE_JOINING, v1::WORKER_STATE_UNSPECIFIED);
  EXPECT_EQ(FormatMembers("j", r),
            "Job j, generation 3\n"
            "WORKER  INCARNATION  STATE    RANK  GEN  STEP  WORKER STATE  ACTIVITY  COLLECTIVE  "
            "STRAGGLER  HOST  DEVICE  LAST HEARTBEAT  DETAIL\n"
            "w0      1            ACTIVE      0    3    40  TRAINING      -         -           "
            "-          -     -       -\n"
            "w1      1            SPARE       -    3    40  WAITING       -         -           "
            "-          -     -       -\n"
            "w2      1            LEFT        -    3    40  -             -         -           "
            "-          -     -       -               drained: upgrade\n"
            "w3      1            LOST        -    3    40  -             -         -           "
            "-          -     -       -               stream_broken\n"
            "w4      1            FENCED      -    3    40  -             -         -           "
            "-          -     -       -\n"
            "w5      1            JOINING     -    3    40  -             -         -           "
            "-          -     -       -\n");
}

google::protobuf::Duration Millis(int64_t ms) {
  google::protobuf::Duration d;
  d.set_seconds(ms / 1000);
  d.set_nanos(static_cast<int32_t>(ms % 1000) * 1000000);
  return d;
}

v1::CollectiveProgress Op(const std::string& group, const std::string& operation,
                          uint64_t sequence, bool in_flight, int64_t elapsed_ms) {
  v1::CollectiveProgress c;
  c.set_group(group);
  c.set_operation(operation);
  c.set_sequence(sequence);
  c.set_count(4096);
  c.set_dtype("float32");
  c.set_in_flight(in_flight);
  *c.mutable_elapsed() = Millis(elapsed_ms);
  return c;
}

// ACTIVITY, COLLECTIVE and STRAGGLER come from the member's progress report
// and straggler flag: the in-flight collective that has waited longest,
// else the completed one with the highest sequence; a send / recv names its
// peer; "-" without a report, and for members no longer in the world.
TEST(JobFormatTest, MembersShowProgressAndStragglers) {
  v1::ListMembersResponse r;
  r.set_generation(4);
  auto add = [&](const std::string& id, uint32_t rank) {
    v1::Member* m = r.add_members();
    m->set_worker_id(id);
    m->set_incarnation(1);
    m->set_state(v1::MEMBER_STATE_ACTIVE);
    m->set_rank(rank);
    m->set_generation(4);
    m->set_step(15);
    m->set_worker_state(v1::WORKER_STATE_TRAINING);
    return m;
  };
  // Waiting in dp/0's all_reduce #66 for 3.1 s (and in tp/0's for less).
  v1::RankProgress* p = add("w0", 0)->mutable_progress();
  p->set_activity(v1::ACTIVITY_COLLECTIVE);
  *p->add_collectives() = Op("tp/0", "all_reduce", 130, true, 40);
  *p->add_collectives() = Op("dp/0", "all_reduce", 66, true, 3100);
  // Computing, slow: its latest completed collective is tp/1's #131, shown
  // as the last one ("last all_reduce #131 tp/1"), not as one it is in.
  v1::Member* slow = add("w1", 1);
  p = slow->mutable_progress();
  p->set_activity(v1::ACTIVITY_COMPUTE);
  *p->add_collectives() = Op("dp/1", "all_reduce", 65, false, 12);
  *p->add_collectives() = Op("tp/1", "all_reduce", 131, false, 2);
  slow->mutable_straggler()->set_rank(1);
  slow->mutable_straggler()->set_worker_id("w1");
  slow->mutable_straggler()->set_ratio(1.93);
  // A pipeline stage waiting for its activations from rank 0.
  p = add("w2", 2)->mutable_progress();
  p->set_activity(v1::ACTIVITY_COLLECTIVE);
  v1::CollectiveProgress recv = Op("pp/0", "recv", 3, true, 250);
  recv.set_peer_rank(0);
  *p->add_collectives() = recv;
  // Saving; no collective yet in this generation.
  add("w3", 3)->mutable_progress()->set_activity(v1::ACTIVITY_CHECKPOINT);
  // No report yet.
  add("w4", 4);
  // Lost: its last report is not shown.
  v1::Member* lost = add("w5", 5);
  lost->set_state(v1::MEMBER_STATE_LOST);
  lost->clear_rank();
  lost->mutable_progress()->set_activity(v1::ACTIVITY_COMPUTE);
  *lost->mutable_straggler() = slow->straggler();
  EXPECT_EQ(FormatMembers("j", r),
            "Job j, generation 4\n"
            "WORKER  INCARNATION  STATE   RANK  GEN  STEP  WORKER STATE  ACTIVITY    "
            "COLLECTIVE                                STRAGGLER  HOST  DEVICE  LAST HEARTBEAT  "
            "DETAIL\n"
            "w0      1            ACTIVE     0    4    15  TRAINING      collective  "
            "all_reduce #66 dp/0 (waiting 3.1s)        -          -     -       -\n"
            "w1      1            ACTIVE     1    4    15  TRAINING      compute     "
            "last all_reduce #131 tp/1                 1.9x       -     -       -\n"
            "w2      1            ACTIVE     2    4    15  TRAINING      collective  "
            "recv #3 pp/0 from rank 0 (waiting 250ms)  -          -     -       -\n"
            "w3      1            ACTIVE     3    4    15  TRAINING      checkpoint  "
            "-                                         -          -     -       -\n"
            "w4      1            ACTIVE     4    4    15  TRAINING      -           "
            "-                                         -          -     -       -\n"
            "w5      1            LOST       -    4    15  -             -           "
            "-                                         -          -     -       -\n");
}

// `job get` with the coordinator's last hang report and its stragglers.
TEST(JobFormatTest, JobWithLastHangAndStragglers) {
  v1::Job job = DemoJob();
  job.set_phase(v1::JOB_PHASE_RUNNING);
  job.set_generation(4);
  job.set_world_size(4);
  job.set_dp(2);
  job.set_step(57);
  EXPECT_THAT(FormatJob(job), AllOf(Not(HasSubstr("Last hang")), Not(HasSubstr("Stragglers"))));

  v1::HangReport* h = job.mutable_last_hang();
  h->set_generation(3);
  h->set_group("dp/0");
  h->set_operation("all_reduce");
  h->set_sequence(47);
  h->set_num_waiting(3);
  h->set_num_culprits(1);
  h->set_action(v1::HANG_POLICY_EVICT);
  *h->mutable_time() = At(kMay1 + 60);
  h->set_summary(
      "rank 2 (w2 on node1) is in compute at step 15 while 3 ranks wait in all_reduce #47 of "
      "dp/0 for 31.2 s");
  for (uint32_t rank : {3, 1}) {
    v1::Straggler* s = job.add_stragglers();
    s->set_rank(rank);
    s->set_worker_id(absl::StrCat("w", rank));
    s->set_host("node1");
    *s->mutable_compute_time() = Millis(rank == 3 ? 38 : 32);
    *s->mutable_median_compute_time() = Millis(20);
    s->set_ratio(rank == 3 ? 1.9 : 1.6);
    s->set_since_step(rank == 3 ? 40 : 52);
    s->set_replacing(rank == 3);
  }
  job.set_num_stragglers(3);
  const std::string out = FormatJob(job);
  EXPECT_THAT(out,
              HasSubstr("Last checkpoint:  none\n"
                        "Last hang:        rank 2 (w2 on node1) is in compute at step 15 while 3 "
                        "ranks wait in all_reduce #47 of dp/0 for 31.2 s\n"
                        "                  generation 3, 2024-05-01T10:01:00Z: the culprits were "
                        "evicted (hang_policy EVICT) and the job re-forms without them\n"
                        "Stragglers:       rank 3 (w3 on node1): compute 38ms per step, 1.90x the "
                        "median 20ms, since step 40; being replaced by a spare\n"
                        "                  rank 1 (w1 on node1): compute 32ms per step, 1.60x the "
                        "median 20ms, since step 52\n"
                        "                  and 1 more\n"
                        "Model:"));

  // A report-only hang without a summary says what its fields say.
  h->clear_summary();
  h->set_action(v1::HANG_POLICY_REPORT);
  EXPECT_THAT(FormatJob(job),
              HasSubstr("Last hang:        1 rank held the others up; 3 waiting in all_reduce #47 "
                        "of dp/0\n"
                        "                  generation 3, 2024-05-01T10:01:00Z: reported only "
                        "(hang_policy REPORT)\n"));
}

// A response as the coordinator gives it for a job of tp 1, pp 1, dp 2
// (w0, w1) with spare s0 and checkpoint ckpt-100 at step 100, job step 120.
v1::WhatIfResponse WhatIfLosingW1(bool with_spare) {
  v1::WhatIfResponse r;
  r.set_generation(3);
  r.set_world_size(2);
  r.set_dp(2);
  v1::WhatIfLoss* l = r.add_losses();
  l->set_worker_id("w1");
  l->set_state(v1::MEMBER_STATE_ACTIVE);
  l->set_rank(1);
  l->mutable_coordinates()->set_dp_rank(1);
  l->set_num_zero_shards(2);
  l->set_zero_shard_elements(16384);
  r.set_generation_ends(true);
  if (with_spare) {
    r.add_spares_used("s0");
    r.set_spares_cover(true);
    r.set_new_world_size(2);
    r.set_new_dp(2);
    r.set_new_gradient_accumulation_steps(2);
    r.add_new_worker_ids("w0");
    r.add_new_worker_ids("s0");
  } else {
    r.set_new_world_size(1);
    r.set_new_dp(1);
    r.set_new_gradient_accumulation_steps(4);
    r.add_new_worker_ids("w0");
  }
  r.mutable_restore()->set_checkpoint_id("ckpt-100");
  r.mutable_restore()->set_step(100);
  r.set_steps_retrained(20);
  r.set_summary(with_spare ? "Losing rank 1 (w1): spare s0 takes it; world 2, dp 2 unchanged"
                           : "Losing rank 1 (w1): dp shrinks 2 -> 1");
  return r;
}

TEST(JobFormatTest, WhatIfASpareCovers) {
  EXPECT_EQ(FormatWhatIf(WhatIfLosingW1(/*with_spare=*/true)),
            "Generation 3 now: world 2, dp 2\n"
            "LOSE  STATE   RANK  TP  DP  PP  ZERO SHARDS  ZERO ELEMENTS\n"
            "w1    ACTIVE     1   0   1   0            2          16384\n"
            "\n"
            "Generation:         ends: generation 3 stops and the job re-forms\n"
            "Spares:             s0: they take every lost rank\n"
            "New world:          2, dp 2, gradient accumulation 2 (world and dp unchanged)\n"
            "New ranks:          0 w0, 1 s0\n"
            "Below min workers:  no\n"
            "Restore:            ckpt-100 (step 100); 20 steps trained again\n"
            "Summary:            Losing rank 1 (w1): spare s0 takes it; world 2, dp 2 unchanged\n");
}

TEST(JobFormatTest, WhatIfDpShrinks) {
  v1::WhatIfResponse r = WhatIfLosingW1(/*with_spare=*/false);
  EXPECT_EQ(FormatWhatIf(r),
            "Generation 3 now: world 2, dp 2\n"
            "LOSE  STATE   RANK  TP  DP  PP  ZERO SHARDS  ZERO ELEMENTS\n"
            "w1    ACTIVE     1   0   1   0            2          16384\n"
            "\n"
            "Generation:         ends: generation 3 stops and the job re-forms\n"
            "Spares:             none to take the lost ranks\n"
            "New world:          1, dp 1, gradient accumulation 4 (from world 2, dp 2)\n"
            "New ranks:          0 w0\n"
            "Below min workers:  no\n"
            "Restore:            ckpt-100 (step 100); 20 steps trained again\n"
            "Summary:            Losing rank 1 (w1): dp shrinks 2 -> 1\n");

  // Losing every rank, before any checkpoint: nothing can form; from the seed.
  r.add_losses()->set_worker_id("w0");
  r.mutable_losses(1)->set_state(v1::MEMBER_STATE_ACTIVE);
  r.mutable_losses(1)->set_rank(0);
  r.set_new_world_size(0);
  r.set_new_dp(0);
  r.set_new_gradient_accumulation_steps(0);
  r.clear_new_worker_ids();
  r.set_below_min_workers(true);
  r.clear_restore();
  r.set_steps_retrained(120);
  r.clear_summary();
  EXPECT_THAT(FormatWhatIf(r),
              AllOf(HasSubstr("w0    ACTIVE     0   0   0   0            0              0\n"),
                    HasSubstr("New world:          none: the live workers left cannot form a "
                              "generation\n"),
                    Not(HasSubstr("New ranks")),
                    HasSubstr("Below min workers:  yes: fewer live workers than the job needs; "
                              "it would wait in RECOVERING and fail after join_timeout unless "
                              "workers join\n"),
                    HasSubstr("Restore:            from the seed (step 0); 120 steps trained "
                              "again\n"),
                    Not(HasSubstr("Summary"))));
}

// Losing only a spare (and a worker already lost) ends nothing; the
// Generation line says which losses are spares and which are not live.
TEST(JobFormatTest, WhatIfOfSparesOnlyChangesNothing) {
  v1::WhatIfResponse r;
  r.set_generation(3);
  r.set_world_size(2);
  r.set_dp(2);
  r.add_losses()->set_worker_id("s0");
  r.mutable_losses(0)->set_state(v1::MEMBER_STATE_SPARE);
  r.add_losses()->set_worker_id("old");
  r.mutable_losses(1)->set_state(v1::MEMBER_STATE_LOST);
  EXPECT_EQ(FormatWhatIf(r),
            "Generation 3 now: world 2, dp 2\n"
            "LOSE  STATE  RANK  TP  DP  PP  ZERO SHARDS  ZERO ELEMENTS\n"
            "s0    SPARE     -   -   -   -            0              0\n"
            "old   LOST      -   -   -   -            0              0\n"
            "\n"
            "Generation:         goes on: no rank is among the losses, nothing re-forms; old "
            "(LOST) is not live: losing it changes nothing; the others are spares or joining "
            "workers\n"
            "Spares:             none needed\n"
            "New world:          unchanged: world 2, dp 2\n"
            "Below min workers:  no\n"
            "Restore:            nothing (the generation goes on)\n");

  // Only spares (and joining workers): says so.
  v1::WhatIfResponse spares = r;
  spares.mutable_losses(1)->set_state(v1::MEMBER_STATE_JOINING);
  EXPECT_THAT(FormatWhatIf(spares),
              HasSubstr("Generation:         goes on: no rank is among the losses (only spares "
                        "or joining workers), nothing re-forms\n"));

  // Only workers that are not live or hold no rank: no spare is mentioned.
  v1::WhatIfResponse gone = r;
  gone.mutable_losses(0)->set_worker_id("w9");
  gone.mutable_losses(0)->set_state(v1::MEMBER_STATE_LEFT);
  gone.add_losses()->set_worker_id("f1");
  gone.mutable_losses(2)->set_state(v1::MEMBER_STATE_FENCED);
  EXPECT_THAT(FormatWhatIf(gone),
              HasSubstr("Generation:         goes on: no rank is among the losses, nothing "
                        "re-forms; w9 (LEFT) and old (LOST) are not live: losing them changes "
                        "nothing; f1 (FENCED) holds no rank: losing it changes nothing\n"));
}

// `whatif --json` is the response: parsed back it is the same message.
TEST(JobFormatTest, WhatIfJsonRoundTrips) {
  const v1::WhatIfResponse r = WhatIfLosingW1(/*with_spare=*/true);
  const std::string json = ProtoToJson(r);
  const nlohmann::json j = nlohmann::json::parse(json);
  EXPECT_EQ(j["spares_used"], nlohmann::json::array({"s0"}));
  EXPECT_EQ(j["new_worker_ids"], nlohmann::json::array({"w0", "s0"}));
  EXPECT_EQ(j["losses"][0]["state"], "MEMBER_STATE_ACTIVE");
  EXPECT_EQ(j["losses"][0]["zero_shard_elements"], "16384");
  EXPECT_EQ(j["restore"]["checkpoint_id"], "ckpt-100");
  EXPECT_EQ(j["below_min_workers"], false);  // zeros are printed
  v1::WhatIfResponse back;
  ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(json, &back).ok());
  EXPECT_TRUE(google::protobuf::util::MessageDifferencer::Equals(back, r))
      << back.DebugString();
}

TEST(JobFormatTest, Topology) {
  v1::Plan p;
  p.set_job_id("j");
  p.set_generation(2);
  p.set_world_size(4);
  p.set_dp(2);
  p.set_num_parameters(834304);
  p.set_micro_batch(3);
  p.set_gradient_accumulation_steps(4);
  p.mutable_parallel()->set_tp(1);
  p.mutable_parallel()->set_pp(2);
  p.mutable_parallel()->set_vpp(1);
  p.mutable_parallel()->set_zero_stage(2);
  p.mutable_parallel()->set_schedule(v1::SCHEDULE_ONE_F_ONE_B);
  p.mutable_schedule()->set_bubble_ratio(0.25);
  for (uint32_t r = 0; r < 2; ++r) {
    v1::PipelineChunk* c = p.add_stages()->add_chunks();
    p.mutable_stages(r)->set_pp_rank(r);
    c->set_chunk(r);
    c->set_pp_rank(r);
    c->set_first_layer(2 * r);
    c->set_last_layer(2 * r + 1);
    c->set_holds_embedding(r == 0);
    c->set_holds_head(r == 1);
  }
  auto group = [&](const char* name, v1::GroupKind kind, uint32_t index, std::vector<uint32_t> ranks) {
    v1::ProcessGroup* g = p.add_groups();
    g->set_name(name);
    g->set_kind(kind);
    g->set_index(index);
    for (uint32_t r : ranks) g->add_ranks(r);
  };
  group("dp/0", v1::GROUP_KIND_DP, 0, {0, 1});
  group("pp/0", v1::GROUP_KIND_PP, 1, {0, 2});
  group("emb/0", v1::GROUP_KIND_EMBEDDING, 2, {0, 2});
  EXPECT_EQ(FormatTopology(p),
            "Job j, generation 2: world 4 = tp 1 x pp 2 x dp 2; vpp 1, ZeRO stage 2, 1f1b\n"
            "834304 parameters; 4 micro-batches of 3 per dp rank per step; bubble ratio 0.2500\n"
            "\n"
            "Pipeline stages\n"
            "PP RANK  CHUNK  LAYERS  HOLDS\n"
            "      0      0  0-1     embedding\n"
            "      1      1  2-3     head\n"
            "\n"
            "Process groups (creation order)\n"
            "#  GROUP  KIND       RANKS\n"
            "0  dp/0   dp         0,1\n"
            "1  pp/0   pp         0,2\n"
            "2  emb/0  embedding  0,2\n");
}

TEST(JobFormatTest, ShardOwner) {
  v1::GetShardOwnerResponse r;
  r.set_parameter("layers.2.mlp.fc1.weight");
  r.add_global_shape(512);
  r.add_global_shape(128);
  r.set_numel(65536);
  r.set_zero_stage(2);
  r.set_generation(1);
  v1::ShardHolder* h = r.add_holders();
  h->set_kind(v1::HOLDER_KIND_OPTIMIZER_STATE);
  h->set_rank(3);
  h->set_pp_rank(1);
  h->set_dp_rank(1);
  h->set_unit("layers.2");
  h->mutable_unit_range()->set_begin(1000);
  h->mutable_unit_range()->set_end(1001);
  v1::DimSlice* d = h->mutable_slice()->add_dims();
  d->set_length(512);
  d = h->mutable_slice()->add_dims();
  d->set_length(128);
  h->mutable_slice_range()->set_begin(1000);
  h->mutable_slice_range()->set_end(1001);
  EXPECT_EQ(FormatShardOwner(r),
            "layers.2.mlp.fc1.weight: shape [512, 128], 65536 elements; ZeRO stage 2, "
            "generation 1\n"
            "KIND             RANK  TP  DP  PP  UNIT      UNIT RANGE   SLICE           "
            "SLICE RANGE\n"
            "optimizer_state     3   0   1   1  layers.2  [1000,1001)  [0:512, 0:128]  "
            "[1000,1001)\n");
}

TEST(JobFormatTest, Checkpoints) {
  google::protobuf::RepeatedPtrField<v1::CheckpointSummary> list;
  EXPECT_EQ(FormatCheckpoints("j", list), "no checkpoints of job j\n");
  v1::CheckpointSummary* c = list.Add();
  c->set_checkpoint_id("step-200");
  c->set_step(200);
  c->set_generation(2);
  c->set_state(v1::CHECKPOINT_STATE_COMMITTED);
  c->set_world_size(4);
  c->set_reported_ranks(4);
  c->set_total_bytes(3 << 20);
  *c->mutable_commit_time() = At(kMay1);
  c = list.Add();
  c->set_checkpoint_id("step-100");
  c->set_step(100);
  c->set_generation(1);
  c->set_state(v1::CHECKPOINT_STATE_ABORTED);
  c->set_world_size(4);
  c->set_reported_ranks(3);
  c->set_total_bytes(812);
  c->set_abort_reason("generation 1 ended");
  EXPECT_EQ(FormatCheckpoints("j", list),
            "CHECKPOINT  STEP  GEN  STATE      RANKS      SIZE  COMMITTED             NOTE\n"
            "step-200     200    2  COMMITTED    4/4  3.00 MiB  2024-05-01T10:00:00Z\n"
            "step-100     100    1  ABORTED      3/4     812 B  -                     "
            "generation 1 ended\n");
}

TEST(JobFormatTest, ManifestSummaryAndTensors) {
  v1::Manifest m;
  m.set_checkpoint_id("ckpt-step000000000200-gen2");
  m.set_job_id("j");
  m.set_step(200);
  m.set_generation(2);
  m.set_state(v1::CHECKPOINT_STATE_COMMITTED);
  m.set_directory("/ckpt/ckpt-step000000000200-gen2");
  m.mutable_model()->set_num_layers(4);
  m.mutable_model()->set_hidden_size(128);
  m.mutable_model()->set_num_heads(4);
  m.mutable_model()->set_vocab_size(256);
  m.mutable_model()->set_seq_length(64);
  m.mutable_parallel()->set_tp(2);
  m.mutable_parallel()->set_pp(1);
  m.mutable_parallel()->set_zero_stage(1);
  m.set_dp(2);
  m.set_world_size(4);
  m.set_seed(7);
  m.set_data_cursor(6400);
  for (uint32_t r = 0; r < 4; ++r) {
    v1::RankRecord* rank = m.add_ranks();
    rank->set_rank(r);
    rank->add_files()->set_size_bytes(1 << 20);
  }
  v1::SavedTensor* t = m.add_tensors();
  t->set_name("embedding.weight");
  t->set_dtype(v1::DTYPE_FLOAT32);
  t->add_global_shape(256);
  t->add_global_shape(128);
  for (int i = 0; i < 2; ++i) t->add_pieces()->set_byte_length(64 << 10);
  *m.mutable_create_time() = At(kMay1);
  *m.mutable_commit_time() = At(kMay1);
  const std::string summary =
      "Checkpoint:   ckpt-step000000000200-gen2\n"
      "Job:          j\n"
      "State:        COMMITTED\n"
      "Step:         200\n"
      "Generation:   2\n"
      "Directory:    /ckpt/ckpt-step000000000200-gen2\n"
      "Layout:       world 4 = tp 2 x pp 1 x dp 2; vpp 1, ZeRO stage 1, schedule default\n"
      "Model:        GPT 4 layers, hidden 128, 4 heads, vocab 256, seq 64\n"
      "Data cursor:  sample 6400 (seed 7)\n"
      "Ranks:        4 of 4, 4 files, 4.00 MiB (4194304 bytes)\n"
      "Tensors:      1 (2 pieces)\n"
      "Created:      2024-05-01T10:00:00Z\n"
      "Committed:    2024-05-01T10:00:00Z\n";
  EXPECT_EQ(FormatManifest(m, /*tensors=*/false), summary);
  EXPECT_EQ(FormatManifest(m, /*tensors=*/true),
            summary +
                "\n"
                "TENSOR            DTYPE    SHAPE       PIECES        SIZE\n"
                "embedding.weight  FLOAT32  [256, 128]       2  128.00 KiB\n");
  m.set_state(v1::CHECKPOINT_STATE_ABORTED);
  m.set_abort_reason("generation 2 ended");
  m.clear_tensors();
  EXPECT_THAT(FormatManifest(m, true),
              AllOf(HasSubstr("State:        ABORTED (generation 2 ended)\n"),
                    HasSubstr("\nno tensors\n")));
}

TEST(JobFormatTest, EventsOneLineEach) {
  v1::JobEvent e;
  e.set_sequence(12);
  e.set_generation(2);
  *e.mutable_time() = At(kMay1, 123000000);
  e.mutable_phase_changed()->set_old_phase(v1::JOB_PHASE_PENDING);
  e.mutable_phase_changed()->set_new_phase(v1::JOB_PHASE_RUNNING);
  EXPECT_EQ(FormatEvent(e), "#12 2024-05-01T10:00:00.123Z g2 phase_changed PENDING -> RUNNING");

  v1::GenerationFormed* g = e.mutable_generation_formed();
  g->set_generation(2);
  g->set_reason(v1::FORMATION_REASON_WORKER_LOST);
  g->set_world_size(4);
  g->set_dp(2);
  for (const char* w : {"w0", "w1", "w2", "w4"}) g->add_worker_ids(w);
  g->mutable_restore()->set_checkpoint_id("step-100");
  g->mutable_restore()->set_step(100);
  EXPECT_EQ(FormatEvent(e),
            "#12 2024-05-01T10:00:00.123Z g2 generation_formed worker_lost: world 4 (dp 2), ranks "
            "w0 w1 w2 w4, restore step-100 (step 100)");

  v1::WorkerLost* lost = e.mutable_worker_lost();
  lost->set_worker_id("w3");
  lost->set_incarnation(9);
  lost->set_rank(3);
  lost->set_reason(v1::LOSS_REASON_STREAM_BROKEN);
  EXPECT_THAT(FormatEvent(e), HasSubstr("g2 worker_lost w3 incarnation 9 rank 3 (stream_broken)"));

  e.mutable_step_progress()->set_step(120);
  e.mutable_step_progress()->set_loss(2.5);
  EXPECT_THAT(FormatEvent(e), HasSubstr("g2 step 120 loss 2.5000"));

  e.mutable_checkpoint_committed()->set_checkpoint_id("step-100");
  e.mutable_checkpoint_committed()->set_step(100);
  e.mutable_checkpoint_committed()->set_total_bytes(2048);
  EXPECT_THAT(FormatEvent(e), HasSubstr("checkpoint_committed step-100 step 100, 2.00 KiB"));
  for (const std::string& line : {FormatEvent(e)}) EXPECT_EQ(line.find('\n'), std::string::npos);

  v1::HangReport* hang = e.mutable_hang_detected();
  hang->set_summary("rank 2 (w2 on node1) is in compute at step 15 while 3 ranks wait in "
                    "all_reduce #47 of dp/0 for 31.2 s");
  hang->set_action(v1::HANG_POLICY_REPORT);
  EXPECT_EQ(FormatEvent(e),
            "#12 2024-05-01T10:00:00.123Z g2 hang_detected rank 2 (w2 on node1) is in compute at "
            "step 15 while 3 ranks wait in all_reduce #47 of dp/0 for 31.2 s; reported only "
            "(hang_policy REPORT)");

  v1::Straggler* s = e.mutable_straggler_changed()->mutable_straggler();
  s->set_rank(3);
  s->set_worker_id("w3");
  *s->mutable_compute_time() = Millis(38);
  *s->mutable_median_compute_time() = Millis(20);
  s->set_ratio(1.9);
  s->set_since_step(40);
  EXPECT_EQ(FormatEvent(e),
            "#12 2024-05-01T10:00:00.123Z g2 straggler_changed rank 3 (w3): compute 38ms per "
            "step, 1.90x the median 20ms, since step 40");
  e.mutable_straggler_changed()->set_cleared(true);
  EXPECT_EQ(FormatEvent(e),
            "#12 2024-05-01T10:00:00.123Z g2 straggler_changed rank 3 (w3) is no longer a "
            "straggler");
}

TEST(JobFormatTest, JsonKeepsProtoNamesAndZeros) {
  const nlohmann::json j = nlohmann::json::parse(ProtoToJson(DemoJob()));
  EXPECT_EQ(j["job_id"], "shakespeare");
  EXPECT_EQ(j["phase"], "JOB_PHASE_PENDING");
  EXPECT_EQ(j["step"], "0");  // uint64 is a string in proto3 JSON.
  EXPECT_EQ(j["world_size"], 0);
  EXPECT_EQ(j["spec"]["model"]["num_layers"], 4);
  EXPECT_EQ(j["spec"]["elastic"]["heartbeat_timeout"], "10s");
  const std::string line = ProtoToJson(DemoJob(), /*one_line=*/true);
  EXPECT_EQ(line.find('\n'), std::string::npos);
  EXPECT_EQ(nlohmann::json::parse(line), j);
}

TEST(JobFormatTest, Helpers) {
  EXPECT_EQ(EnumName(v1::JobPhase_descriptor(), v1::JOB_PHASE_CANCELLED), "CANCELLED");
  EXPECT_EQ(EnumName(v1::Schedule_descriptor(), v1::SCHEDULE_ONE_F_ONE_B), "ONE_F_ONE_B");
  EXPECT_EQ(EnumName(v1::JobPhase_descriptor(), 99), "99");
  EXPECT_EQ(FormatTimestamp(google::protobuf::Timestamp()), "-");
  EXPECT_EQ(HumanBytes(812), "812 B");
  EXPECT_EQ(HumanBytes(1536), "1.50 KiB");
  EXPECT_TRUE(IsPrintableText("tcp://10.0.0.1:29500\n"));
  EXPECT_TRUE(IsPrintableText("caf\xc3\xa9"));
  EXPECT_FALSE(IsPrintableText(std::string("\x00\x01", 2)));
  EXPECT_FALSE(IsPrintableText("\xc3"));
  EXPECT_EQ(HexBytes(std::string("\x00\xff\x10", 3)), "00 ff 10");
}

}  // namespace
}  // namespace shardline::shardctl
