#include "plan/schedule_svg.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace shardline::plan {
namespace {

// Blue for forward, green for backward; later chunks of a rank get lighter.
std::string Fill(const Action& a, int pp, int vpp) {
  const int local = a.chunk / pp;  // which of the rank's chunks
  const double lighten = vpp > 1 ? 0.45 * local / (vpp - 1) : 0.0;
  const int base[2][3] = {{49, 110, 201}, {46, 160, 67}};
  const int* c = base[a.kind == Action::Kind::kForward ? 0 : 1];
  auto mix = [lighten](int v) { return static_cast<int>(v + (255 - v) * lighten); };
  return absl::StrFormat("#%02x%02x%02x", mix(c[0]), mix(c[1]), mix(c[2]));
}

}  // namespace

std::string ScheduleSvg(const PipelineSchedule& s) {
  const Simulation& sim = s.simulation;
  const double makespan = std::max<int64_t>(sim.makespan, 1);
  const double unit = std::clamp(1400.0 / makespan, 2.0, 28.0);  // pixels per time unit
  const double left = 80, top = 56, row = 34, box = 26;
  const double width = left + makespan * unit + 20;
  const double height = top + s.pp * row + 44;
  const bool labels = unit >= 12;

  std::string out = absl::StrFormat(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%.0f\" height=\"%.0f\" "
      "viewBox=\"0 0 %.0f %.0f\" font-family=\"sans-serif\">\n"
      "<defs><pattern id=\"bubble\" width=\"6\" height=\"6\" patternUnits=\"userSpaceOnUse\" "
      "patternTransform=\"rotate(45)\"><rect width=\"6\" height=\"6\" fill=\"#eeeeee\"/>"
      "<line x1=\"0\" y1=\"0\" x2=\"0\" y2=\"6\" stroke=\"#bbbbbb\" stroke-width=\"2\"/>"
      "</pattern></defs>\n<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n",
      width, height, width, height);
  absl::StrAppendFormat(&out,
                        "<text x=\"%.0f\" y=\"22\" font-size=\"15\" font-weight=\"bold\">%s "
                        "schedule: pp=%d, vpp=%d, m=%d</text>\n"
                        "<text x=\"%.0f\" y=\"42\" font-size=\"12\">makespan %d, ideal %d "
                        "(t_F=%d, t_B=%d), bubble ratio %.4f</text>\n",
                        left, std::string(ScheduleName(s.kind)), s.pp, s.vpp, s.micro_batches, left,
                        sim.makespan, sim.ideal, sim.t_forward, sim.t_backward, sim.bubble_ratio);
  for (int r = 0; r < s.pp; ++r) {
    const double y = top + r * row;
    absl::StrAppendFormat(&out,
                          "<text x=\"8\" y=\"%.1f\" font-size=\"12\">rank %d</text>\n"
                          "<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" "
                          "fill=\"url(#bubble)\"><title>idle (bubble)</title></rect>\n",
                          y + box * 0.65, r, left, y, makespan * unit, box);
    for (const TimedAction& t : sim.timeline[r]) {
      const double x = left + t.start * unit, w = (t.end - t.start) * unit;
      absl::StrAppendFormat(&out,
                            "<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" "
                            "fill=\"%s\" stroke=\"white\" stroke-width=\"1\">"
                            "<title>%s: t=%d..%d</title></rect>\n",
                            x, y, w, box, Fill(t.action, s.pp, s.vpp), t.action.ToString(),
                            t.start, t.end);
      if (labels) {
        absl::StrAppendFormat(&out,
                              "<text x=\"%.1f\" y=\"%.1f\" font-size=\"11\" fill=\"white\" "
                              "text-anchor=\"middle\">%d</text>\n",
                              x + w / 2, y + box * 0.65, t.action.micro_batch);
      }
    }
  }
  const double ly = top + s.pp * row + 18;
  absl::StrAppendFormat(
      &out,
      "<rect x=\"%.0f\" y=\"%.0f\" width=\"14\" height=\"14\" fill=\"%s\"/>"
      "<text x=\"%.0f\" y=\"%.0f\" font-size=\"12\">forward</text>\n"
      "<rect x=\"%.0f\" y=\"%.0f\" width=\"14\" height=\"14\" fill=\"%s\"/>"
      "<text x=\"%.0f\" y=\"%.0f\" font-size=\"12\">backward</text>\n"
      "<rect x=\"%.0f\" y=\"%.0f\" width=\"14\" height=\"14\" fill=\"url(#bubble)\"/>"
      "<text x=\"%.0f\" y=\"%.0f\" font-size=\"12\">bubble (idle)</text>\n"
      "<text x=\"%.0f\" y=\"%.0f\" font-size=\"11\" fill=\"#555555\">numbers: micro-batch; "
      "lighter: later model chunk</text>\n</svg>\n",
      left, ly, Fill({Action::Kind::kForward, 0, 0}, s.pp, s.vpp), left + 20, ly + 12,
      left + 100, ly, Fill({Action::Kind::kBackward, 0, 0}, s.pp, s.vpp), left + 120, ly + 12,
      left + 210, ly, left + 230, ly + 12, left + 340, ly + 12);
  return out;
}

}  // namespace shardline::plan
