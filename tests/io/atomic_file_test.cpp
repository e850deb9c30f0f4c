#include "io/atomic_file.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <fstream>
#include <sstream>

#include "core/error.h"
#include "support/temp_dir.h"

namespace ekva {
namespace {

namespace fs = std::filesystem;

class AtomicFileTest : public ::testing::Test {
 protected:
  static std::string contents(const fs::path& p) {
    std::ifstream in(p, std::ios::binary);
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
  }

  testing::TempDir temp_;
  const std::filesystem::path& dir_ = temp_.path();
};

TEST_F(AtomicFileTest, ReplacesTheFileOnlyWhenTheWriteCompletes) {
  const fs::path p = dir_ / "out.txt";
  write_file_atomically(p, [](std::ostream& out) { out << "first"; });
  EXPECT_EQ(contents(p), "first");
  EXPECT_THROW(write_file_atomically(p,
                                     [](std::ostream& out) {
                                       out << "partial";
                                       fail(ErrorKind::kInvalidArgument, "stopped midway");
                                     }),
               Error);
  EXPECT_EQ(contents(p), "first");
  EXPECT_FALSE(fs::exists(dir_ / "out.txt.tmp"));
}

TEST_F(AtomicFileTest, AMissingDirectoryIsAnIoErrorNamingThePath) {
  const fs::path p = dir_ / "missing" / "out.txt";
  try {
    write_file_atomically(p, [](std::ostream& out) { out << "x"; });
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kIo);
    EXPECT_NE(std::string(e.what()).find("missing"), std::string::npos);
  }
  EXPECT_FALSE(fs::exists(p));
}

TEST_F(AtomicFileTest, AResultSetIsWrittenAllOrNothing) {
  const fs::path out = dir_ / "results";
  // The second file cannot be written: its temporary name is taken, or a directory is in the way.
  for (const char* blocked : {"results.csv.tmp", "results.csv"}) {
    fs::create_directories(out / blocked);
    EXPECT_THROW(write_files_atomically(out, {{"results.json", "{}"}, {"results.csv", "a,b"}}),
                 Error);
    EXPECT_FALSE(fs::exists(out / "results.json")) << blocked;
    EXPECT_FALSE(fs::exists(out / "results.json.tmp")) << blocked;
    fs::remove(out / blocked);
  }
  write_files_atomically(out, {{"results.json", "{}"}, {"results.csv", "a,b"}});
  EXPECT_EQ(contents(out / "results.json"), "{}");
  EXPECT_EQ(contents(out / "results.csv"), "a,b");
}

TEST_F(AtomicFileTest, OutputLocationsAreCheckedWithTheOsReason) {
  const auto error_of = [](const std::function<void()>& check) -> std::string {
    try {
      check();
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kIo);
      return e.what();
    }
    return "";
  };
  EXPECT_EQ(error_of([&] { check_output_file(dir_ / "stats.json"); }), "");
  EXPECT_EQ(error_of([&] { check_output_directory(dir_ / "new" / "deeper"); }), "");
  EXPECT_NE(error_of([&] { check_output_file(dir_); }).find("it is a directory"),
            std::string::npos);
  EXPECT_NE(error_of([&] {
              check_output_file(dir_ / "missing" / "stats.json");
            }).find("is not a directory"),
            std::string::npos);
  std::ofstream(dir_ / "file") << "x";
  EXPECT_NE(error_of([&] { check_output_directory(dir_ / "file"); }).find("is not a directory"),
            std::string::npos);
  EXPECT_NE(
      error_of([&] { check_output_directory(dir_ / "file" / "sub"); }).find("is not a directory"),
      std::string::npos);
  EXPECT_NE(error_of([&] {
              check_output_file(dir_ / std::string(5000, 'a'));
            }).find("File name too long"),
            std::string::npos);
  // A directory whose bits let root write but whose filesystem makes no files.
  EXPECT_NE(error_of([&] {
              check_output_directory("/proc/ekva_results");
            }).find("cannot write into /proc"),
            std::string::npos);
  for (const auto& entry : fs::directory_iterator(dir_)) {  // the probes leave nothing behind
    EXPECT_NE(entry.path().filename().string().rfind(".ekva-probe", 0), 0u) << entry.path();
  }
  if (::geteuid() != 0) {  // root writes anywhere
    fs::create_directories(dir_ / "ro");
    fs::permissions(dir_ / "ro", fs::perms::owner_read | fs::perms::owner_exec);
    EXPECT_NE(
        error_of([&] { check_output_file(dir_ / "ro" / "stats.json"); }).find("Permission denied"),
        std::string::npos);
    fs::permissions(dir_ / "ro", fs::perms::owner_all);
  }
}

}  // namespace
}  // namespace ekva
