# The CTests of Touchstone's backends, generated from their backend.json files
# (docs/backend-file.md) when the project builds:
#
# touchstone_add_backend_tests(<backend.json> [NAME <name> LIBRARY <path>])
#
# Declares that file's CTests: its parity (per case, per scoring passage and the
# consistency test), serving, structured-output, contract, fault and test-model
# tests, with the file's adjustments (touchstone/run/ctest_plan.h names them
# all). `touchstone matrix --ctest` writes them at build time into
# <build>/touchstone_ctests.cmake, which CTest includes (TEST_INCLUDE_FILES, as
# gtest_discover_tests does), so the manifest, the fault expectations and the
# matrix's policy are read by one reader, the C++ one, and CMake parses none of
# them. NAME/LIBRARY: the --backend argument of the tests of the file whose
# "name" is NAME (default: the name; e.g. $<TARGET_FILE:tgt>).
# A test exits 77 (SKIP) when the backend reports that no device is available
# (TS_ERR_DEVICE): it never passes vacuously. Until the project is built, ctest
# lists one failing test, touchstone.ctests_not_generated, instead.
#
# touchstone_add_parity_tests(TARGET <backend target> [WEIGHTS w...] [MODELS m...]
#                             [LABELS l...] [SLOW_TAGS t...] [NO_CONTRACT]
#                             [KNOWN_DIVERGENCES file.json])
#
# The form for a backend built outside this repository against an installed
# Touchstone (find_package(Touchstone); docs/writing-a-backend.md): writes the
# target's backend.json into the build tree (one parity entry per weight path,
# default full_precision; the contract suite per path unless NO_CONTRACT;
# LABELS on every test; items tagged long_context are labelled slow unless
# SLOW_TAGS says otherwise) and declares it as above, with `--backend
# $<TARGET_FILE:target>`.
#
# In this repository: its own goldens and targets. An installed Touchstone's
# TouchstoneConfig.cmake sets these first (the installed manifest and the
# imported Touchstone::touchstone / Touchstone::contract_test).
if(NOT TOUCHSTONE_MANIFEST)
  set(TOUCHSTONE_MANIFEST ${PROJECT_SOURCE_DIR}/goldens/manifest.json)
endif()
if(NOT TOUCHSTONE_CLI)
  set(TOUCHSTONE_CLI touchstone)
endif()
if(NOT TOUCHSTONE_CONTRACT_TEST)
  set(TOUCHSTONE_CONTRACT_TEST touchstone_contract_test)
endif()
if(NOT DEFINED TOUCHSTONE_TEST_MODELS AND EXISTS ${PROJECT_SOURCE_DIR}/tests/models/manifest.json)
  set(TOUCHSTONE_TEST_MODELS ${PROJECT_SOURCE_DIR}/tests/models/manifest.json)
endif()
set(TOUCHSTONE_REPORT_DIR ${CMAKE_BINARY_DIR}/reports)
file(MAKE_DIRECTORY ${TOUCHSTONE_REPORT_DIR})

# CTest runs two tests at a time on a 2-core machine: a test that also runs
# 2 backend threads oversubscribes the cores, and fork-join pools (cpu_simd's
# ~210 joins per token, OpenMP, lavapipe) then wait a scheduler slice per join:
# a 4 s case took 40 s in CI. So the per-case, fault and test-model parity
# tests run the backend on one thread (--threads 1, LP_NUM_THREADS=1 for
# lavapipe): cpu_simd claims bitwise determinism across thread counts and the
# consistency tests (1, 2 and 3 threads, PROCESSORS 2) check that claim.
set(TOUCHSTONE_ONE_THREAD_ENV "LP_NUM_THREADS=1;OMP_NUM_THREADS=1")

function(touchstone_add_backend_tests file)
  cmake_parse_arguments(PARSE_ARGV 1 _b "" "NAME;LIBRARY" "")
  get_filename_component(file "${file}" ABSOLUTE)
  get_property(_files GLOBAL PROPERTY TOUCHSTONE_CTEST_FILES)
  if(NOT _files)
    # Once, at the end of the top-level CMakeLists.txt, when every file is known.
    cmake_language(DEFER DIRECTORY ${CMAKE_SOURCE_DIR} CALL _touchstone_generate_ctests)
  endif()
  set_property(GLOBAL APPEND PROPERTY TOUCHSTONE_CTEST_FILES "${file}")
  if(_b_LIBRARY)
    set_property(GLOBAL APPEND PROPERTY TOUCHSTONE_CTEST_LIBRARIES "${_b_NAME}=${_b_LIBRARY}")
  endif()
