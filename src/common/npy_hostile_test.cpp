// The .npy loader and writer on hostile input: directories and devices refused before
// anything is read, headers that promise more than the file holds, shape products that
// overflow, zero-volume shapes with gigantic sides, and writes that fail (full disk,
// directories, missing folders) reported without leaving a partial file.
#include <gtest/gtest.h>

#include <sys/resource.h>

#include <csignal>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "common/npy.h"
#include "subquad/checked_size.h"
#include "subquad/error.h"

namespace subquad {
namespace {

namespace fs = std::filesystem;

fs::path fresh_dir(const std::string& name) {
  const fs::path dir = fs::temp_directory_path() / ("subquad_npy_hostile_" + name);
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir;
}

// A version 1.0 file with `header` (the dict text) and `data_bytes` zero bytes of data.
std::string npy_with_header(const std::string& header, size_t data_bytes) {
  std::string dict = header;
  while ((10 + dict.size() + 1) % 64 != 0) dict.push_back(' ');
  dict.push_back('\n');
  std::string content("\x93NUMPY\x01\x00", 8);
  content.push_back(static_cast<char>(dict.size() & 0xff));
  content.push_back(static_cast<char>(dict.size() >> 8));
  return content + dict + std::string(data_bytes, '\0');
}

void write_all(const fs::path& path, const std::string& content) {
  std::ofstream(path, std::ios::binary).write(content.data(), std::streamsize(content.size()));
}

std::string load_error(const std::string& path) {
  try {
    load_npy(path);
  } catch (const Error& error) {
    return error.what();
  }
  return "";
}

std::string save_error(const std::string& path, const NpyArray& array) {
  try {
    save_npy(path, array);
  } catch (const Error& error) {
    return error.what();
  }
  return "";
}

TEST(NpyHostile, RefusesDirectoriesAndDevicesWithoutReadingThem) {
  const fs::path dir = fresh_dir("dir");
  EXPECT_NE(load_error(dir.string()).find("is a directory"), std::string::npos);
  // /dev/zero never ends: reading it whole grew to gigabytes before this check.
  EXPECT_NE(load_error("/dev/zero").find("not a regular file"), std::string::npos);
  EXPECT_NE(load_error((dir / "missing.npy").string()).find("cannot open"), std::string::npos);
}

TEST(NpyHostile, ZeroVolumeWithGiganticSidesLoadsAtOnce) {
  const fs::path path = fresh_dir("zero") / "zero.npy";
  write_all(path, npy_with_header(
                      "{'descr': '<f4', 'fortran_order': False, 'shape': (999999999999999999, 0, "
                      "3), }",
                      0));
  const NpyArray array = load_npy(path.string());
  EXPECT_EQ(array.shape, (std::vector<int64_t>{999999999999999999, 0, 3}));
  EXPECT_EQ(array.element_count(), 0);
  EXPECT_TRUE(array.bytes.empty());
}

TEST(NpyHostile, ShapeProductOverflowIsAnError) {
  const fs::path path = fresh_dir("overflow") / "overflow.npy";
  write_all(path, npy_with_header("{'descr': '<f8', 'fortran_order': False, 'shape': "
                                  "(999999999999999999, 999999999999999999), }",
                                  16));
  EXPECT_NE(load_error(path.string()).find("overflows int64"), std::string::npos);
  // The product fits but the byte count does not.
  write_all(path, npy_with_header("{'descr': '<f8', 'fortran_order': False, 'shape': "
                                  "(1000000000, 2000000000), }",
                                  16));
  EXPECT_NE(load_error(path.string()).find("overflows int64"), std::string::npos);
}

TEST(NpyHostile, HeaderThatPromisesMoreThanTheFileHolds) {
  const fs::path path = fresh_dir("promise") / "promise.npy";
  // Version 2.0 with a 4 GiB header length in a 12-byte file.
  write_all(path, std::string("\x93NUMPY\x02\x00\xff\xff\xff\xff", 12));
  EXPECT_NE(load_error(path.string()).find("header of 4294967295 bytes"), std::string::npos);
  // A large shape with no data behind it: refused from the file length, nothing allocated.
  write_all(path, npy_with_header(
                      "{'descr': '<f4', 'fortran_order': False, 'shape': (1000000000000,), }", 8));
  EXPECT_NE(load_error(path.string()).find("truncated"), std::string::npos);
}

TEST(NpyHostile, CheckedSizeHelpers) {
  EXPECT_EQ(checked_product({999999999999999999, 0, 3}, "x"), 0);
  EXPECT_EQ(checked_product({2, 3, 7}, "x"), 42);
  EXPECT_THROW(checked_product({int64_t(1) << 40, int64_t(1) << 40}, "x"), Error);
  EXPECT_THROW(checked_product({-1, 2}, "x"), Error);
  EXPECT_THROW(checked_bytes(int64_t(1) << 62, 8, "x"), Error);
  EXPECT_THROW(checked_add(INT64_MAX, 1, "x"), Error);
}

TEST(NpyHostile, FullDiskIsReportedAndLeavesNoFile) {
  const std::vector<float> values(1000, 1.0f);
  const NpyArray array = make_npy<float>({1000}, values.data());
  EXPECT_NE(save_error("/dev/full", array).find("write failed"), std::string::npos);

  // A regular file that the process may not grow: the write fails (SIGXFSZ is ignored so
  // that write() reports EFBIG) and neither a partial file nor a temporary one is left.
  const fs::path dir = fresh_dir("full");
  const fs::path path = dir / "out.npy";
  rlimit saved{};
  ASSERT_EQ(getrlimit(RLIMIT_FSIZE, &saved), 0);
  auto* const previous = std::signal(SIGXFSZ, SIG_IGN);
  rlimit small = saved;
  small.rlim_cur = 512;
  ASSERT_EQ(setrlimit(RLIMIT_FSIZE, &small), 0);
  const std::string error = save_error(path.string(), array);
  setrlimit(RLIMIT_FSIZE, &saved);
  std::signal(SIGXFSZ, previous);
  EXPECT_NE(error.find("write failed"), std::string::npos) << error;
  EXPECT_TRUE(fs::is_empty(dir)) << "a partial or temporary file was left behind";

  // An existing output survives a failed rewrite untouched.
  save_npy(path.string(), make_npy<float>({2}, values.data()));
  ASSERT_EQ(setrlimit(RLIMIT_FSIZE, &small), 0);
  std::signal(SIGXFSZ, SIG_IGN);
  EXPECT_FALSE(save_error(path.string(), array).empty());
  setrlimit(RLIMIT_FSIZE, &saved);
  std::signal(SIGXFSZ, previous);
  EXPECT_EQ(load_npy(path.string()).shape, (std::vector<int64_t>{2}));
}

TEST(NpyHostile, WritesToDirectoriesAndMissingFoldersAreErrors) {
  const std::vector<float> values(4, 1.0f);
  const NpyArray array = make_npy<float>({4}, values.data());
  const fs::path dir = fresh_dir("targets");
  EXPECT_NE(save_error(dir.string(), array).find("is a directory"), std::string::npos);
  EXPECT_NE(save_error((dir / "no" / "such" / "x.npy").string(), array).find("cannot open"),
            std::string::npos);
  save_npy((dir / "ok.npy").string(), array);
  EXPECT_EQ(std::distance(fs::directory_iterator(dir), fs::directory_iterator{}), 1);
}

}  // namespace
}  // namespace subquad
