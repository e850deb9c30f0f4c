#include "io/json_file.h"

#include <gtest/gtest.h>

#include <fstream>

#include "core/error.h"
#include "support/temp_dir.h"

namespace ekva {
namespace {

namespace fs = std::filesystem;

// The error parse_json throws for `text`, or "" when it parses.
std::string parse_error(const std::string& text) {
  try {
    parse_json(text, "input.json");
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kInvalidFile);
    return e.what();
  }
  return "";
}

TEST(JsonFile, NestingIsBoundedWhileParsing) {
  // 300,000 open brackets overflowed the stack of the recursive destructor and dump.
  EXPECT_EQ(parse_error(std::string(300000, '[')), "input.json: JSON nested deeper than 64 levels");
  std::string objects;
  for (int i = 0; i < 100000; ++i) objects += "{\"a\":";
  EXPECT_EQ(parse_error(objects), "input.json: JSON nested deeper than 64 levels");
}

TEST(JsonFile, TheDeepestAcceptedNestingParses) {
  const std::string ok = std::string(64, '[') + std::string(64, ']');
  EXPECT_EQ(parse_error(ok), "");
  const std::string deep = std::string(65, '[') + std::string(65, ']');
  EXPECT_EQ(parse_error(deep), "input.json: JSON nested deeper than 64 levels");
}

TEST(JsonFile, ErrorsQuoteNoUnboundedInput) {
  // A string literal of a megabyte that never closes: nlohmann's message quotes all of it.
  const std::string error = parse_error("[\"" + std::string(1 << 20, 'x'));
  EXPECT_NE(error.find("input.json: not valid JSON"), std::string::npos);
  EXPECT_LT(error.size(), 300u);
  EXPECT_EQ(json_excerpt(std::string(1 << 20, 'y')).size(), 51u);  // 48 characters and "..."
}

TEST(JsonFile, ReadingNamesTheFileAndTheOsReason) {
  testing::TempDir temp;
  try {
    read_json_file(temp.path() / "absent.json");
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kNotFound);
    EXPECT_NE(std::string(e.what()).find("absent.json: cannot open: No such file or directory"),
              std::string::npos);
  }
  // A directory opens as a stream and reads as nothing.
  try {
    read_text_file(temp.path());
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("is a directory"), std::string::npos);
  }
  std::ofstream(temp.path() / "deep.json") << std::string(300000, '[');
  try {
    read_json_file(temp.path() / "deep.json");
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("deep.json: JSON nested deeper than 64 levels"),
              std::string::npos);
  }
}

TEST(JsonFile, PathExistsReportsOsErrorsOtherThanAbsence) {
  testing::TempDir temp;
  EXPECT_FALSE(path_exists(temp.path() / "absent"));
  EXPECT_TRUE(path_exists(temp.path()));
  fs::create_symlink("loop", temp.path() / "loop");
  EXPECT_THROW(path_exists(temp.path() / "loop" / "config.json"), Error);
  EXPECT_THROW(path_exists(temp.path() / std::string(5000, 'a')), Error);
}

}  // namespace
}  // namespace ekva
