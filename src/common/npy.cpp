// .npy reading and writing (format spec: numpy.lib.format). The header is a Python dict
// literal; we parse exactly the three keys NumPy writes and reject anything else.
#include "common/npy.h"

#include <unistd.h>

#include <atomic>
#include <bit>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "subquad/checked_size.h"
#include "subquad/error.h"
#include "subquad/view.h"

namespace subquad {
namespace {

constexpr char kMagic[] = "\x93NUMPY";
constexpr size_t kMagicSize = 6;
constexpr size_t kHeaderAlignment = 64;

size_t dtype_size(DType dtype) { return dtype == DType::float32 ? 4 : 8; }

DType parse_descr(const std::string& descr, const std::string& path) {
  if (descr == "<f4" || descr == "=f4") return DType::float32;
  if (descr == "<f8" || descr == "=f8") return DType::float64;
  throw_error(path, ": unsupported dtype '", descr,
              "' (expected little-endian float32 '<f4' or float64 '<f8')");
}

// The text after `'key':` in the header dict, spaces skipped, or an error naming the key.
std::string value_after_key(const std::string& header, const std::string& key,
                            const std::string& path) {
  const size_t at = header.find("'" + key + "'");
  size_t colon = at == std::string::npos ? at : header.find(':', at);
  check(colon != std::string::npos, path, ": malformed header (no '", key, "'): ", header);
  const size_t start = header.find_first_not_of(' ', colon + 1);
  check(start != std::string::npos, path, ": malformed header (no value for '", key, "')");
  return header.substr(start);
}

// The text between the first pair of `open` and `close` delimiters at the start of `text`.
std::string enclosed(const std::string& text, char open, char close, const std::string& what,
                     const std::string& path) {
  const size_t end = text.empty() || text[0] != open ? std::string::npos : text.find(close, 1);
  check(end != std::string::npos, path, ": malformed ", what, " in the header");
  return text.substr(1, end - 1);
}

// "3, 4" or "4," or "" -> dimensions.
std::vector<int64_t> parse_shape(const std::string& text, const std::string& path) {
  std::vector<int64_t> shape;
  size_t at = 0;
  while (true) {
    at = text.find_first_not_of(' ', at);
    if (at == std::string::npos) break;
    const size_t end = text.find_first_not_of("0123456789", at);
    const std::string digits = text.substr(at, end - at);
    check(!digits.empty() && digits.size() <= 18, path, ": cannot parse shape '(", text,
          ")' in the header");
    shape.push_back(std::stoll(digits));
    at = end == std::string::npos ? end : text.find_first_not_of(' ', end);
    if (at == std::string::npos) break;
    check(text[at] == ',', path, ": cannot parse shape '(", text, ")' in the header");
    ++at;
  }
  return shape;
}

}  // namespace

const char* dtype_name(DType dtype) { return dtype == DType::float32 ? "float32" : "float64"; }

int64_t NpyArray::element_count() const { return checked_product(shape, "npy shape"); }

NpyArray NpyArray::converted(DType target) const {
  if (target == dtype) return *this;
  NpyArray out{target, shape,
               std::vector<unsigned char>(checked_bytes(element_count(), dtype_size(target),
                                                        "npy conversion"))};
  const int64_t n = element_count();
  if (target == DType::float64) {
    for (int64_t i = 0; i < n; ++i) out.data<double>()[i] = data<float>()[i];
  } else {
    for (int64_t i = 0; i < n; ++i) out.data<float>()[i] = static_cast<float>(data<double>()[i]);
  }
  return out;
}

namespace {

// A header longer than this is refused before it is read (NumPy's own readers refuse
// headers beyond 10 kB by default; ours only ever hold a short dict).
constexpr size_t kMaxHeaderBytes = size_t(1) << 16;

// Refuses anything but an existing regular file: a directory, a device such as /dev/zero
// or a pipe would otherwise be read without bound.
void check_regular_file(const std::string& path) {
  std::error_code error;
  const std::filesystem::file_status status = std::filesystem::status(path, error);
  check(!error && std::filesystem::exists(status), path, ": cannot open file (",
        error ? error.message() : "no such file", ")");
  check(!std::filesystem::is_directory(status), path, ": is a directory, expected a .npy file");
  check(std::filesystem::is_regular_file(status), path,
        ": not a regular file (a device, pipe or socket), expected a .npy file");
}

// Reads exactly `count` bytes at the stream's position into `out`, or throws naming `what`.
void read_exactly(std::ifstream& file, unsigned char* out, size_t count, const std::string& path,
                  const char* what) {
  file.read(reinterpret_cast<char*>(out), static_cast<std::streamsize>(count));
  check(static_cast<size_t>(file.gcount()) == count, path, ": truncated ", what);
}

}  // namespace

NpyArray load_npy(const std::string& path) {
  static_assert(std::endian::native == std::endian::little, "npy I/O assumes little-endian");
  check_regular_file(path);
  std::error_code size_error;
  const uintmax_t file_size = std::filesystem::file_size(path, size_error);
  check(!size_error, path, ": cannot read the file size (", size_error.message(), ")");
  std::ifstream file(path, std::ios::binary);
  check(file.good(), path, ": cannot open file");

  // Magic, version and header length first: nothing else is read unless they are valid.
  unsigned char preamble[12] = {};
  file.read(reinterpret_cast<char*>(preamble), 10);
  check(file.gcount() == 10 && std::memcmp(preamble, kMagic, kMagicSize) == 0, path,
        ": not a .npy file (bad magic string)");
  const int major = preamble[6];
  check(major >= 1 && major <= 3, path, ": unsupported .npy format version ", major);
  size_t header_length = 0;
  size_t header_start = 0;
  if (major == 1) {
    header_length = preamble[8] | (preamble[9] << 8);
    header_start = 10;
  } else {
    read_exactly(file, preamble + 10, 2, path, "header");
    header_length = preamble[8] | (preamble[9] << 8) | (preamble[10] << 16) |
                    (static_cast<size_t>(preamble[11]) << 24);
    header_start = 12;
  }
  check(header_length <= kMaxHeaderBytes, path, ": header of ", header_length,
        " bytes is longer than the ", kMaxHeaderBytes, " bytes accepted");
  check(file_size >= header_start + header_length, path, ": truncated header");
  std::string header(header_length, '\0');
  read_exactly(file, reinterpret_cast<unsigned char*>(header.data()), header_length, path,
               "header");

  const std::string order = value_after_key(header, "fortran_order", path);
  check(order.rfind("False", 0) == 0 || order.rfind("True", 0) == 0, path,
        ": malformed header (fortran_order): ", header);
  check(order.rfind("False", 0) == 0, path,
        ": Fortran-ordered arrays are not supported (save with C order)");

  NpyArray array;
  array.dtype =
      parse_descr(enclosed(value_after_key(header, "descr", path), '\'', '\'', "descr", path), path);
  array.shape =
      parse_shape(enclosed(value_after_key(header, "shape", path), '(', ')', "shape", path), path);
  const std::string shape_what = path + ": shape " + shape_string(array.shape);
  const size_t expected =
      checked_bytes(checked_product(array.shape, shape_what.c_str()), dtype_size(array.dtype),
                    shape_what.c_str());
  const uintmax_t available = file_size - header_start - header_length;
  check(available == expected, path, ": data size ", available, " bytes does not match shape ",
        shape_string(array.shape), " of ", dtype_name(array.dtype), " (", expected,
        " bytes): ", available < expected ? "truncated" : "trailing bytes");
  // Only what the header promises (and the file length confirmed) is allocated and read.
  try {
    array.bytes.resize(expected);
  } catch (const std::bad_alloc&) {
    throw_out_of_memory(expected, path + " (the data of shape " + shape_string(array.shape) + ")");
  }
  read_exactly(file, array.bytes.data(), expected, path, "data");
  return array;
}

namespace {

// Writes all `count` bytes, or throws naming the path and the system's reason.
void write_bytes(std::FILE* file, const void* bytes, size_t count, const std::string& path) {
  if (count == 0) return;
  // The call first, then errno: the order in which arguments are evaluated is unspecified.
  const size_t written = std::fwrite(bytes, 1, count, file);
  if (written != count) throw_error(path, ": write failed (", std::strerror(errno), ")");
}

// The .npy encoding of `array`: preamble and header padded to 64 bytes.
std::string npy_header(const NpyArray& array) {
  std::string dims;
  for (size_t i = 0; i < array.shape.size(); ++i)
    dims += (i ? ", " : "") + std::to_string(array.shape[i]);
  if (array.shape.size() == 1) dims += ",";  // a one-element tuple is "(4,)"
  std::string header = std::string("{'descr': '") +
                       (array.dtype == DType::float32 ? "<f4" : "<f8") +
                       "', 'fortran_order': False, 'shape': (" + dims + "), }";
  const bool version2 = header.size() + 11 > 65535;
  const size_t preamble = version2 ? 12 : 10;
  const size_t total = (preamble + header.size() + 1 + kHeaderAlignment - 1) / kHeaderAlignment *
                       kHeaderAlignment;
  header.append(total - preamble - header.size() - 1, ' ');
  header.push_back('\n');
  std::string encoded(kMagic, kMagicSize);
  encoded.push_back(static_cast<char>(version2 ? 2 : 1));
  encoded.push_back('\0');
  const size_t length = header.size();
  for (size_t i = 0; i < (version2 ? 4u : 2u); ++i)
    encoded.push_back(static_cast<char>(length >> (8 * i)));
  return encoded + header;
}

// Writes header and data to `target`, checking every write, the flush and the close.
void write_npy_file(const std::string& target, const std::string& header,
                    const NpyArray& array, const std::string& path) {
  std::FILE* file = std::fopen(target.c_str(), "wb");
  if (file == nullptr) throw_error(path, ": cannot open file for writing (", std::strerror(errno), ")");
  try {
    write_bytes(file, header.data(), header.size(), path);
    write_bytes(file, array.bytes.data(), array.bytes.size(), path);
    if (std::fflush(file) != 0) throw_error(path, ": write failed (", std::strerror(errno), ")");
  } catch (...) {
    std::fclose(file);
    throw;
  }
  if (std::fclose(file) != 0)
    throw_error(path, ": write failed at close (", std::strerror(errno), ")");
}

}  // namespace

void save_npy(const std::string& path, const NpyArray& array) {
  check(array.bytes.size() ==
            checked_bytes(array.element_count(), dtype_size(array.dtype), "save_npy"),
        "save_npy: byte count does not match shape ", shape_string(array.shape));
  const std::string header = npy_header(array);
  std::error_code error;
  const std::filesystem::file_status status = std::filesystem::status(path, error);
  check(!std::filesystem::is_directory(status), path, ": is a directory, expected a file name");
  if (std::filesystem::exists(status) && !std::filesystem::is_regular_file(status)) {
    // A device or pipe (/dev/stdout, /dev/full): written in place, never replaced.
    write_npy_file(path, header, array, path);
    return;
  }
  // A regular file appears whole or not at all: written under a temporary name in the
  // same folder, then renamed over `path`.
  static std::atomic<uint64_t> counter{0};
  const std::string temporary = path + ".tmp." + std::to_string(::getpid()) + "." +
                                std::to_string(counter.fetch_add(1));
  try {
    write_npy_file(temporary, header, array, path);
  } catch (...) {
    std::remove(temporary.c_str());
    throw;
  }
  if (std::rename(temporary.c_str(), path.c_str()) != 0) {
    const int reason = errno;
    std::remove(temporary.c_str());
    throw_error(path, ": cannot replace the file (", std::strerror(reason), ")");
  }
}

template <typename T>
NpyArray make_npy(const std::vector<int64_t>& shape, const T* data) {
  static_assert(std::is_same_v<T, float> || std::is_same_v<T, double>);
  NpyArray array;
  array.dtype = std::is_same_v<T, float> ? DType::float32 : DType::float64;
  array.shape = shape;
  array.bytes.resize(array.element_count() * sizeof(T));
  if (!array.bytes.empty()) std::memcpy(array.bytes.data(), data, array.bytes.size());
  return array;
}

template NpyArray make_npy<float>(const std::vector<int64_t>&, const float*);
template NpyArray make_npy<double>(const std::vector<int64_t>&, const double*);

}  // namespace subquad
