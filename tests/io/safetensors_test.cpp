#include "io/safetensors.h"

#include <gtest/gtest.h>

#include <cstring>
#include <fstream>

#include "core/error.h"
#include "support/temp_dir.h"

namespace ekva {
namespace {

namespace fs = std::filesystem;

class SafetensorsTest : public ::testing::Test {
 protected:
  // A file with the given header text and `data_bytes` zero bytes of data.
  fs::path raw(const std::string& header, size_t data_bytes, uint64_t header_len_override = 0) {
    const fs::path p = dir_ / "t.safetensors";
    std::ofstream out(p, std::ios::binary);
    const uint64_t len = header_len_override != 0 ? header_len_override : header.size();
    out.write(reinterpret_cast<const char*>(&len), 8);
    out << header;
    out << std::string(data_bytes, '\0');
    return p;
  }
  static std::string error_of(const fs::path& p) {
    try {
      SafetensorsFile f(p);
    } catch (const Error& e) {
      return e.what();
    }
    return "";
  }
  testing::TempDir temp_;
  const std::filesystem::path& dir_ = temp_.path();
};

TEST_F(SafetensorsTest, RoundTripsEveryDtype) {
  const std::vector<float> f = {1.5f, -2.0f, 3.25f};
  const std::vector<uint16_t> h = {0x3c00, 0xc000};  // f16 1, -2
  const std::vector<int64_t> ids = {7, 8, 9, 10};
  write_safetensors(dir_ / "a.safetensors", {{"f", DType::kF32, {3}, f.data()},
                                             {"h", DType::kF16, {2, 1}, h.data()},
                                             {"ids", DType::kI64, {2, 2}, ids.data()}});
  SafetensorsFile file(dir_ / "a.safetensors");
  EXPECT_EQ(file.get("f").shape, (std::vector<int64_t>{3}));
  EXPECT_EQ(std::memcmp(file.get("f").data, f.data(), 12), 0);
  float out[2];
  to_f32(DType::kF16, file.get("h").data, out, 2);
  EXPECT_EQ(out[0], 1.0f);
  EXPECT_EQ(out[1], -2.0f);
  EXPECT_EQ(static_cast<const int64_t*>(file.get("ids").data)[3], 10);
  EXPECT_FALSE(fs::exists(dir_ / "a.safetensors.tmp"));
}

TEST_F(SafetensorsTest, RejectsTruncatedFile) {
  const fs::path p = dir_ / "short.safetensors";
  std::ofstream(p) << "abc";
  EXPECT_NE(error_of(p).find("truncated"), std::string::npos);
}

TEST_F(SafetensorsTest, RejectsHeaderLengthBeyondFile) {
  const auto p = raw("{}", 0, 4096);
  EXPECT_NE(error_of(p).find("past the end"), std::string::npos);
}

TEST_F(SafetensorsTest, RejectsMalformedJson) {
  EXPECT_NE(error_of(raw("{\"a\": ", 0)).find("not valid JSON"), std::string::npos);
}

TEST_F(SafetensorsTest, RejectsOutOfRangeOffsets) {
  const auto p = raw(R"({"w":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})", 8);
  EXPECT_NE(error_of(p).find("out of range"), std::string::npos);
}

TEST_F(SafetensorsTest, RejectsOverlappingTensors) {
  const auto p = raw(
      R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
      12);
  EXPECT_NE(error_of(p).find("overlap"), std::string::npos);
}

TEST_F(SafetensorsTest, RejectsSizeThatDisagreesWithShape) {
  const auto p = raw(R"({"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", 8);
  EXPECT_NE(error_of(p).find("needs 12"), std::string::npos);
}

TEST_F(SafetensorsTest, RejectsAByteCountThatWrapsAround) {
  // 2^61 I64 elements are 2^64 bytes, which wrap to 0: the empty range must not match.
  const auto p =
      raw(R"({"a":{"dtype":"I64","shape":[2305843009213693952],"data_offsets":[0,0]}})", 0);
  EXPECT_NE(error_of(p).find("needs 2^64 or more"), std::string::npos);
  // [1, 2^61 + 2] I64 elements wrap to 16 bytes.
  const auto q = raw(
      R"({"input_ids":{"dtype":"I64","shape":[1,2305843009213693954],"data_offsets":[0,16]}})", 16);
  EXPECT_NE(error_of(q).find("needs 2^64 or more"), std::string::npos);
}

TEST_F(SafetensorsTest, RejectsDeeplyNestedHeader) {
  const std::string header = "{\"__metadata__\":" + std::string(100000, '[');
  EXPECT_NE(error_of(raw(header, 0)).find("nested deeper than"), std::string::npos);
}

TEST_F(SafetensorsTest, RejectsUnknownDtype) {
  const auto p = raw(R"({"a":{"dtype":"F8_E4M3","shape":[2],"data_offsets":[0,2]}})", 2);
  EXPECT_NE(error_of(p).find("F8_E4M3"), std::string::npos);
}

TEST_F(SafetensorsTest, RejectsNegativeDimension) {
  const auto p = raw(R"({"a":{"dtype":"F32","shape":[-1],"data_offsets":[0,0]}})", 0);
  EXPECT_NE(error_of(p).find("negative"), std::string::npos);
}

TEST_F(SafetensorsTest, MissingTensorNamesFileAndTensor) {
  const std::vector<float> f = {1.0f};
  write_safetensors(dir_ / "model.safetensors", {{"x", DType::kF32, {1}, f.data()}});
  TensorStore store(dir_);
  try {
    store.get("y");
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kNotFound);
    EXPECT_NE(std::string(e.what()).find("'y'"), std::string::npos);
  }
  try {
    store.get("x", {2});
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("[1]"), std::string::npos);
  }
}

TEST_F(SafetensorsTest, LoadsShardedCheckpointThroughIndex) {
  const std::vector<float> a = {1.0f, 2.0f}, b = {3.0f};
  write_safetensors(dir_ / "model-00001-of-00002.safetensors", {{"a", DType::kF32, {2}, a.data()}});
  write_safetensors(dir_ / "model-00002-of-00002.safetensors", {{"b", DType::kF32, {1}, b.data()}});
  std::ofstream(dir_ / "model.safetensors.index.json")
      << R"({"metadata":{},"weight_map":{"a":"model-00001-of-00002.safetensors","b":"model-00002-of-00002.safetensors"}})";
  TensorStore store(dir_);
  EXPECT_EQ(static_cast<const float*>(store.get("b").data)[0], 3.0f);
  EXPECT_EQ(store.names().size(), 2u);
}

TEST_F(SafetensorsTest, ShardIndexNamingAbsentTensorIsRejected) {
  const std::vector<float> a = {1.0f};
  write_safetensors(dir_ / "s1.safetensors", {{"a", DType::kF32, {1}, a.data()}});
  std::ofstream(dir_ / "model.safetensors.index.json")
      << R"({"weight_map":{"zz":"s1.safetensors"}})";
  EXPECT_THROW(TensorStore{dir_}, Error);
}

}  // namespace
}  // namespace ekva
