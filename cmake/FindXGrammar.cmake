# FindXGrammar.cmake - XGrammar's C++ core as ci/xgrammar installs it:
# <prefix>/lib/libxgrammar.a, <prefix>/include/xgrammar/*.h, <prefix>/include/dlpack/dlpack.h.
# XGrammar is not vendored and installs no CMake package of its own, so this
# module looks in the one prefix ci/xgrammar builds (no system paths).
#
#   TOUCHSTONE_XGRAMMAR_PREFIX (cache PATH)  the prefix; default: env
#       TOUCHSTONE_XGRAMMAR_PREFIX (as ci/xgrammar), else
#       $HOME/.cache/touchstone/xgrammar-<version of ci/xgrammar>
#
# Result: XGrammar_FOUND, XGrammar_VERSION (the version pinned in ci/xgrammar),
# XGrammar_NOT_FOUND_REASON, and the imported target xgrammar::xgrammar (its
# include directory is a SYSTEM one, as for every imported target: the project's
# -Werror does not apply to XGrammar's headers).
file(STRINGS ${PROJECT_SOURCE_DIR}/ci/xgrammar _xg_line REGEX "^XG_VERSION=")
string(REGEX REPLACE "^XG_VERSION=([0-9.]+).*" "\\1" XGrammar_VERSION "${_xg_line}")
if(DEFINED ENV{TOUCHSTONE_XGRAMMAR_PREFIX})
  set(_xg_default "$ENV{TOUCHSTONE_XGRAMMAR_PREFIX}")
else()
  set(_xg_default "$ENV{HOME}/.cache/touchstone/xgrammar-${XGrammar_VERSION}")
endif()
set(TOUCHSTONE_XGRAMMAR_PREFIX "${_xg_default}"
    CACHE PATH "Install prefix of XGrammar's C++ core (ci/xgrammar builds it there)")

find_library(XGrammar_LIBRARY NAMES libxgrammar.a PATHS ${TOUCHSTONE_XGRAMMAR_PREFIX}/lib
             NO_DEFAULT_PATH NO_CACHE)
find_path(XGrammar_INCLUDE_DIR NAMES xgrammar/xgrammar.h dlpack/dlpack.h
          PATHS ${TOUCHSTONE_XGRAMMAR_PREFIX}/include NO_DEFAULT_PATH NO_CACHE)

set(XGrammar_NOT_FOUND_REASON "")
if(NOT EXISTS "${TOUCHSTONE_XGRAMMAR_PREFIX}/BUILD_INFO")
  set(XGrammar_NOT_FOUND_REASON "no ${TOUCHSTONE_XGRAMMAR_PREFIX}/BUILD_INFO")
elseif(NOT XGrammar_LIBRARY)
  set(XGrammar_NOT_FOUND_REASON "no libxgrammar.a in ${TOUCHSTONE_XGRAMMAR_PREFIX}/lib")
elseif(NOT XGrammar_INCLUDE_DIR OR NOT EXISTS "${XGrammar_INCLUDE_DIR}/dlpack/dlpack.h")
  set(XGrammar_NOT_FOUND_REASON "no xgrammar/ and dlpack/ headers in ${TOUCHSTONE_XGRAMMAR_PREFIX}/include")
else()
  file(STRINGS "${TOUCHSTONE_XGRAMMAR_PREFIX}/BUILD_INFO" _xg_built REGEX "^xgrammar=")
  if(NOT _xg_built STREQUAL "xgrammar=${XGrammar_VERSION}")
    set(XGrammar_NOT_FOUND_REASON "${TOUCHSTONE_XGRAMMAR_PREFIX} holds ${_xg_built}, not ${XGrammar_VERSION}")
  endif()
endif()

if(XGrammar_NOT_FOUND_REASON)
  set(XGrammar_LIBRARY XGrammar_LIBRARY-NOTFOUND)
endif()
include(FindPackageHandleStandardArgs)
find_package_handle_standard_args(XGrammar
  REQUIRED_VARS XGrammar_LIBRARY XGrammar_INCLUDE_DIR
  VERSION_VAR XGrammar_VERSION
  REASON_FAILURE_MESSAGE "${XGrammar_NOT_FOUND_REASON}")

if(XGrammar_FOUND AND NOT TARGET xgrammar::xgrammar)
  find_package(Threads REQUIRED)  # the compiler's thread pool
  add_library(xgrammar::xgrammar STATIC IMPORTED)
  set_target_properties(xgrammar::xgrammar PROPERTIES
    IMPORTED_LOCATION "${XGrammar_LIBRARY}"
    INTERFACE_INCLUDE_DIRECTORIES "${XGrammar_INCLUDE_DIR}"
    INTERFACE_LINK_LIBRARIES Threads::Threads)
endif()
