// Aligned text tables and key-value blocks for shardctl's human output.
//
//   Table t({"JOB", "PHASE", "STEP"});
//   t.AlignRight(2);
//   t.AddRow({"shakespeare", "RUNNING", "120"});
//   out << t.Render();
//   // JOB          PHASE    STEP
//   // shakespeare  RUNNING   120
//
// Columns are separated by two spaces; trailing spaces are trimmed; widths
// count UTF-8 code points, so names with accents still line up. Not
// thread-safe; build one per output.
#ifndef SHARDLINE_CLIENT_SHARDCTL_TABLE_H_
#define SHARDLINE_CLIENT_SHARDCTL_TABLE_H_

#include <string>
#include <utility>
#include <vector>

namespace shardline::shardctl {

class Table {
 public:
  explicit Table(std::vector<std::string> header);

  // Right-aligns column `column` (0-based), for numbers.
  void AlignRight(size_t column);

  // Adds a row. A row shorter than the header is padded with empty cells; a
  // longer one is cut to the header's width.
  void AddRow(std::vector<std::string> cells);

  size_t num_rows() const { return rows_.size(); }

  // The header line and every row, each ending in "\n".
  std::string Render() const;

 private:
  std::vector<std::string> header_;
  std::vector<bool> right_;
  std::vector<std::vector<std::string>> rows_;
};

// "Key:   value" lines with the values aligned, e.g.
//   Job:         shakespeare
//   Phase:       RUNNING
// A value with line breaks continues on lines indented to where the values
// start:
//   Stragglers:  rank 3 (w3): 1.90x
//                rank 1 (w1): 1.60x
std::string KeyValueBlock(const std::vector<std::pair<std::string, std::string>>& lines);

// Display width of UTF-8 text in code points (bytes 10xxxxxx do not count).
size_t DisplayWidth(const std::string& s);

}  // namespace shardline::shardctl

#endif  // SHARDLINE_CLIENT_SHARDCTL_TABLE_H_
