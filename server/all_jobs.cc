#include "server/all_jobs.h"

#include <utility>

namespace shardline::server {

std::vector<v1::Job> AllJobs(const Coordinator& coordinator) {
  std::vector<v1::Job> out;
  v1::ListJobsRequest request;
  request.set_page_size(1000);
  for (int pages = 0; pages < 1000; ++pages) {
    absl::StatusOr<v1::ListJobsResponse> page = coordinator.ListJobs(request);
    if (!page.ok()) break;
    for (v1::Job& job : *page->mutable_jobs()) out.push_back(std::move(job));
    if (page->next_page_token().empty()) break;
    request.set_page_token(page->next_page_token());
  }
  return out;
}

}  // namespace shardline::server
