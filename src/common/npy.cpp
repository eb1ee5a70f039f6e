// .npy reading and writing (format spec: numpy.lib.format). The header is a Python dict
// literal; we parse exactly the three keys NumPy writes and reject anything else.
#include "subquad/npy.h"

#include <bit>
#include <cstring>
#include <fstream>
#include <iterator>

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

int64_t NpyArray::element_count() const {
  int64_t count = 1;
  for (int64_t d : shape) count *= d;
  return count;
}

NpyArray NpyArray::converted(DType target) const {
  if (target == dtype) return *this;
  NpyArray out{target, shape, std::vector<unsigned char>(element_count() * dtype_size(target))};
  const int64_t n = element_count();
  if (target == DType::float64) {
    for (int64_t i = 0; i < n; ++i) out.data<double>()[i] = data<float>()[i];
  } else {
    for (int64_t i = 0; i < n; ++i) out.data<float>()[i] = static_cast<float>(data<double>()[i]);
  }
  return out;
}

NpyArray load_npy(const std::string& path) {
  static_assert(std::endian::native == std::endian::little, "npy I/O assumes little-endian");
  std::ifstream file(path, std::ios::binary);
  check(file.good(), path, ": cannot open file");
  const std::vector<unsigned char> content((std::istreambuf_iterator<char>(file)),
                                           std::istreambuf_iterator<char>());
  check(content.size() >= kMagicSize + 4 && std::memcmp(content.data(), kMagic, kMagicSize) == 0,
        path, ": not a .npy file (bad magic string)");
  const int major = content[6];
  check(major >= 1 && major <= 3, path, ": unsupported .npy format version ", major);
  size_t header_length = 0;
  size_t header_start = 0;
  if (major == 1) {
    header_length = content[8] | (content[9] << 8);
    header_start = 10;
  } else {
    check(content.size() >= 12, path, ": truncated header");
    header_length = content[8] | (content[9] << 8) | (content[10] << 16) |
                    (static_cast<size_t>(content[11]) << 24);
    header_start = 12;
  }
  check(content.size() >= header_start + header_length, path, ": truncated header");
  const std::string header(content.begin() + header_start,
                           content.begin() + header_start + header_length);

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
  const size_t data_start = header_start + header_length;
  const size_t available = content.size() - data_start;
  size_t expected = dtype_size(array.dtype);
  for (int64_t d : array.shape)
    check(!__builtin_mul_overflow(expected, static_cast<size_t>(d), &expected), path,
          ": shape ", shape_string(array.shape), " overflows the addressable size");
  check(available == expected, path, ": data size ", available, " bytes does not match shape ",
        shape_string(array.shape), " of ", dtype_name(array.dtype), " (", expected,
        " bytes): ", available < expected ? "truncated" : "trailing bytes");
  array.bytes.assign(content.begin() + data_start, content.end());
  return array;
}

void save_npy(const std::string& path, const NpyArray& array) {
  check(array.bytes.size() == array.element_count() * dtype_size(array.dtype),
        "save_npy: byte count does not match shape ", shape_string(array.shape));
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

  std::ofstream file(path, std::ios::binary);
  check(file.good(), path, ": cannot open file for writing");
  file.write(kMagic, kMagicSize);
  const unsigned char version[2] = {static_cast<unsigned char>(version2 ? 2 : 1), 0};
  file.write(reinterpret_cast<const char*>(version), 2);
  const size_t length = header.size();
  for (size_t i = 0; i < (version2 ? 4u : 2u); ++i) file.put(static_cast<char>(length >> (8 * i)));
  file.write(header.data(), static_cast<std::streamsize>(header.size()));
  file.write(reinterpret_cast<const char*>(array.bytes.data()),
             static_cast<std::streamsize>(array.bytes.size()));
  check(file.good(), path, ": write failed");
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
