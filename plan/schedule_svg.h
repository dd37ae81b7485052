// Draws a simulated pipeline schedule as an SVG timeline, one row per pp
// rank, in the style of the Megatron-LM paper's figures (Narayanan et al.,
// SC'21, Figures 3 and 4): forward passes in blue, backward passes in green,
// a lighter shade per later model chunk, idle time (the bubble) hatched grey.
//
//   std::string svg = ScheduleSvg(*BuildSchedule(ScheduleKind::kOneFOneB, 4, 1, 8));
//
// Pure: returns the document; the caller writes it. Thread-safe.
#ifndef SHARDLINE_PLAN_SCHEDULE_SVG_H_
#define SHARDLINE_PLAN_SCHEDULE_SVG_H_

#include <string>

#include "plan/pipeline.h"

namespace shardline::plan {

// A standalone SVG 1.1 document (UTF-8). Each action box is labelled with
// its micro-batch index; the title gives schedule, pp, vpp, m and the
// simulated bubble ratio.
std::string ScheduleSvg(const PipelineSchedule& schedule);

}  // namespace shardline::plan

#endif  // SHARDLINE_PLAN_SCHEDULE_SVG_H_
