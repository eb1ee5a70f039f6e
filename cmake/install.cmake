# `cmake --install <build> [--prefix P]`: the public headers (include/subquad), the static
# libraries of every family and the CMake package files, so that a project can
#   find_package(subquad REQUIRED)
#   target_link_libraries(app PRIVATE subquad::subquad)
# (examples/consumer/ does; scripts/test.sh builds and runs it against an install).
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

get_property(subquad_libraries GLOBAL PROPERTY SUBQUAD_LIBRARIES)
set_target_properties(subquad_dnnl PROPERTIES EXPORT_NAME dnnl)
set_target_properties(subquad_warnings PROPERTIES EXPORT_NAME warnings)
install(TARGETS ${subquad_libraries} subquad subquad_dnnl subquad_warnings
        EXPORT subquadTargets
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT development
        INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(DIRECTORY ${PROJECT_SOURCE_DIR}/include/subquad
        DESTINATION ${CMAKE_INSTALL_INCLUDEDIR} COMPONENT development)
install(EXPORT subquadTargets NAMESPACE subquad::
        DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/subquad COMPONENT development)
configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/subquadConfig.cmake.in
                              ${PROJECT_BINARY_DIR}/subquadConfig.cmake
                              INSTALL_DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/subquad)
write_basic_package_version_file(${PROJECT_BINARY_DIR}/subquadConfigVersion.cmake
                                 COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/subquadConfig.cmake
              ${PROJECT_BINARY_DIR}/subquadConfigVersion.cmake
        DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/subquad COMPONENT development)
