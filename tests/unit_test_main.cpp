// The unit_tests binary's main: GoogleTest's, and one exit status more. ctest runs a whole test file
// in one process (tests/ctest_entries.py), so a file whose every test skipped here (the GPU cases
// on a machine without one) exits 77, which its ctest entry reports as skipped; any failure is
// still exit 1, and a file with one test passed is exit 0.
#include <gtest/gtest.h>

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  const int status = RUN_ALL_TESTS();
  const ::testing::UnitTest& tests = *::testing::UnitTest::GetInstance();
  if (status == 0 && tests.successful_test_count() == 0 && tests.skipped_test_count() > 0) return 77;
  return status;
}
