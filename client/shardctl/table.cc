#include "client/shardctl/table.h"

#include <algorithm>

namespace shardline::shardctl {

size_t DisplayWidth(const std::string& s) {
  size_t n = 0;
  for (unsigned char c : s) n += (c & 0xC0) != 0x80;
  return n;
}

Table::Table(std::vector<std::string> header)
    : header_(std::move(header)), right_(header_.size(), false) {}

void Table::AlignRight(size_t column) {
  if (column < right_.size()) right_[column] = true;
}

void Table::AddRow(std::vector<std::string> cells) {
  cells.resize(header_.size());
  rows_.push_back(std::move(cells));
}

std::string Table::Render() const {
  std::vector<size_t> width(header_.size(), 0);
  for (size_t c = 0; c < header_.size(); ++c) width[c] = DisplayWidth(header_[c]);
  for (const auto& row : rows_) {
    for (size_t c = 0; c < row.size(); ++c) width[c] = std::max(width[c], DisplayWidth(row[c]));
  }
  std::string out;
  auto line = [&](const std::vector<std::string>& cells) {
    std::string l;
    for (size_t c = 0; c < cells.size(); ++c) {
      const std::string pad(width[c] - DisplayWidth(cells[c]), ' ');
      if (c > 0) l += "  ";
      l += right_[c] ? pad + cells[c] : cells[c] + pad;
    }
    while (!l.empty() && l.back() == ' ') l.pop_back();
    out += l;
    out += '\n';
  };
  line(header_);
  for (const auto& row : rows_) line(row);
  return out;
}

std::string KeyValueBlock(const std::vector<std::pair<std::string, std::string>>& lines) {
  size_t key_width = 0;
  for (const auto& [key, value] : lines) key_width = std::max(key_width, DisplayWidth(key) + 1);
  std::string out;
  const std::string indent(key_width + 2, ' ');  // where every value starts
  for (const auto& [key, value] : lines) {
    out += key + ":" + std::string(key_width - DisplayWidth(key) - 1 + 2, ' ');
    // A value of several lines: each further line starts under the first.
    for (char c : value) {
      if (c == '\n') {
        while (!out.empty() && out.back() == ' ') out.pop_back();
        out += '\n' + indent;
      } else {
        out += c;
      }
    }
    while (!out.empty() && out.back() == ' ') out.pop_back();
    out += '\n';
  }
  return out;
}

}  // namespace shardline::shardctl
