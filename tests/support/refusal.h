// What a refused command must show (docs/interface.md, "Errors and exit status"), checked the
// same way by every CLI test: a status in [lowest, highest] (1 for bad input; 1..127 where
// either bad input or usage may answer), exactly one line on stderr holding `mentions`, nothing
// on stdout, and the folder's names as before (no output, no temporary left behind).
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <string>
#include <vector>

#include "support/command_runner.h"

namespace qkv::testing {

struct StatusRange {
  int lowest = 1;
  int highest = 1;
};

inline void expect_refused(const std::string& program, const std::filesystem::path& dir,
                           const std::vector<std::string>& args, const std::string& mentions,
                           StatusRange status = {}, int timeout_seconds = 0) {
  const std::vector<std::string> before = files_in(dir);
  const CommandRun run = run_program(program, dir, args, timeout_seconds);
  EXPECT_GE(run.status, status.lowest) << run.err;
  EXPECT_LE(run.status, status.highest) << run.err;
  ASSERT_FALSE(run.err.empty());
  EXPECT_EQ(run.err.back(), '\n') << run.err;
  EXPECT_EQ(std::count(run.err.begin(), run.err.end(), '\n'), 1) << run.err;
  EXPECT_NE(run.err.find(mentions), std::string::npos) << run.err;
  EXPECT_TRUE(run.out.empty()) << run.out;
  EXPECT_EQ(files_in(dir), before) << run.err;
}

}  // namespace qkv::testing
