# cmake --install / CPack: what an installed Touchstone holds (docs/sdk.md).
#
#   bin/                        touchstone, touchstone-backend-runner, touchstone-fetch-models,
#                               touchstone-contract-test (BUILD_TESTING), exporters
#   lib/touchstone/             the backends (libtouchstone_backend_<name>.so), found by the CLI
#                               relative to its own location (<bin>/../lib/touchstone)
#   include/touchstone/abi/     backend_abi.h (the contract), backend_adapter.hpp (C++ helper);
#                               include/touchstone/{backend_abi.h,backend_adapter.hpp} forward
#                               to them (the paths of SDKs before the module layout)
#   lib/cmake/Touchstone/       find_package(Touchstone): Touchstone::abi,
#                               Touchstone::touchstone, touchstone_add_parity_tests(TARGET ...)
#   share/pkgconfig/touchstone.pc
#   share/touchstone/goldens/   manifest.json, the golden HDF5 files, passages, grammars
#   share/doc/touchstone/       docs/
#
# The layout is fixed (not GNUInstallDirs' multiarch libdir) so that the CLI can
# find its backends and goldens from its own path in any prefix.
include(CMakePackageConfigHelpers)

set(TOUCHSTONE_INSTALL_CMAKEDIR lib/cmake/Touchstone)

# Touchstone::abi: the header-only session contract and C++ adapter.
add_library(touchstone_abi INTERFACE)
target_include_directories(touchstone_abi INTERFACE
  $<BUILD_INTERFACE:${PROJECT_SOURCE_DIR}/common/include> $<INSTALL_INTERFACE:include>)
set_target_properties(touchstone_abi PROPERTIES EXPORT_NAME abi)
install(TARGETS touchstone_abi EXPORT TouchstoneTargets COMPONENT dev)
install(FILES ${PROJECT_SOURCE_DIR}/common/include/touchstone/abi/backend_abi.h
              ${PROJECT_SOURCE_DIR}/common/include/touchstone/abi/backend_adapter.hpp
        DESTINATION include/touchstone/abi COMPONENT dev)
# Backends written against the earlier include/touchstone/<header> paths keep building.
foreach(_h backend_abi.h backend_adapter.hpp)
  file(WRITE ${CMAKE_BINARY_DIR}/sdk_compat/${_h}
    "/* Forwards to touchstone/abi/${_h}, the header's path in the module layout. */\n"
    "#include \"touchstone/abi/${_h}\"\n")
  install(FILES ${CMAKE_BINARY_DIR}/sdk_compat/${_h} DESTINATION include/touchstone COMPONENT dev)
endforeach()

# Touchstone::parity: the parity run as a library (libtouchstone_parity.so, lib/)
# and the headers of every module its API reaches (include/touchstone/<module>/).
install(TARGETS touchstone_parity EXPORT TouchstoneTargets
        LIBRARY DESTINATION lib COMPONENT dev)
foreach(_d common/include model/core/include model/gguf/include model/tokenizer/include
        parity/runtime/include parity/golden/include parity/metrics/include parity/grammar/include
        parity/harness/include parity/report/include parity/run/include)
  install(DIRECTORY ${PROJECT_SOURCE_DIR}/${_d}/touchstone DESTINATION include COMPONENT dev
          FILES_MATCHING PATTERN "*.h" PATTERN "*.hpp")
endforeach()

install(TARGETS touchstone touchstone-backend-runner EXPORT TouchstoneTargets
        RUNTIME DESTINATION bin COMPONENT runtime)
if(TARGET touchstone-export-static-graph)
  install(TARGETS touchstone-export-static-graph RUNTIME DESTINATION bin COMPONENT backend_static_graph)
endif()
if(TARGET touchstone_contract_test)
  set_target_properties(touchstone_contract_test PROPERTIES OUTPUT_NAME touchstone-contract-test)
  install(TARGETS touchstone_contract_test EXPORT TouchstoneTargets
          RUNTIME DESTINATION bin COMPONENT dev)
  set_target_properties(touchstone_contract_test PROPERTIES EXPORT_NAME contract_test)
endif()
set_target_properties(touchstone PROPERTIES EXPORT_NAME touchstone)
set_target_properties(touchstone-backend-runner PROPERTIES EXPORT_NAME backend_runner)
install(PROGRAMS ${PROJECT_SOURCE_DIR}/ci/fetch_models.py DESTINATION bin
        RENAME touchstone-fetch-models COMPONENT runtime)

