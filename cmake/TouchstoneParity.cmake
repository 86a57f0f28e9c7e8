# touchstone_add_parity_tests(BACKEND WEIGHTS TIER [EXTRA_LABELS...])
#
# One CTest test per case and scoring passage of the manifest's "full" suite:
#   parity.<backend>.<weights>.<case>   labels: parity;<backend>;<tier>;<weights>
# A test exits 77 (SKIP) when the backend reports that no device is available
# (TS_ERR_DEVICE): it never passes vacuously.
set(TOUCHSTONE_MANIFEST ${PROJECT_SOURCE_DIR}/goldens/manifest.json)
file(READ ${TOUCHSTONE_MANIFEST} _ts_manifest)
string(JSON _ts_suite GET "${_ts_manifest}" suites full)
set(TOUCHSTONE_DEFAULT_CASES "")
set(TOUCHSTONE_DEFAULT_SCORING "")
foreach(_kind cases scoring)
  string(JSON _n LENGTH "${_ts_suite}" ${_kind})
  if(_n GREATER 0)
    math(EXPR _last "${_n} - 1")
    foreach(i RANGE ${_last})
      string(JSON _name GET "${_ts_suite}" ${_kind} ${i})
      if(_kind STREQUAL "cases")
        list(APPEND TOUCHSTONE_DEFAULT_CASES ${_name})
      else()
        list(APPEND TOUCHSTONE_DEFAULT_SCORING ${_name})
      endif()
    endforeach()
  endif()
endforeach()
set_property(DIRECTORY ${PROJECT_SOURCE_DIR} APPEND PROPERTY CMAKE_CONFIGURE_DEPENDS ${TOUCHSTONE_MANIFEST})
set(TOUCHSTONE_REPORT_DIR ${CMAKE_BINARY_DIR}/reports)
file(MAKE_DIRECTORY ${TOUCHSTONE_REPORT_DIR})

function(touchstone_add_parity_tests backend weights tier)
  foreach(c ${TOUCHSTONE_DEFAULT_CASES})
    set(_t parity.${backend}.${weights}.${c})
    add_test(NAME ${_t}
      COMMAND touchstone parity --backend ${backend} --weights ${weights} --case ${c}
              --manifest ${TOUCHSTONE_MANIFEST} --junit ${TOUCHSTONE_REPORT_DIR}/${_t}.xml)
    set_tests_properties(${_t} PROPERTIES
      LABELS "parity;${backend};${tier};${weights};${ARGN}" SKIP_RETURN_CODE 77 TIMEOUT 1200)
  endforeach()
  foreach(s ${TOUCHSTONE_DEFAULT_SCORING})
    set(_t parity.${backend}.${weights}.scoring.${s})
    add_test(NAME ${_t}
      COMMAND touchstone parity --backend ${backend} --weights ${weights} --scoring ${s}
              --manifest ${TOUCHSTONE_MANIFEST} --junit ${TOUCHSTONE_REPORT_DIR}/${_t}.xml)
    set_tests_properties(${_t} PROPERTIES
      LABELS "parity;${backend};${tier};${weights};${ARGN}" SKIP_RETURN_CODE 77 TIMEOUT 1200)
  endforeach()
endfunction()

# touchstone_add_contract_tests(BACKEND WEIGHTS)
#
# The contract conformance suite (tests/contract) against one backend + weight
# path. Exits 77 (SKIP) when the backend has no device here.
function(touchstone_add_contract_tests backend weights)
  set(_t contract.${backend}.${weights})
  add_test(NAME ${_t} COMMAND touchstone_contract_test)
  set_tests_properties(${_t} PROPERTIES
    LABELS "contract;${backend};${weights}" SKIP_RETURN_CODE 77 TIMEOUT 600
    ENVIRONMENT "TOUCHSTONE_CONTRACT_BACKEND=${backend};TOUCHSTONE_CONTRACT_WEIGHTS=${weights};TOUCHSTONE_MODEL_PATH=${TOUCHSTONE_MODEL_PATH}")
endfunction()

# touchstone_gtest_labels(TARGET LABEL...)
#
# gtest_discover_tests(PROPERTIES LABELS "a;b") keeps only the first label in
# CMake 3.25, so this adds a CTest include script that runs after the discovered
# tests are defined and gives every test of TARGET all the labels.
function(touchstone_gtest_labels target)
  string(REPLACE ";" "\\;" _labels "${ARGN}")
  set(_script ${CMAKE_CURRENT_BINARY_DIR}/${target}_labels.cmake)
  file(WRITE ${_script} "
file(GLOB _files \"${CMAKE_CURRENT_BINARY_DIR}/${target}*_tests.cmake\")
foreach(_f IN LISTS _files)
  file(STRINGS \"\${_f}\" _lines REGEX \"^add_test\\\\(\\\\[=\\\\[\")
  foreach(_l IN LISTS _lines)
    string(REGEX REPLACE \"^add_test\\\\(\\\\[=\\\\[([^]]+)\\\\]=\\\\].*\" \"\\\\1\" _name \"\${_l}\")
    set_tests_properties(\"\${_name}\" PROPERTIES LABELS \"${_labels}\")
  endforeach()
endforeach()
")
  set_property(DIRECTORY APPEND PROPERTY TEST_INCLUDE_FILES ${_script})
endfunction()
