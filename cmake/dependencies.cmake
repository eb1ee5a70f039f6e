# Third-party libraries, all from Debian's packages (scripts/install.sh installs them).
find_package(OpenMP REQUIRED)
find_package(PkgConfig REQUIRED)
pkg_check_modules(FFTW REQUIRED IMPORTED_TARGET fftw3f fftw3)

find_path(DNNL_INCLUDE_DIR dnnl.h REQUIRED)
find_library(DNNL_LIBRARY dnnl REQUIRED)
add_library(subquad_dnnl INTERFACE)
target_include_directories(subquad_dnnl INTERFACE ${DNNL_INCLUDE_DIR})
target_link_libraries(subquad_dnnl INTERFACE ${DNNL_LIBRARY})

if(SUBQUAD_BUILD_TESTS)
  find_package(GTest REQUIRED)
  include(GoogleTest)
endif()
if(SUBQUAD_BUILD_BENCHMARKS)
  find_package(benchmark REQUIRED)
endif()

# Compile options every target of ours shares.
add_library(subquad_warnings INTERFACE)
target_compile_options(subquad_warnings INTERFACE -Wall -Wextra)
if(SUBQUAD_WERROR)
  target_compile_options(subquad_warnings INTERFACE -Werror)
endif()
# ISO C++ mode turns multiply-add contraction off; allow it (it is not fast-math: it only
# rounds a*b+c once instead of twice).
add_compile_options(-ffp-contract=fast)
if(SUBQUAD_NATIVE)
  add_compile_options(-march=native)
endif()
if(SUBQUAD_SANITIZE)
  add_compile_options(-fsanitize=address,undefined -fno-omit-frame-pointer
                      -fno-sanitize-recover=undefined)
  add_link_options(-fsanitize=address,undefined)
  # Uninitialised workspaces (Buffer::uninitialized) start as NaN, so a kernel that reads
  # memory it never wrote fails a test (src/common/buffer.h).
  add_compile_definitions(SUBQUAD_POISON_WORKSPACES)
endif()