endfunction()

function(_touchstone_generate_ctests)
  get_property(_files GLOBAL PROPERTY TOUCHSTONE_CTEST_FILES)
  get_property(_libs GLOBAL PROPERTY TOUCHSTONE_CTEST_LIBRARIES)
  set(_out ${CMAKE_BINARY_DIR}/touchstone_ctests.cmake)
  set(_args --ctest ${_out} --cli $<TARGET_FILE:${TOUCHSTONE_CLI}> --manifest ${TOUCHSTONE_MANIFEST}
            --model-path ${TOUCHSTONE_MODEL_PATH} --report-dir ${TOUCHSTONE_REPORT_DIR})
  set(_deps ${TOUCHSTONE_CLI} ${_files} ${TOUCHSTONE_MANIFEST})
  foreach(_f ${_files})
    list(APPEND _args --backend-file ${_f})
  endforeach()
  foreach(_l ${_libs})
    list(APPEND _args --backend-library ${_l})
  endforeach()
  if(TARGET ${TOUCHSTONE_CONTRACT_TEST})
    list(APPEND _args --contract-test $<TARGET_FILE:${TOUCHSTONE_CONTRACT_TEST}>)
  endif()
  if(TOUCHSTONE_TEST_MODELS)
    list(APPEND _args --test-models ${TOUCHSTONE_TEST_MODELS})
    list(APPEND _deps ${TOUCHSTONE_TEST_MODELS})
  endif()
  foreach(_e ${TOUCHSTONE_ONE_THREAD_ENV})
    list(APPEND _args --one-thread-env ${_e})
  endforeach()
  add_custom_command(OUTPUT ${_out}
    COMMAND ${TOUCHSTONE_CLI} matrix ${_args}
    DEPENDS ${_deps} DEPFILE ${_out}.d
    COMMENT "touchstone matrix --ctest: the CTests of the backends' backend.json files" VERBATIM)
  add_custom_target(touchstone_ctests ALL DEPENDS ${_out})
  set(_include ${CMAKE_BINARY_DIR}/touchstone_ctests_include.cmake)
  file(WRITE ${_include} "if(EXISTS \"${_out}\")
  include(\"${_out}\")
else()
  add_test(touchstone.ctests_not_generated /bin/sh -c
    \"echo '${_out} is not generated yet: build the project (target touchstone_ctests) first'; exit 1\")
endif()
")
  set_property(DIRECTORY ${CMAKE_SOURCE_DIR} APPEND PROPERTY TEST_INCLUDE_FILES ${_include})
endfunction()

function(touchstone_add_parity_tests)
  if(NOT ARGV0 STREQUAL "TARGET")
    message(FATAL_ERROR "touchstone_add_parity_tests: TARGET <backend target> expected "
                        "(in-tree backends declare their tests in backend.json: touchstone_add_backend_tests)")
  endif()
  list(SUBLIST ARGN 1 -1 _rest)
  _touchstone_parity_tests_for_target(${_rest})
endfunction()

# _touchstone_json_strings(<out> item...): a JSON array of the items (plain names).
function(_touchstone_json_strings out)
  set(_j "")
  foreach(_v ${ARGN})
    if(_j STREQUAL "")
      set(_j "\"${_v}\"")
    else()
      set(_j "${_j}, \"${_v}\"")
    endif()
  endforeach()
  set(${out} "[${_j}]" PARENT_SCOPE)
endfunction()

function(_touchstone_parity_tests_for_target target)
  cmake_parse_arguments(PARSE_ARGV 1 _a "NO_CONTRACT" "KNOWN_DIVERGENCES" "WEIGHTS;MODELS;LABELS;SLOW_TAGS")
  if(NOT _a_WEIGHTS)
    set(_a_WEIGHTS full_precision)
  endif()
  if(NOT DEFINED _a_SLOW_TAGS)
    set(_a_SLOW_TAGS long_context)
  endif()
  _touchstone_json_strings(_slow ${_a_SLOW_TAGS})
  set(_parity "")
  set(_contract "")
  foreach(w ${_a_WEIGHTS})
    set(_tier quantized)
    if(w STREQUAL "full_precision")
      set(_tier exact)
    endif()
    set(_e "{\"weights\": \"${w}\", \"tier\": \"${_tier}\", \"slow_tags\": ${_slow}")
    if(_a_MODELS)
      _touchstone_json_strings(_m ${_a_MODELS})
      string(APPEND _e ", \"models\": ${_m}")
    endif()
    if(_a_KNOWN_DIVERGENCES)
      get_filename_component(_kd "${_a_KNOWN_DIVERGENCES}" ABSOLUTE)
      string(APPEND _e ", \"known_divergences\": \"${_kd}\"")
    endif()
    list(APPEND _parity "${_e}}")
    list(APPEND _contract "{\"weights\": \"${w}\"}")
  endforeach()
  list(JOIN _parity ", " _parity)
  set(_j "{\"touchstone_backend\": 1, \"name\": \"${target}\", \"parity\": [${_parity}]")
  if(NOT _a_NO_CONTRACT AND NOT TARGET ${TOUCHSTONE_CONTRACT_TEST})
    message(STATUS "touchstone_add_parity_tests(${target}): no contract tests: "
                   "${TOUCHSTONE_CONTRACT_TEST} is not installed (Touchstone built without BUILD_TESTING)")
  elseif(NOT _a_NO_CONTRACT)
    list(JOIN _contract ", " _contract)
    string(APPEND _j ", \"contract\": [${_contract}]")
  endif()
  if(_a_LABELS)
    _touchstone_json_strings(_l ${_a_LABELS})
    string(APPEND _j ", \"adjust\": [{\"tests\": [\"*\"], \"labels\": ${_l}}]")
  endif()
  string(APPEND _j ", \"matrix\": {\"paths\": []}}\n")
  set(_file ${CMAKE_CURRENT_BINARY_DIR}/${target}.backend.json)
  file(WRITE ${_file} "${_j}")
  touchstone_add_backend_tests(${_file} NAME ${target} LIBRARY $<TARGET_FILE:${target}>)
endfunction()

# touchstone_add_contract_tests(BACKEND WEIGHTS [PROFILE name] [LIBRARY path] [CHILD]
#                               [LABELS l...] [ENVIRONMENT VAR=value...])
#
# Registers the contract conformance suite (parity/conformance) for one backend
# + weight path: CTest contract.BACKEND.WEIGHTS runs touchstone-contract-test
# --backend ... --weights ... --model ${TOUCHSTONE_MODEL_PATH}. Exits 77 (SKIP)
# when the backend has no device here. PROFILE: its step_batch and fork
# comparisons (not bitwise for a backend without TS_CAP_BATCH_INVARIANT) take
# that manifest profile's tolerance, as the serving checks do. LIBRARY: what to
# load (default: BACKEND, a name; e.g. $<TARGET_FILE:tgt> for a library built
# here). CHILD: the same suite with the backend in touchstone-backend-runner, as
# contract.BACKEND.WEIGHTS.child. LABELS: more CTest labels. ENVIRONMENT: what
# the backend itself needs (e.g. an interpreter's path), not the suite.
function(touchstone_add_contract_tests backend weights)
  cmake_parse_arguments(PARSE_ARGV 2 _c "CHILD" "PROFILE;LIBRARY" "LABELS;ENVIRONMENT")
  set(_lib "${backend}")
  if(_c_LIBRARY)
    set(_lib "${_c_LIBRARY}")
  endif()
  _touchstone_contract_test(${backend} "${_lib}" ${weights} "${_c_LABELS}" "${_c_PROFILE}"
                            "${_c_CHILD}" "${_c_ENVIRONMENT}")
endfunction()

# _touchstone_contract_test(BACKEND LIBRARY WEIGHTS LABELS [PROFILE [CHILD [ENVIRONMENT]]])
function(_touchstone_contract_test backend backend_arg weights labels)
  set(_t contract.${backend}.${weights})
  set(_args --backend ${backend_arg} --weights ${weights} --model ${TOUCHSTONE_MODEL_PATH})
  if(ARGC GREATER 4 AND NOT "${ARGV4}" STREQUAL "")
    list(APPEND _args --profile ${ARGV4} --manifest ${TOUCHSTONE_MANIFEST})
  endif()
  if(ARGC GREATER 5 AND ARGV5)
    list(APPEND _args --child)
    set(_t ${_t}.child)
  endif()
  add_test(NAME ${_t} COMMAND ${TOUCHSTONE_CONTRACT_TEST} ${_args})
  set_tests_properties(${_t} PROPERTIES
    LABELS "contract;${backend};${weights};${labels}" SKIP_RETURN_CODE 77 TIMEOUT 600)
  if(ARGC GREATER 6 AND NOT "${ARGV6}" STREQUAL "")
    set_tests_properties(${_t} PROPERTIES ENVIRONMENT "${ARGV6}")
  endif()
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

