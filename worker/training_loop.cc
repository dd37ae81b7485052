#include "worker/training_loop.h"

#include <cmath>
#include <cstdio>
#include <optional>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "spec/job_spec.h"
#include "worker/train/job_options.h"
#include "worker/train/ops.h"
#include "worker/train/trainer.h"

namespace shardline::worker {
namespace {

// True when the generation this loop runs is over (the agent re-joins).
bool GenerationOver(WorkerAgent& agent, uint64_t generation) {
  return agent.stopped() || agent.generation_over() || agent.generation() != generation;
}

}  // namespace

TrainingLoop::TrainingLoop(WorkerAgent* agent, TrainingLoopOptions options)
    : agent_(agent), options_(std::move(options)) {}

void TrainingLoop::NoteGenerationEnded(absl::Time when, std::string reason) {
  absl::MutexLock lock(&mu_);
  if (ended_at_.has_value()) return;
  ended_at_ = when;
  ended_reason_ = std::move(reason);
  ready_at_.reset();
}

void TrainingLoop::NoteCommunicatorsReady(absl::Time when) {
  absl::MutexLock lock(&mu_);
  ready_at_ = when;
}

void TrainingLoop::Log(const std::string& line) const {
  if (options_.log) options_.log(line);
}

absl::StatusOr<const train::Corpus*> TrainingLoop::CorpusFor(const v1::JobSpec& spec) {
  const std::pair<std::string, double> key{spec.data().dataset_path(),
                                           spec.data().validation_fraction()};
  auto it = corpora_.find(key);
  if (it != corpora_.end()) return it->second.get();
  if (key.first.empty()) {
    return absl::InvalidArgumentError(
        "spec.data.dataset_path is empty; give the corpus path every worker can read");
  }
  absl::StatusOr<train::Corpus> corpus = train::Corpus::Load(key.first, key.second);
  if (!corpus.ok()) return corpus.status();
  auto owned = std::make_unique<train::Corpus>(*std::move(corpus));
  const train::Corpus* raw = owned.get();
  corpora_[key] = std::move(owned);
  return raw;
}

absl::StatusOr<TrainingLoop::Outcome> TrainingLoop::Run(const v1::Assignment& a,
                                                        Communicators& comms) {
  const uint64_t gen = a.generation();
  absl::StatusOr<v1::JobSpec> spec = spec::ResolveJobSpec(agent_->spec());
  if (!spec.ok()) return spec.status();
  absl::StatusOr<train::TrainingOptions> options =
      train::TrainingOptionsFromSpec(*spec, static_cast<int>(a.dp()));
  if (!options.ok()) return options.status();
  if (options->parallel.micro_batches != static_cast<int>(a.gradient_accumulation_steps())) {
    return absl::InvalidArgumentError(absl::StrCat(
        "assignment.gradient_accumulation_steps=", a.gradient_accumulation_steps(),
        " disagrees with the spec's ", options->parallel.micro_batches, " at dp=", a.dp()));
  }
  options->device = options_.device;
  absl::StatusOr<const train::Corpus*> corpus = CorpusFor(*spec);
  if (!corpus.ok()) return corpus.status();
  train::SetIntraOpThreads(options_.threads);

  RankProgressTracker* const progress = options_.progress;
  // The activity reports of this generation: IDLE again however Run returns.
  auto set_activity = [progress](v1::Activity activity) {
    if (progress != nullptr) progress->SetActivity(activity);
  };
  struct IdleAtExit {
    RankProgressTracker* progress;
    ~IdleAtExit() {
      if (progress != nullptr) progress->SetActivity(v1::ACTIVITY_IDLE);
    }
  } idle_at_exit{progress};
  if (progress != nullptr) progress->BeginGeneration(gen);
  const train::ScopedCommWaitObserver observe_waits(progress);

  train::RankGroups groups;
  groups.coordinates.tp_rank = static_cast<int>(a.coordinates().tp_rank());
  groups.coordinates.dp_rank = static_cast<int>(a.coordinates().dp_rank());
  groups.coordinates.pp_rank = static_cast<int>(a.coordinates().pp_rank());
  for (const Communicators::Group& g : comms.groups()) {
    switch (g.kind) {
      case v1::GROUP_KIND_TP: groups.tp = g.backend.get(); break;
      case v1::GROUP_KIND_DP: groups.dp = g.backend.get(); break;
      case v1::GROUP_KIND_PP: groups.pp = g.backend.get(); break;
      case v1::GROUP_KIND_EMBEDDING: groups.embedding = g.backend.get(); break;
      default: break;
    }
  }
  // --inject-fault collective_count_mismatch_at_step: the dp group's calls
  // go through the fault's decorator (it forwards all else).
  std::unique_ptr<Backend> faulty_dp =
      options_.faults != nullptr ? options_.faults->WrapDataParallel(groups.dp) : nullptr;
  if (faulty_dp != nullptr) groups.dp = faulty_dp.get();
  // Refuse, naming the sizes, a rank this host cannot hold, before the
  // trainer allocates it (else std::bad_alloc, or the OOM killer).
  if (absl::Status s = train::CheckHostMemory(options->model, options->parallel,
                                              {groups.coordinates}, options_.host_memory);
      !s.ok()) {
    return s;
  }
  absl::StatusOr<std::unique_ptr<train::Trainer>> created =
      train::Trainer::Create(*options, groups, *corpus);
  if (!created.ok()) return created.status();
  train::Trainer& trainer = **created;
  const bool leader = a.rank() == 0;
  if (options_.metrics != nullptr) options_.metrics->SetPlace(gen, a.rank());
  const int64_t total = static_cast<int64_t>(spec->training().train_steps());
  const int64_t interval = static_cast<int64_t>(spec->checkpoint().interval_steps());
  const bool can_save = !spec->checkpoint().directory().empty();
  const int64_t global_batch = options->parallel.global_batch();

  // A lost peer shows up here as a failed collective, usually just before
  // the coordinator's restart directive (it sees the peer's session break
  // at once). Give the directive a moment, so that the error is only
  // reported when it is this worker's own.
  // `in_step`: s is a training step's, most likely a failed collective's.
  auto classify = [&](const absl::Status& s, bool in_step = false) -> absl::StatusOr<Outcome> {
    if (absl::IsAborted(s)) return Outcome::kGenerationOver;
    // Still held up by the failed call: the progress reports say COLLECTIVE
    // meanwhile (with the failed call in flight, backend.h), so that the
    // coordinator counts this rank among the waiters when it looks for the
    // rank that holds the others up (a peer frozen whole, SIGSTOP).
    std::optional<train::ObservedCommWait> still_waiting;
    if (in_step) still_waiting.emplace();
    const absl::Time deadline = absl::Now() + absl::Seconds(2);
    do {
      if (GenerationOver(*agent_, gen)) return Outcome::kGenerationOver;
      absl::SleepFor(absl::Milliseconds(20));
    } while (absl::Now() < deadline);
    return s;
  };

  Checkpointer checkpointer(agent_->checkpoints(), agent_->clock());
  std::optional<absl::Time> restored_at;
  if (a.has_restore() && !a.restore().checkpoint_id().empty()) {
    agent_->SetProgress(a.start_step(), v1::WORKER_STATE_RESTORING);
    set_activity(v1::ACTIVITY_CHECKPOINT);
    const absl::Time start = absl::Now();
    absl::Status s = checkpointer.Restore(agent_->job_id(), a.restore(), trainer);
    set_activity(v1::ACTIVITY_IDLE);
    if (!s.ok()) return classify(s);
    restored_at = absl::Now();
    if (options_.metrics != nullptr) options_.metrics->ObserveRestore();
    Log(absl::StrFormat("generation %d rank %d: restored %s (step %d) in %.2f s", gen, a.rank(),
                        a.restore().checkpoint_id(), a.restore().step(),
                        absl::ToDoubleSeconds(absl::Now() - start)));
  } else if (a.start_step() != 0) {
    return absl::InvalidArgumentError(absl::StrCat("assignment.start_step=", a.start_step(),
                                                   " without a checkpoint to restore"));
  }
  if (trainer.step() * global_batch != static_cast<int64_t>(a.data_cursor()) &&
      a.data_cursor() != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "assignment.data_cursor=", a.data_cursor(), " disagrees with step ", trainer.step(),
        " x global_batch ", global_batch));
  }
  if (leader) {
    Log(absl::StrFormat(
        "generation %d: training steps %d..%d  tp=%d pp=%d dp=%d zero_stage=%d micro_batches=%d "
        "state on %s",
        gen, trainer.step() + 1, total, options->parallel.tp, options->parallel.pp,
        options->parallel.dp, options->parallel.zero_stage, options->parallel.micro_batches,
        trainer.state_location()));
  }

  absl::Duration window_time, window_comm;
  int64_t window_tokens = 0;
  while (trainer.step() < total) {
    if (GenerationOver(*agent_, gen)) return Outcome::kGenerationOver;
    agent_->SetProgress(static_cast<uint64_t>(trainer.step()), v1::WORKER_STATE_TRAINING);
    set_activity(v1::ACTIVITY_COMPUTE);
    if (options_.faults != nullptr) {
      options_.faults->BeforeStep(static_cast<uint64_t>(trainer.step()) + 1);
    }
    absl::StatusOr<train::StepStats> st = trainer.TrainStep(checkpoint_requested_.exchange(false));
    if (!st.ok()) return classify(st.status(), /*in_step=*/true);
    const int64_t done = trainer.step();
    // --inject-fault slow_compute: F times the step's compute, as compute.
    if (options_.faults != nullptr) st->time += options_.faults->AfterStep(st->time - st->comm_time);
    if (progress != nullptr) {
      progress->StepDone(static_cast<uint64_t>(done), st->time, st->time - st->comm_time);
    }
    if (options_.metrics != nullptr) options_.metrics->ObserveStep(*st);
    window_time += st->time;
    window_comm += st->comm_time;
    window_tokens += st->tokens;
    v1::StepMetrics metrics;
    metrics.set_step(static_cast<uint64_t>(done));
    metrics.set_loss(st->loss);
    if (st->time > absl::ZeroDuration())
      metrics.set_tokens_per_second(st->tokens / absl::ToDoubleSeconds(st->time));
    agent_->SetMetrics(metrics);
    std::optional<absl::Time> ended_at, ready_at;
    std::string reason;
    {
      absl::MutexLock lock(&mu_);
      ended_at = ended_at_;
      ready_at = ready_at_;
      reason = ended_reason_;
      ended_at_.reset();
    }
    if (ended_at.has_value()) {
      // The first step after a recovery: how long each phase took, counted
      // from the moment this worker learned its generation was over.
      auto since = [&](std::optional<absl::Time> t) {
        return t.has_value() ? absl::StrFormat("%.2f s", absl::ToDoubleSeconds(*t - *ended_at))
                             : std::string("-");
      };
      Log(absl::StrCat("recovery (", reason, "): communicators ready after ", since(ready_at),
                       ", restored after ", since(restored_at), ", first resumed step ", done,
                       " after ", since(absl::Now()), " (generation ", gen, ", rank ", a.rank(),
                       ")"));
    }
    agent_->SetProgress(static_cast<uint64_t>(done), v1::WORKER_STATE_TRAINING);
    if (leader && (done % options_.log_interval == 0 || done == total)) {
      const double secs = absl::ToDoubleSeconds(window_time);
      Log(absl::StrFormat(
          "gen %d step %d/%d loss %.4f lr %.2e grad_norm %.3f tokens/s %.0f comm %.1f%% "
          "step_ms %.1f",
          gen, done, total, st->loss, st->learning_rate, st->grad_norm,
          secs > 0 ? window_tokens / secs : 0.0,
          secs > 0 ? 100.0 * absl::ToDoubleSeconds(window_comm) / secs : 0.0,
          absl::ToDoubleMilliseconds(st->time)));
      window_time = window_comm = absl::ZeroDuration();
      window_tokens = 0;
    }
    if (st->checkpoint_requested && !can_save && leader) {
      Log(absl::StrCat("step ", done, ": a checkpoint was requested but the job has no "
                       "checkpoint directory (spec.checkpoint.directory); not saved"));
    }
    const bool periodic = interval > 0 && (done % interval == 0 || done == total);
    if (can_save && (periodic || st->checkpoint_requested)) {
      const bool async = spec->checkpoint().async_save() && done != total;
      if (!async) agent_->SetProgress(static_cast<uint64_t>(done), v1::WORKER_STATE_CHECKPOINTING);
      set_activity(v1::ACTIVITY_CHECKPOINT);
      const absl::Time start = absl::Now();
      absl::Status s = checkpointer.Save(agent_->fence(), a.rank(), done,
                                         static_cast<uint64_t>(done * global_batch), trainer, async);
      set_activity(v1::ACTIVITY_IDLE);
      if (absl::IsFailedPrecondition(s) && absl::StartsWith(s.message(), "BeginCheckpoint:")) {
        // The coordinator refused to open this step's checkpoint: nothing
        // was written and the state is intact. After a restore fell back
        // past a corrupt checkpoint, that one is still the newest committed
        // until training passes its step; other refusals (the generation
        // ending, a save still pending) are also no reason to stop
        // training. Save a later step.
        if (leader) {
          Log(absl::StrFormat("gen %d step %d: checkpoint skipped: %s", gen, done, s.message()));
        }
        continue;
      }
      if (absl::IsFailedPrecondition(s) && absl::StartsWith(s.message(), "ReportShard:") &&
          absl::StrContains(s.message(), " was aborted: ")) {
        // The coordinator aborted this checkpoint while our shard was being
        // written (e.g. it restarted with the checkpoint pending): the
        // restore point is the previous one and the state is intact. Unless
        // the generation is over too, train on and save a later step.
        absl::StatusOr<Outcome> outcome = classify(s);
        if (outcome.ok()) return outcome;
        if (leader) {
          Log(absl::StrFormat("gen %d step %d: checkpoint skipped: %s", gen, done, s.message()));
        }
        continue;
      }
      if (!s.ok()) return classify(s);
      if (options_.metrics != nullptr) options_.metrics->ObserveCheckpoint(absl::Now() - start);
      if (leader) {
        Log(absl::StrFormat("gen %d step %d: checkpoint %s (%s) in %.2f s", gen, done,
                            checkpointer.last_summary().checkpoint_id(),
                            async ? "writing in the background"
                            : checkpointer.last_summary().state() == v1::CHECKPOINT_STATE_COMMITTED
                                ? "committed"
                                : "written; commits when every rank has reported",
                            absl::ToDoubleSeconds(absl::Now() - start)));
      }
    }
  }
  set_activity(v1::ACTIVITY_CHECKPOINT);
  if (absl::Status s = checkpointer.Finish(); !s.ok()) return classify(s);
  set_activity(v1::ACTIVITY_COMPUTE);
  if (options_.sample_length > 0) {
    absl::StatusOr<std::string> text =
        trainer.Sample(options_.sample_prompt, options_.sample_length, 0.8, 1);
    if (!text.ok()) return classify(text.status());
    if (leader) Log(absl::StrCat("sample:\n", options_.sample_prompt, *text));
  }
  agent_->SetProgress(static_cast<uint64_t>(total), v1::WORKER_STATE_DONE);
  return Outcome::kFinished;
}

}  // namespace shardline::worker
