// The check the data tests share (token_file_test.cpp, batch_sampler_test.cpp,
// synthetic_corpus_test.cpp, prepare_test.cpp): bad data or a bad setting is a UserError whose
// message names what was wrong.
#pragma once

#include <exception>
#include <functional>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "common/errors.h"
#include "tests/test_util.h"

namespace llm::testing {

// Runs action, expects a UserError whose message contains every one of the fragments. The case goes
// into docs/errors.md (record_error_case: a UserError is exit status 2 in the trainer).
inline void expect_user_error(const std::function<void()>& action,
                              const std::vector<std::string>& fragments) {
  try {
    action();
  } catch (const UserError& error) {
    const std::string message = error.what();
    record_error_case("", 2, "error: " + message);
    for (const std::string& fragment : fragments)
      EXPECT_NE(message.find(fragment), std::string::npos)
          << "message lacks \"" << fragment << "\": " << message;
    return;
  } catch (const std::exception& error) {
    ADD_FAILURE() << "expected UserError, got another exception: " << error.what();
    return;
  }
  ADD_FAILURE() << "expected a UserError mentioning \"" << fragments.front() << "\"";
}

}  // namespace llm::testing
