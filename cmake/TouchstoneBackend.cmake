# touchstone_add_backend(NAME SOURCES...)
#
# Builds libtouchstone_backend_<NAME>.so (a MODULE exporting only
# touchstone_backend_entry) into <build>/lib, where `touchstone --backend NAME`
# finds it, and makes the touchstone CLI depend on it; `cmake --install` puts it
# in <prefix>/lib/touchstone (component backend_<NAME>).
function(touchstone_add_backend name)
  set(target touchstone_backend_${name})
  add_library(${target} MODULE ${ARGN})
  set_target_properties(${target} PROPERTIES
    PREFIX "lib" OUTPUT_NAME touchstone_backend_${name}
    CXX_VISIBILITY_PRESET hidden VISIBILITY_INLINES_HIDDEN ON)
  target_link_libraries(${target} PRIVATE touchstone_common)
  # Static libraries linked in (gguf, reference model, ...) must not leak symbols.
  target_link_options(${target} PRIVATE -Wl,--exclude-libs,ALL)
  touchstone_target_defaults(${target})
  set_property(GLOBAL APPEND PROPERTY TOUCHSTONE_BACKEND_TARGETS ${target})
  # Installed beside the CLI's <prefix>/bin, in <prefix>/lib/touchstone (cmake/TouchstoneInstall.cmake).
  install(TARGETS ${target} LIBRARY DESTINATION lib/touchstone COMPONENT backend_${name})
endfunction()