install(FILES ${PROJECT_SOURCE_DIR}/goldens/manifest.json
        DESTINATION share/touchstone/goldens COMPONENT goldens)
install(DIRECTORY ${PROJECT_SOURCE_DIR}/goldens/ DESTINATION share/touchstone/goldens
        COMPONENT goldens FILES_MATCHING PATTERN "*.h5" PATTERN "*.txt")
# The structured-output cases' grammars (manifest "grammar": {"file": ...}).
install(DIRECTORY ${PROJECT_SOURCE_DIR}/goldens/grammars DESTINATION share/touchstone/goldens
        COMPONENT goldens)
install(DIRECTORY ${PROJECT_SOURCE_DIR}/docs/ DESTINATION share/doc/touchstone COMPONENT runtime)

install(EXPORT TouchstoneTargets NAMESPACE Touchstone:: DESTINATION ${TOUCHSTONE_INSTALL_CMAKEDIR}
        COMPONENT dev)
# The first model's file name, where the installed tests expect it (TouchstoneConfig.cmake).
get_filename_component(TOUCHSTONE_MODEL_FILE "${TOUCHSTONE_MODEL_PATH}" NAME)
configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/TouchstoneConfig.cmake.in
  ${CMAKE_BINARY_DIR}/TouchstoneConfig.cmake INSTALL_DESTINATION ${TOUCHSTONE_INSTALL_CMAKEDIR})
write_basic_package_version_file(${CMAKE_BINARY_DIR}/TouchstoneConfigVersion.cmake
  COMPATIBILITY SameMinorVersion)
install(FILES ${CMAKE_BINARY_DIR}/TouchstoneConfig.cmake
              ${CMAKE_BINARY_DIR}/TouchstoneConfigVersion.cmake
              ${PROJECT_SOURCE_DIR}/cmake/TouchstoneParity.cmake
        DESTINATION ${TOUCHSTONE_INSTALL_CMAKEDIR} COMPONENT dev)

configure_file(${PROJECT_SOURCE_DIR}/cmake/touchstone.pc.in ${CMAKE_BINARY_DIR}/touchstone.pc @ONLY)
install(FILES ${CMAKE_BINARY_DIR}/touchstone.pc DESTINATION share/pkgconfig COMPONENT dev)

# CPack: one .deb with everything but the cuda backend (libcudart/cuBLAS come
# from NVIDIA's toolkit, not from a Debian package the .deb could depend on).
set(CPACK_PACKAGE_NAME touchstone)
set(CPACK_PACKAGE_VENDOR "Touchstone")
set(CPACK_PACKAGE_CONTACT "Touchstone maintainers <touchstone@localhost>")
set(CPACK_PACKAGE_DESCRIPTION_SUMMARY "Parity harness and reference backends for LLM inference")
set(CPACK_PACKAGE_VERSION ${PROJECT_VERSION})
set(CPACK_GENERATOR DEB)
set(CPACK_PACKAGING_INSTALL_PREFIX /usr)
set(CPACK_DEB_COMPONENT_INSTALL ON)
set(CPACK_COMPONENTS_GROUPING ALL_COMPONENTS_IN_ONE)
set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)
set(CPACK_STRIP_FILES ON)
set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS ON)
get_property(CPACK_DEBIAN_PACKAGE_SHLIBDEPS_PRIVATE_DIRS GLOBAL PROPERTY TOUCHSTONE_PRIVATE_LIB_DIRS)
set(CPACK_DEBIAN_PACKAGE_SECTION devel)
set(CPACK_DEBIAN_PACKAGE_RECOMMENDS "mesa-vulkan-drivers, python3")
get_property(_ts_backends GLOBAL PROPERTY TOUCHSTONE_BACKEND_TARGETS)
set(CPACK_COMPONENTS_ALL runtime dev goldens)
foreach(_t ${_ts_backends})
  string(REPLACE "touchstone_backend_" "" _b ${_t})
  if(NOT _b STREQUAL "cuda")
    list(APPEND CPACK_COMPONENTS_ALL backend_${_b})
  endif()
endforeach()
include(CPack)
