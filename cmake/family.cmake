# subquad_add_family(name): src/<name>/ holds one op family. Its *.cpp files (other than
# *_test.cpp and *_bench.cpp) form the library subquad_<name>; *_test.cpp files form the
# GoogleTest executable subquad_<name>_tests; *_bench.cpp files form the Google Benchmark
# executable subquad_<name>_bench. A folder without library sources (cpu: header-only
# kernels) is an INTERFACE library. Every family may use common and cpu (the CPU backend's
# shared primitives); exact is also a dependency of the other families (merge, references).
function(subquad_add_family name)
  set(dir ${PROJECT_SOURCE_DIR}/src/${name})
  file(GLOB all_sources CONFIGURE_DEPENDS ${dir}/*.cpp)
  file(GLOB test_sources CONFIGURE_DEPENDS ${dir}/*_test.cpp)
  file(GLOB bench_sources CONFIGURE_DEPENDS ${dir}/*_bench.cpp)
  set(lib_sources ${all_sources})
  if(test_sources)
    list(REMOVE_ITEM lib_sources ${test_sources})
  endif()
  if(bench_sources)
    list(REMOVE_ITEM lib_sources ${bench_sources})
  endif()

  if(NOT lib_sources)
    # Its headers are private to the library: seen from src/ while building, not installed.
    add_library(subquad_${name} INTERFACE)
    target_include_directories(subquad_${name} INTERFACE $<BUILD_INTERFACE:${PROJECT_SOURCE_DIR}/src>)
    target_link_libraries(subquad_${name} INTERFACE subquad_common)
  else()
    add_library(subquad_${name} STATIC ${lib_sources})
    target_include_directories(subquad_${name} PUBLIC $<BUILD_INTERFACE:${PROJECT_SOURCE_DIR}/include>
                               $<INSTALL_INTERFACE:include> PRIVATE ${PROJECT_SOURCE_DIR}/src)
    target_link_libraries(subquad_${name} PRIVATE subquad_warnings)
    if(name STREQUAL "common")
      target_link_libraries(subquad_${name} PUBLIC OpenMP::OpenMP_CXX PkgConfig::FFTW subquad_dnnl)
    elseif(name STREQUAL "exact")
      target_link_libraries(subquad_${name} PUBLIC subquad_cpu subquad_common)
    else()
      target_link_libraries(subquad_${name} PUBLIC subquad_exact subquad_cpu subquad_common)
    endif()
  endif()
  set_target_properties(subquad_${name} PROPERTIES EXPORT_NAME ${name})
  set_property(GLOBAL APPEND PROPERTY SUBQUAD_LIBRARIES subquad_${name})

  if(SUBQUAD_BUILD_TESTS AND test_sources)
    add_executable(subquad_${name}_tests ${test_sources})
    target_include_directories(subquad_${name}_tests PRIVATE ${PROJECT_SOURCE_DIR}/src)
    target_link_libraries(subquad_${name}_tests PRIVATE subquad_${name} subquad_warnings
                          GTest::gtest_main)
    gtest_discover_tests(subquad_${name}_tests DISCOVERY_MODE PRE_TEST
                         PROPERTIES LABELS ${name})
    subquad_test_compile_options(subquad_${name}_tests)
  endif()
  if(SUBQUAD_BUILD_BENCHMARKS AND bench_sources)
    add_executable(subquad_${name}_bench ${bench_sources})
    target_include_directories(subquad_${name}_bench PRIVATE ${PROJECT_SOURCE_DIR}/src)
    target_link_libraries(subquad_${name}_bench PRIVATE subquad_${name} subquad_warnings
                          benchmark::benchmark_main)
  endif()
endfunction()

# subquad_test_compile_options(target): how test executables compile. Their code is
# fixtures, references and checks; the kernels under test keep the libraries' flags. So in
# Release they build at -O1 (code generation at -O3 was half of each test file's compile
# time). They share one precompiled header of GoogleTest and the standard headers they use
# (parsing those was the other half, paid again by the sanitizer build): the first test
# target builds it, the others reuse it (GCC reads the header as text where flags differ).
set(SUBQUAD_TEST_PCH_HEADERS <gtest/gtest.h> <algorithm> <cmath> <complex> <cstdint>
    <limits> <random> <string> <vector>)
function(subquad_test_compile_options target)
  target_compile_options(${target} PRIVATE $<$<CONFIG:Release>:-O1>)
  get_property(owner GLOBAL PROPERTY SUBQUAD_TEST_PCH_OWNER)
  if(owner)
    target_precompile_headers(${target} REUSE_FROM ${owner})
  else()
    target_precompile_headers(${target} PRIVATE ${SUBQUAD_TEST_PCH_HEADERS})
    set_property(GLOBAL PROPERTY SUBQUAD_TEST_PCH_OWNER ${target})
  endif()
endfunction()
