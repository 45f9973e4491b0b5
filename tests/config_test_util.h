// Helpers shared by the config tests (model_config_test.cpp, run_config_test.cpp, cli_test.cpp): the
// shipped configs' paths, a `trainer ARGS...` command line parsed in process, and the checks every
// error test makes: the UserError names where the mistake is (the file or "command line") and which
// key or flag, since that is what a user needs.
#pragma once

#include <exception>
#include <functional>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "common/errors.h"
#include "tests/test_util.h"
#include "trainer/cli.h"

namespace llm::testing {

// configs/NAME.json in the source tree.
inline std::string config_path(const std::string& name) {
  return (source_dir() / "configs" / (name + ".json")).string();
}

// Fails the test unless `message` contains every one of `parts`.
inline void expect_mentions(const std::string& message, const std::vector<std::string>& parts) {
  for (const std::string& part : parts)
    EXPECT_NE(message.find(part), std::string::npos)
        << "message should mention \"" << part << "\":\n  " << message;
}

// Runs `action`, which must throw UserError; returns its message ("" and a failure otherwise).
inline std::string user_error_of(const std::function<void()>& action) {
  try {
    action();
  } catch (const UserError& error) {
    testing::record_error_case("", 2, std::string("error: ") + error.what());  // in process: the test names it
    return error.what();
  } catch (const std::exception& error) {
    ADD_FAILURE() << "expected UserError, got another exception: " << error.what();
    return "";
  }
  ADD_FAILURE() << "expected UserError, nothing was thrown";
  return "";
}

// `trainer ARGS...`, parsed as main() parses it.
inline Command parse(std::vector<std::string> args) {
  args.insert(args.begin(), "trainer");
  std::vector<const char*> argv;
  for (const std::string& arg : args) argv.push_back(arg.c_str());
  return parse_command_line(static_cast<int>(argv.size()), argv.data());
}

}  // namespace llm::testing
