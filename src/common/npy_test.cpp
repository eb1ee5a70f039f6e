// .npy round trips and rejection of corrupt, truncated, Fortran-ordered and wrong-dtype files.
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

#include "common/npy.h"
#include "subquad/error.h"

namespace subquad {
namespace {

std::string temp_path(const std::string& name) {
  return (std::filesystem::temp_directory_path() / ("subquad_npy_test_" + name)).string();
}

std::string read_all(const std::string& path) {
  std::ifstream file(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(file), std::istreambuf_iterator<char>());
}

void write_all(const std::string& path, const std::string& content) {
  std::ofstream(path, std::ios::binary).write(content.data(), content.size());
}

void expect_load_error(const std::string& path, const std::string& fragment) {
  try {
    load_npy(path);
    FAIL() << "expected an error containing '" << fragment << "'";
  } catch (const Error& error) {
    EXPECT_NE(std::string(error.what()).find(fragment), std::string::npos) << error.what();
  }
}

TEST(Npy, RoundTripFloat32AndFloat64) {
  const std::vector<float> values{1.5f, -2.0f, 3.25f, 0.0f, 7.0f, -1e-30f};
  const std::string path = temp_path("f32.npy");
  save_npy(path, make_npy<float>({2, 3}, values.data()));
  const NpyArray loaded = load_npy(path);
  EXPECT_EQ(loaded.dtype, DType::float32);
  EXPECT_EQ(loaded.shape, (std::vector<int64_t>{2, 3}));
  for (size_t i = 0; i < values.size(); ++i) EXPECT_EQ(loaded.data<float>()[i], values[i]);

  const std::vector<double> doubles{1e300, -2.5};
  save_npy(path, make_npy<double>({2}, doubles.data()));
  const NpyArray loaded64 = load_npy(path);
  EXPECT_EQ(loaded64.dtype, DType::float64);
  EXPECT_EQ(loaded64.shape, (std::vector<int64_t>{2}));
  EXPECT_EQ(loaded64.data<double>()[0], 1e300);
}

TEST(Npy, ScalarAndZeroSizeShapes) {
  const std::string path = temp_path("empty.npy");
  save_npy(path, make_npy<float>({0, 4}, nullptr));
  EXPECT_EQ(load_npy(path).shape, (std::vector<int64_t>{0, 4}));
  const float one = 1.0f;
  save_npy(path, make_npy<float>({}, &one));
  const NpyArray scalar = load_npy(path);
  EXPECT_TRUE(scalar.shape.empty());
  EXPECT_EQ(scalar.data<float>()[0], 1.0f);
}

TEST(Npy, HeaderIsAlignedAndReadableAsVersion2) {
  const float x = 4.0f;
  const std::string path = temp_path("v2.npy");
  save_npy(path, make_npy<float>({1}, &x));
  std::string content = read_all(path);
  const size_t header_length = static_cast<unsigned char>(content[8]) |
                               (static_cast<unsigned char>(content[9]) << 8);
  EXPECT_EQ((10 + header_length) % 64, 0u);
  // Rewrite the same file as version 2.0 (4-byte header length, padded to 64 bytes again).
  std::string header = content.substr(10, header_length);
  header.insert(header.size() - 1, 62, ' ');
  std::string v2 = content.substr(0, 6) + std::string("\x02\x00", 2);
  const size_t length = header.size();
  for (int i = 0; i < 4; ++i) v2.push_back(static_cast<char>(length >> (8 * i)));
  v2 += header + content.substr(10 + header_length);
  write_all(path, v2);
  const NpyArray loaded = load_npy(path);
  EXPECT_EQ(loaded.data<float>()[0], 4.0f);
}

TEST(Npy, ConvertsBetweenPrecisions) {
  const std::vector<double> values{0.1, -3.0};
  const NpyArray as_float = make_npy<double>({2}, values.data()).converted(DType::float32);
  EXPECT_EQ(as_float.dtype, DType::float32);
  EXPECT_EQ(as_float.data<float>()[0], 0.1f);
}

TEST(Npy, RejectsBadFiles) {
  const std::vector<float> values{1, 2, 3, 4};
  const std::string path = temp_path("bad.npy");
  save_npy(path, make_npy<float>({4}, values.data()));
  const std::string good = read_all(path);

  write_all(path, good.substr(0, good.size() - 3));
  expect_load_error(path, "truncated");
  write_all(path, good + "xx");
  expect_load_error(path, "trailing bytes");
  write_all(path, "not a numpy file at all");
  expect_load_error(path, "bad magic");
  write_all(path, good.substr(0, 20));
  expect_load_error(path, "truncated header");

  std::string fortran = good;
  fortran.replace(fortran.find("False"), 5, "True ");
  write_all(path, fortran);
  expect_load_error(path, "Fortran");

  std::string int_dtype = good;
  int_dtype.replace(int_dtype.find("<f4"), 3, "<i4");
  write_all(path, int_dtype);
  expect_load_error(path, "unsupported dtype '<i4'");

  std::string big_endian = good;
  big_endian.replace(big_endian.find("<f4"), 3, ">f4");
  write_all(path, big_endian);
  expect_load_error(path, "unsupported dtype '>f4'");

  std::string bad_shape = good;
  bad_shape.replace(bad_shape.find("(4,)"), 4, "(x,)");
  write_all(path, bad_shape);
  expect_load_error(path, "cannot parse shape");

  std::string version = good;
  version[6] = 9;
  write_all(path, version);
  expect_load_error(path, "version 9");

  expect_load_error(temp_path("does_not_exist.npy"), "cannot open");
}

}  // namespace
}  // namespace subquad
