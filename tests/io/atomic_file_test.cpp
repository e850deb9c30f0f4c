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

}  // namespace
}  // namespace ekva
