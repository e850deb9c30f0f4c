#pragma once
// A fresh directory under the system temp directory, removed with the object. ctest runs tests as
// concurrent processes, so the name holds the process id, the running test and a counter.
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <string>

namespace ekva::testing {

class TempDir {
 public:
  TempDir() {
    static std::atomic<int> count{0};
    const auto* test = ::testing::UnitTest::GetInstance()->current_test_info();
    const std::string name = test == nullptr
                                 ? std::string("none")
                                 : std::string(test->test_suite_name()) + "." + test->name();
    path_ = std::filesystem::temp_directory_path() /
            ("ekva_" + std::to_string(::getpid()) + "_" + name + "_" + std::to_string(count++));
    std::filesystem::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ec;  // a destructor must not throw; a leftover temp directory is harmless
    std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
};

}  // namespace ekva::testing
