// Every job the Coordinator holds, across all pages of ListJobs: for the
// sweeps that visit each job (checkpoint file recovery at start, the
// authenticator's job list, dropping every rendezvous at shutdown, metrics).
//
//   for (const v1::Job& job : AllJobs(coordinator)) { ... }
//
// Thread-safety: as Coordinator::ListJobs (thread-safe); jobs created while
// the pages are read may be missed.
#ifndef SHARDLINE_SERVER_ALL_JOBS_H_
#define SHARDLINE_SERVER_ALL_JOBS_H_

#include <vector>

#include "server/coordinator.h"
#include "shardline/v1/job.pb.h"

namespace shardline::server {

// Every job, in ListJobs order (at most 1000 pages of 1000). A page that
// fails ends the list there (ListJobs fails only on a bad page token).
std::vector<v1::Job> AllJobs(const Coordinator& coordinator);

}  // namespace shardline::server

#endif  // SHARDLINE_SERVER_ALL_JOBS_H_
