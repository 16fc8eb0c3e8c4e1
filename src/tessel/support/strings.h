// Small text helpers shared by the command line and the drivers.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace tessel {

// "spyre,tpu-v5e,,cpu" -> {"spyre", "tpu-v5e", "cpu"}: the items of a comma list, empty ones dropped.
std::vector<std::string> comma_list(const std::string& s);

// "1.2 GiB", "512 B": a byte count for people (powers of 1024).
std::string bytes_text(uint64_t n);

// Levenshtein distance (insertions, deletions, substitutions).
size_t edit_distance(const std::string& a, const std::string& b);
// The closest of `options` to `word` when it is close enough to be a likely typo (at most
// max(2, |word| / 3) edits), else "": a "did you mean" for a misspelt name.
std::string nearest_name(const std::string& word, const std::vector<std::string>& options);

// "1 core", "16 cores": a count and its noun, plural unless the count is 1 (nouns taking "s").
std::string count_text(int64_t n, const std::string& noun);

}  // namespace tessel
