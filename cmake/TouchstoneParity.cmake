# touchstone_add_parity_tests(BACKEND WEIGHTS TIER [EXTRA_LABELS...] [MODELS model...]
#                             [SLOW_TAGS tag...] [PROFILE name] [CI_SUITE suite]
#                             [KNOWN_DIVERGENCES file.json])
#
# One CTest test per case and scoring passage of the manifest's "full" suite that
# belongs to one of MODELS (default: the manifest's first model, SmolLM2):
#   parity.<backend>.<weights>.<case>   labels: parity;<backend>;<tier>;<weights>;<model>
# plus parity.<backend>.<weights>.consistency (the golden-free checks).
# PROFILE: judge them by that manifest profile (--profile, also a label) instead
# of the weight path's default (exact / quantized).
# CI_SUITE: the items that manifest suite does not name are labelled slow too
# (ci/test runs the suite's items and the consistency test; `ctest -L slow` the
# rest): for backends whose every item costs tens of seconds here (lavapipe,
# MLIR compiles), each item's check is the same code path on another prompt.
# KNOWN_DIVERGENCES: reviewed expected failures (--known-divergences;
# docs/known-divergences.md): an item that fails exactly as an entry records
# passes as KNOWN_DIVERGENCE, one that fails otherwise or now passes fails.
# A test exits 77 (SKIP) when the backend reports that no device is available
# (TS_ERR_DEVICE): it never passes vacuously.
#
# touchstone_add_unsupported_test(BACKEND WEIGHTS MODEL)
#
# parity.<backend>.<weights>.<model>.unsupported: the backend must refuse MODEL at
# load with TS_ERR_UNSUPPORTED (parity exit 3, the report says UNSUPPORTED and why);
# computing it, crashing or any other status fails the test.
# In this repository: its own goldens and targets. An installed Touchstone's
# TouchstoneConfig.cmake sets these three first (the installed manifest and the
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
file(READ ${TOUCHSTONE_MANIFEST} _ts_manifest)
string(JSON _ts_suite GET "${_ts_manifest}" suites full)
string(JSON TOUCHSTONE_FIRST_MODEL GET "${_ts_manifest}" models 0 name)
# TOUCHSTONE_MODELS: every model of the manifest, in order.
set(TOUCHSTONE_MODELS "")
string(JSON _n LENGTH "${_ts_manifest}" models)
math(EXPR _last "${_n} - 1")
foreach(i RANGE ${_last})
  string(JSON _name GET "${_ts_manifest}" models ${i} name)
  list(APPEND TOUCHSTONE_MODELS ${_name})
endforeach()
# _ts_model_of_<case or passage> = its model
foreach(_kind cases scoring)
  string(JSON _n LENGTH "${_ts_manifest}" ${_kind})
  math(EXPR _last "${_n} - 1")
  foreach(i RANGE ${_last})
    string(JSON _name GET "${_ts_manifest}" ${_kind} ${i} name)
    string(JSON _model GET "${_ts_manifest}" ${_kind} ${i} model)
    set(_ts_model_of_${_name} ${_model})
    # _ts_tags_of_<case or passage> = its tags (absent: none)
    set(_ts_tags_of_${_name} "")
    string(JSON _tags ERROR_VARIABLE _no_tags GET "${_ts_manifest}" ${_kind} ${i} tags)
    if(NOT _no_tags)
      string(JSON _nt LENGTH "${_tags}")
      if(_nt GREATER 0)
        math(EXPR _lt "${_nt} - 1")
        foreach(j RANGE ${_lt})
          string(JSON _tag GET "${_tags}" ${j})
          list(APPEND _ts_tags_of_${_name} ${_tag})
        endforeach()
      endif()
    endif()
  endforeach()
endforeach()
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
set_property(DIRECTORY ${CMAKE_SOURCE_DIR} APPEND PROPERTY CMAKE_CONFIGURE_DEPENDS ${TOUCHSTONE_MANIFEST})
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

# Where each fault of the catalog (touchstone/faults.h) but the serving ones is
# caught on SmolLM2, as touchstone_add_fault_tests entries (NAME=STEP/LAYER:POINT
# or NAME=CHECK@STEP): one list for every backend that computes the reference's
# arithmetic closely enough to fail at the same place (cpu_simd, vulkan, cuda on
# the quantized path). causal_mask: layer 1, whose attention reads K/V that layer 0
# computed from future tokens; last_layer_skipped: layer 29 of SmolLM2's 30;
# "after": every tap matches, the fault is past the last layer.
set(TOUCHSTONE_FAULT_EXPECTATIONS
  rope_base_off_1pct=0/0:attn rope_layout=0/0:attn kv_position_off_by_one=0/0:attn
  kv_write_next=0/0:attn gqa_mapping=0/0:attn attention_scale=0/0:attn rms_eps_10x=0/0:attn
  quant_scale_min_swap=0/0:attn nibble_order=0/0:attn fp16_accumulation=0/0:attn
  causal_mask=0/1:attn last_layer_skipped=0/29:attn logits_perturb_1e-3=0/after
  rewind_noop=consistency.rewind_replay@0 thread_order_reduction=consistency.threads@0
  logits_row_shift=consistency.prefill_vs_decode@1
  prefill_position_reset=consistency.chunked_prefill@5
  session_order_reduction=consistency.run_to_run@0+)
# The serving faults: each must fail its serving check (quick plan). A backend
# that refuses some of them registers the rest (list(FILTER ... EXCLUDE)).
# CHECK/LAYER:POINT: where the backend has layer taps, the failure also names
# that first divergent layer tap (batch entry or fork against the sequence
# alone; "after": every tap matches, the rows returned are wrong);
# speculative_verify's all-position rows are not located.
# The last three escaped every serving plan before issue 37 (forks that share
# KV rows, all-position rows shifted inside a batch, a KV row read from the
# previous entry at a 32-token page boundary).
set(TOUCHSTONE_SERVING_FAULT_EXPECTATIONS
  batch_token_count_split=serving.batch_invariance/0:attn
  batch_kv_leak=serving.content_isolation/0:attn fork_short_copy=serving.prefix_fork/0:attn
  batch_position_offset=serving.batch_invariance/0:attn
  verify_row_shift=serving.speculative_verify fork_shared_kv=serving.prefix_fork/0:attn
  batch_all_positions_shift=serving.batch_invariance/after
  batch_page_boundary_leak=serving.batch_invariance/0:attn)
# The structured-output faults (ABI v7): in the grammar a backend enforces
# itself, so only the reference (which enforces with the oracle) implements
# them; each must fail the check named, at the step named, on structured_answer.
# A mask one step late also breaks constrained_greedy and non_interference; a
# grammar left where rejected drafts took it also breaks rollback.
set(TOUCHSTONE_STRUCTURED_FAULT_EXPECTATIONS
  grammar_mask_one_step_late=structured.mask_parity@1
  grammar_straddling_token=structured.mask_parity@0
  grammar_early_stop=structured.termination@0
  grammar_advanced_on_rejected_draft=structured.speculative@1
  grammar_mask_shared_in_batch=structured.batch_isolation@1)
# The serving faults the reference and cuda refuse (cpu_simd and vulkan implement them).
set(TOUCHSTONE_SERVING_FAULTS_NOT_IN_REFERENCE_CUDA fork_shared_kv batch_all_positions_shift
  batch_page_boundary_leak)
# On full precision: the quantized-only faults must leave the path passing,
# fp16_accumulation must still fail.
set(TOUCHSTONE_FAULT_EXPECTATIONS_FULL_PRECISION
  quant_scale_min_swap=pass nibble_order=pass fp16_accumulation=0/0:attn)

# touchstone_add_backend_parity(<backend.json>)
#
# A backend's parity tests as its backend.json declares them (docs/backend-file.md):
# for each entry of "parity", touchstone_add_parity_tests(<name> <weights> <tier>
# MODELS <models> SLOW_TAGS <slow_tags> CI_SUITE <ci_suite> PROFILE <profile>
# KNOWN_DIVERGENCES <known_divergences, relative to the file>), each keyword only
# when the entry has the member. `touchstone matrix` reads the same file.
function(touchstone_add_backend_parity file)
  file(READ ${file} _j)
  set_property(DIRECTORY APPEND PROPERTY CMAKE_CONFIGURE_DEPENDS ${file})
  get_filename_component(_dir ${file} DIRECTORY)
  string(JSON _name GET "${_j}" name)
  string(JSON _n LENGTH "${_j}" parity)
  math(EXPR _last "${_n} - 1")
  foreach(i RANGE ${_last})
    string(JSON _e GET "${_j}" parity ${i})
    string(JSON _w GET "${_e}" weights)
    string(JSON _tier GET "${_e}" tier)
    set(_args ${_name} ${_w} ${_tier})
    foreach(_pair models:MODELS slow_tags:SLOW_TAGS)
      string(REPLACE ":" ";" _pair ${_pair})
      list(GET _pair 0 _member)
      list(GET _pair 1 _kw)
      string(JSON _arr ERROR_VARIABLE _missing GET "${_e}" ${_member})
      if(NOT _missing)
        _touchstone_json_list("${_arr}" _values)
        list(APPEND _args ${_kw} ${_values})
      endif()
    endforeach()
    foreach(_pair ci_suite:CI_SUITE profile:PROFILE known_divergences:KNOWN_DIVERGENCES)
      string(REPLACE ":" ";" _pair ${_pair})
      list(GET _pair 0 _member)
      list(GET _pair 1 _kw)
      string(JSON _v ERROR_VARIABLE _missing GET "${_e}" ${_member})
      if(NOT _missing)
        if(_member STREQUAL "known_divergences")
          set(_v ${_dir}/${_v})
        endif()
        list(APPEND _args ${_kw} ${_v})
      endif()
    endforeach()
    touchstone_add_parity_tests(${_args})
  endforeach()
endfunction()

# _touchstone_json_list(<json array> <out>): the array's strings as a CMake list.
function(_touchstone_json_list arr out)
  set(_l "")
  string(JSON _n LENGTH "${arr}")
  if(_n GREATER 0)
    math(EXPR _last "${_n} - 1")
    foreach(k RANGE ${_last})
      string(JSON _v GET "${arr}" ${k})
      list(APPEND _l ${_v})
    endforeach()
  endif()
  set(${out} ${_l} PARENT_SCOPE)
endfunction()

# touchstone_add_backend_serving(<backend.json>)
#
# A backend's serving CTests as its backend.json declares them
# (docs/backend-file.md): for each entry of "serving",
# touchstone_add_serving_tests(<name> <weights> MODELS <models, absent: every
# model> PLAN <plan> LABELS <labels>) with the profile and known divergences of
# its weight path's "parity" entry.
function(touchstone_add_backend_serving file)
  file(READ ${file} _j)
  set_property(DIRECTORY APPEND PROPERTY CMAKE_CONFIGURE_DEPENDS ${file})
  get_filename_component(_dir ${file} DIRECTORY)
  string(JSON _name GET "${_j}" name)
  string(JSON _n LENGTH "${_j}" serving)
  math(EXPR _last "${_n} - 1")
  foreach(i RANGE ${_last})
    string(JSON _e GET "${_j}" serving ${i})
    string(JSON _w GET "${_e}" weights)
    set(_args ${_name} ${_w})
    string(JSON _arr ERROR_VARIABLE _missing GET "${_e}" models)
    if(_missing)
      list(APPEND _args MODELS ${TOUCHSTONE_MODELS})
    else()
      _touchstone_json_list("${_arr}" _models)
      list(APPEND _args MODELS ${_models})
    endif()
    string(JSON _plan ERROR_VARIABLE _missing GET "${_e}" plan)
    if(NOT _missing)
      list(APPEND _args PLAN ${_plan})
    endif()
    # The profile and known divergences of the weight path's parity entry.
    string(JSON _np LENGTH "${_j}" parity)
    math(EXPR _lp "${_np} - 1")
    foreach(k RANGE ${_lp})
      string(JSON _pe GET "${_j}" parity ${k})
      string(JSON _pw GET "${_pe}" weights)
      if(_pw STREQUAL _w)
        string(JSON _v ERROR_VARIABLE _missing GET "${_pe}" profile)
        if(NOT _missing)
          list(APPEND _args PROFILE ${_v})
        endif()
        string(JSON _v ERROR_VARIABLE _missing GET "${_pe}" known_divergences)
        if(NOT _missing)
          list(APPEND _args KNOWN_DIVERGENCES ${_dir}/${_v})
        endif()
      endif()
    endforeach()
    string(JSON _arr ERROR_VARIABLE _missing GET "${_e}" labels)
    if(NOT _missing)
      _touchstone_json_list("${_arr}" _labels)
      list(APPEND _args LABELS ${_labels})
    endif()
    touchstone_add_serving_tests(${_args})
  endforeach()
endfunction()

function(touchstone_add_parity_tests)
  if(ARGV0 STREQUAL "TARGET")
    list(SUBLIST ARGN 1 -1 _rest)  # drop the keyword: <target> [WEIGHTS ...] ...
    _touchstone_parity_tests_for_target(${_rest})
    return()
  endif()
  cmake_parse_arguments(PARSE_ARGV 3 _a "" "PROFILE;KNOWN_DIVERGENCES;CI_SUITE" "MODELS;SLOW_TAGS")
  _touchstone_ci_suite_items("${_a_CI_SUITE}" _ts_ci_items)  # read by _touchstone_parity_tests
  _touchstone_parity_tests(${ARGV0} ${ARGV0} ${ARGV1} "${ARGV2};${_a_UNPARSED_ARGUMENTS}"
                           "${_a_MODELS}" "${_a_SLOW_TAGS}" "${_a_PROFILE}" "${_a_KNOWN_DIVERGENCES}")
endfunction()

# touchstone_add_parity_tests(TARGET <backend target> [WEIGHTS w...] [MODELS m...]
#                             [LABELS l...] [SLOW_TAGS t...] [NO_CONTRACT]
#                             [KNOWN_DIVERGENCES file.json])
#
# The form for a backend built outside this repository against an installed
# Touchstone (find_package(Touchstone); docs/writing-a-backend.md). For each
# weight path (default full_precision): the per-case tests and the consistency
# test as above, parity.<target>.<weights>.<case>, with `--backend
# $<TARGET_FILE:target>`; and the contract conformance suite,
# contract.<target>.<weights>. Items tagged long_context are labelled slow
# unless SLOW_TAGS says otherwise.
function(_touchstone_parity_tests_for_target target)
  cmake_parse_arguments(PARSE_ARGV 1 _a "NO_CONTRACT" "KNOWN_DIVERGENCES" "WEIGHTS;MODELS;LABELS;SLOW_TAGS")
  set(_ts_ci_items "")
  if(NOT _a_WEIGHTS)
    set(_a_WEIGHTS full_precision)
  endif()
  if(NOT DEFINED _a_SLOW_TAGS)
    set(_a_SLOW_TAGS long_context)
  endif()
  foreach(w ${_a_WEIGHTS})
    if(w STREQUAL "full_precision")
      set(_tier exact)
    else()
      set(_tier quantized)
    endif()
    _touchstone_parity_tests(${target} $<TARGET_FILE:${target}> ${w} "${_tier};${_a_LABELS}"
                             "${_a_MODELS}" "${_a_SLOW_TAGS}" "" "${_a_KNOWN_DIVERGENCES}")
    if(NOT _a_NO_CONTRACT AND NOT TARGET ${TOUCHSTONE_CONTRACT_TEST})
      message(STATUS "touchstone_add_parity_tests(${target}): no contract tests: "
                     "${TOUCHSTONE_CONTRACT_TEST} is not installed (Touchstone built without BUILD_TESTING)")
    elseif(NOT _a_NO_CONTRACT)
      _touchstone_contract_test(${target} $<TARGET_FILE:${target}> ${w} "${_a_LABELS}")
    endif()
  endforeach()
endfunction()

# _touchstone_ci_suite_items(SUITE OUT): the cases and scoring passages of the
# manifest's SUITE ("" = none; OUT is then empty, meaning "every item").
function(_touchstone_ci_suite_items suite out)
  set(_items "")
  if(NOT suite STREQUAL "")
    foreach(_kind cases scoring)
      string(JSON _n ERROR_VARIABLE _err LENGTH "${_ts_manifest}" suites ${suite} ${_kind})
      if(_err)
        message(FATAL_ERROR "CI_SUITE ${suite}: no such suite (or no ${_kind}) in ${TOUCHSTONE_MANIFEST}")
      endif()
      if(_n GREATER 0)
        math(EXPR _last "${_n} - 1")
        foreach(i RANGE ${_last})
          string(JSON _name GET "${_ts_manifest}" suites ${suite} ${_kind} ${i})
          list(APPEND _items ${_name})
        endforeach()
      endif()
    endforeach()
  endif()
  set(${out} "${_items}" PARENT_SCOPE)
endfunction()

# Per-case, per-passage and consistency tests of one backend (name: in the test
# names; backend: the --backend argument, a name or a library path; optional
# 7th argument: the profile; optional 8th: a known-divergences file).
function(_touchstone_parity_tests backend backend_arg weights labels models slow_tags)
  set(_profile "")
  if(ARGC GREATER 6 AND NOT "${ARGV6}" STREQUAL "")
    set(_profile --profile ${ARGV6})
    set(labels "${labels};${ARGV6}")
  endif()
  if(ARGC GREATER 7 AND NOT "${ARGV7}" STREQUAL "")
    get_filename_component(_kd "${ARGV7}" ABSOLUTE)
    list(APPEND _profile --known-divergences ${_kd})
  endif()
  set(_a_MODELS ${models})
  set(_a_SLOW_TAGS ${slow_tags})
  set(_a_UNPARSED_ARGUMENTS ${labels})
  if(NOT _a_MODELS)
    set(_a_MODELS ${TOUCHSTONE_FIRST_MODEL})
  endif()
  foreach(_kind cases scoring)
    if(_kind STREQUAL "cases")
      set(_names ${TOUCHSTONE_DEFAULT_CASES})
    else()
      set(_names ${TOUCHSTONE_DEFAULT_SCORING})
    endif()
    foreach(c ${_names})
      set(_model ${_ts_model_of_${c}})
      if(NOT _model IN_LIST _a_MODELS)
        continue()
      endif()
      if(_kind STREQUAL "cases")
        set(_t parity.${backend}.${weights}.${c})
        set(_sel --case ${c})
      else()
        set(_t parity.${backend}.${weights}.scoring.${c})
        set(_sel --scoring ${c})
      endif()
      # long_context items (4,096+ tokens) are labelled so; those with a tag in
      # SLOW_TAGS also "slow" (left out of ci/test, run with `ctest -L slow`).
      set(_extra "")
      set(_cost 0)
      if("long_context" IN_LIST _ts_tags_of_${c})
        list(APPEND _extra long_context)
        set(_cost 300)  # started early by `ctest -j` (COST), not left to run alone at the end
      endif()
      foreach(_tag ${_a_SLOW_TAGS})
        if(_tag IN_LIST _ts_tags_of_${c})
          list(APPEND _extra slow)
          break()
        endif()
      endforeach()
      if(_ts_ci_items AND NOT c IN_LIST _ts_ci_items AND NOT slow IN_LIST _extra)
        list(APPEND _extra slow)
      endif()
      add_test(NAME ${_t}
        COMMAND ${TOUCHSTONE_CLI} parity --backend ${backend_arg} --weights ${weights} ${_profile} ${_sel}
                --threads 1 --manifest ${TOUCHSTONE_MANIFEST} --junit ${TOUCHSTONE_REPORT_DIR}/${_t}.xml)
      set_tests_properties(${_t} PROPERTIES
        LABELS "parity;${backend};${weights};${_model};${_a_UNPARSED_ARGUMENTS};${_extra}"
        ENVIRONMENT "${TOUCHSTONE_ONE_THREAD_ENV}" SKIP_RETURN_CODE 77 TIMEOUT 1200 COST ${_cost})
    endforeach()
  endforeach()
  # The golden-free consistency checks (touchstone/harness/consistency.h) on the first
  # model's first case, 24 tokens: prefill vs decode, chunked prefill, rewind +
  # replay, 1/2/3 threads, run to run.
  set(_t parity.${backend}.${weights}.consistency)
  add_test(NAME ${_t}
    COMMAND ${TOUCHSTONE_CLI} parity --backend ${backend_arg} --weights ${weights} ${_profile}
            --consistency-only --consistency-tokens 24 --manifest ${TOUCHSTONE_MANIFEST}
            --junit ${TOUCHSTONE_REPORT_DIR}/${_t}.xml)
  set_tests_properties(${_t} PROPERTIES
    LABELS "parity;consistency;${backend};${weights};${_a_UNPARSED_ARGUMENTS}"
    PROCESSORS 2 SKIP_RETURN_CODE 77 TIMEOUT 1200)
endfunction()

# touchstone_add_serving_tests(<backend> <weights> MODELS m... [PLAN quick|full]
#                              [PROFILE name] [KNOWN_DIVERGENCES file.json] [LABELS l...])
#
# The serving checks (touchstone/harness/serving.h, docs/serving-checks.md) on each
# model's first case: serving.<backend>.<weights>.<model> (PLAN full:
# serving.<backend>.<weights>.<model>.full). One backend thread, as the
# per-case tests. PROFILE: the tolerance profile (default: the weight path's).
# KNOWN_DIVERGENCES: reviewed entries whose item is a serving check's name.
# --profile P and --known-divergences FILE (absolute) into `out` for the ones given.
function(_touchstone_profile_options out profile known_divergences)
  set(_o "")
  if(profile)
    set(_o --profile ${profile})
  endif()
  if(known_divergences)
    get_filename_component(_kd "${known_divergences}" ABSOLUTE)
    list(APPEND _o --known-divergences ${_kd})
  endif()
  set(${out} ${_o} PARENT_SCOPE)
endfunction()

function(touchstone_add_serving_tests backend weights)
  cmake_parse_arguments(PARSE_ARGV 2 _s "" "PLAN;PROFILE;KNOWN_DIVERGENCES" "MODELS;LABELS")
  if(NOT _s_PLAN)
    set(_s_PLAN quick)
  endif()
  _touchstone_profile_options(_profile "${_s_PROFILE}" "${_s_KNOWN_DIVERGENCES}")
  foreach(m ${_s_MODELS})
    set(_t serving.${backend}.${weights}.${m})
    if(_s_PLAN STREQUAL "full")
      set(_t ${_t}.full)
    endif()
    add_test(NAME ${_t}
      COMMAND ${TOUCHSTONE_CLI} parity --backend ${backend} --weights ${weights} --model ${m}
              ${_profile} --serving-only --serving-plan ${_s_PLAN} --threads 1 --manifest ${TOUCHSTONE_MANIFEST}
              --junit ${TOUCHSTONE_REPORT_DIR}/${_t}.xml)
    set_tests_properties(${_t} PROPERTIES
      LABELS "parity;serving;${backend};${weights};${m};${_s_LABELS}"
      ENVIRONMENT "${TOUCHSTONE_ONE_THREAD_ENV}" SKIP_RETURN_CODE 77 TIMEOUT 1800)
  endforeach()
endfunction()

# touchstone_add_structured_tests(<backend> <weights> MODELS m... | CASES c...
#                                 [PROFILE name] [KNOWN_DIVERGENCES file.json] [LABELS l...])
#
# The structured-output checks (touchstone/harness/structured.h,
# docs/structured-output.md#checks) on one grammar case: each model's first
# (structured.<backend>.<weights>.<model>), or each of CASES
# (structured.<backend>.<weights>.<case>; e.g. a GBNF case for an engine whose
# own grammar sampler reads GBNF only). One backend thread.
function(touchstone_add_structured_tests backend weights)
  cmake_parse_arguments(PARSE_ARGV 2 _g "" "PROFILE;KNOWN_DIVERGENCES" "MODELS;CASES;LABELS")
  _touchstone_profile_options(_opts "${_g_PROFILE}" "${_g_KNOWN_DIVERGENCES}")
  foreach(_name ${_g_MODELS} ${_g_CASES})
    if(_name IN_LIST _g_MODELS)
      set(_select --model ${_name})
    else()
      set(_select --case ${_name})
    endif()
    set(_t structured.${backend}.${weights}.${_name})
    add_test(NAME ${_t}
      COMMAND ${TOUCHSTONE_CLI} parity --backend ${backend} --weights ${weights} ${_select}
              ${_opts} --structured-only --threads 1 --manifest ${TOUCHSTONE_MANIFEST}
              --junit ${TOUCHSTONE_REPORT_DIR}/${_t}.xml)
    set_tests_properties(${_t} PROPERTIES
      LABELS "parity;structured;${backend};${weights};${_g_LABELS}"
      ENVIRONMENT "${TOUCHSTONE_ONE_THREAD_ENV}" SKIP_RETURN_CODE 77 TIMEOUT 900)
  endforeach()
endfunction()

function(touchstone_add_unsupported_test backend weights model)
  set(_first "")
  foreach(c ${TOUCHSTONE_DEFAULT_CASES})
    if(_first STREQUAL "" AND _ts_model_of_${c} STREQUAL model)
      set(_first ${c})
    endif()
  endforeach()
  set(_t parity.${backend}.${weights}.${model}.unsupported)
  add_test(NAME ${_t}
    COMMAND sh -c "\"$0\" parity --backend ${backend} --weights ${weights} --case ${_first} --manifest ${TOUCHSTONE_MANIFEST} --json ${TOUCHSTONE_REPORT_DIR}/${_t}.json; rc=$?; echo \"exit status $rc (3 = UNSUPPORTED expected)\"; test $rc -eq 3"
            $<TARGET_FILE:${TOUCHSTONE_CLI}>)
  set_tests_properties(${_t} PROPERTIES
    LABELS "parity;${backend};${weights};${model};unsupported"
    PASS_REGULAR_EXPRESSION "UNSUPPORTED.*exit status 3 "
    TIMEOUT 300)
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

# The fault catalog (docs/metrics.md#fault-catalog-and-margins): one test
# fault.<backend>.<weights>.<fault> per "fault=EXPECT" argument, on one short
# case (narrative, 4 greedy steps) so each costs about a second. EXPECT is the
# --expect-step value: the step where the goldens must catch the fault, or the
# consistency check (CHECK@position) that must catch a consistency-only fault
# (then only the consistency checks run, on 8 tokens). EXPECT "pass": the run
# must PASS with the fault set (a quantized-only fault on full_precision).
# EXPECT "STEP/L:POINT" (POINT attn | ffn | resid) or "STEP/after" also requires
# the first divergent layer tap (--expect-layer; golden layer taps, ABI v4).
# MAX_STEPS N (optional, default 4): greedy steps of the golden and "pass" runs
# (static_graph: 1, so that only the prefill graphs are compiled).
# SLOW fault=EXPECT...: these entries are labelled slow as well (left out of
# ci/test, run by `ctest -L slow`), for backends where each fault test costs
# tens of seconds of CI.
function(touchstone_add_fault_tests backend weights)
  cmake_parse_arguments(PARSE_ARGV 2 _fa "" "MAX_STEPS" "SLOW")
  if(NOT _fa_MAX_STEPS)
    set(_fa_MAX_STEPS 4)
  endif()
  foreach(entry ${_fa_UNPARSED_ARGUMENTS} ${_fa_SLOW})
    set(_slow "")
    if(entry IN_LIST _fa_SLOW)
      set(_slow ";slow")
    endif()
    string(REPLACE "=" ";" _kv "${entry}")
    list(GET _kv 0 _fault)
    list(GET _kv 1 _expect)
    # STEP/LAYER:POINT also names the first divergent layer tap (--expect-layer).
    set(_layer "")
    if(_expect MATCHES "^([^/]+)/(.+)$")
      set(_expect ${CMAKE_MATCH_1})
      set(_layer --expect-layer ${CMAKE_MATCH_2})
    endif()
    set(_t fault.${backend}.${weights}.${_fault})
    set(_procs 1)
    set(_case narrative)
    if(_expect STREQUAL "pass")
      set(_mode --no-scoring --no-consistency --max-steps ${_fa_MAX_STEPS} --threads 1)
    elseif(_expect MATCHES "^consistency")
      set(_mode --consistency-only --consistency-tokens 8 --expect-fail --expect-step ${_expect})
      set(_procs 2)
    elseif(_expect MATCHES "^(structured\\.[a-z_]+)")
      # Only the named structured check runs, on SmolLM2's short GBNF case.
      set(_mode --structured-only --structured-check ${CMAKE_MATCH_1} --threads 1 --expect-fail
                --expect-step ${_expect})
      set(_case structured_answer)
    elseif(_expect MATCHES "^(serving\\.[a-z_]+)")
      # Only the named serving check runs (quick plan): the fault must fail it.
      set(_mode --serving-only --serving-plan quick --serving-check ${CMAKE_MATCH_1} --threads 1
                --expect-fail --expect-step ${_expect} ${_layer})
    else()
      set(_mode --no-scoring --no-consistency --max-steps ${_fa_MAX_STEPS} --threads 1 --expect-fail
                --expect-step ${_expect} ${_layer})
    endif()
    add_test(NAME ${_t}
      COMMAND ${TOUCHSTONE_CLI} parity --backend ${backend} --weights ${weights} --fault ${_fault}
              --case ${_case} ${_mode} --manifest ${TOUCHSTONE_MANIFEST})
    set_tests_properties(${_t} PROPERTIES LABELS "fault;${backend};${weights}${_slow}"
      ENVIRONMENT "${TOUCHSTONE_ONE_THREAD_ENV}" PROCESSORS ${_procs} SKIP_RETURN_CODE 77
      TIMEOUT 300)
  endforeach()
endfunction()

# touchstone_add_testmodel_tests(BACKEND WEIGHTS w... [LABELS l...] [ENVIRONMENT e...]
#                                [TIMEOUT s] [EXCLUDE model:weights...])
# The converted test models (tests/models/manifest.json: every family x weight
# type, and the synthetic stress model), one test per model and weight path:
#   testmodel.<backend>.<weights>.<model>   labels: parity;testmodel;<backend>;<weights>;LABELS
# `touchstone parity --no-consistency --threads 1` against the test models'
# goldens; exit 77 (no device) is a SKIP. EXCLUDE leaves out model:weights pairs
# registered elsewhere (e.g. the stress model with its own labels).
function(touchstone_add_testmodel_tests backend)
  cmake_parse_arguments(PARSE_ARGV 1 _tm "" "TIMEOUT" "WEIGHTS;LABELS;ENVIRONMENT;EXCLUDE")
  if(NOT _tm_TIMEOUT)
    set(_tm_TIMEOUT 300)
  endif()
  set(_manifest ${PROJECT_SOURCE_DIR}/tests/models/manifest.json)
  file(READ ${_manifest} _json)
  set_property(DIRECTORY APPEND PROPERTY CMAKE_CONFIGURE_DEPENDS ${_manifest})
  string(JSON _n LENGTH "${_json}" models)
  math(EXPR _last "${_n} - 1")
  foreach(i RANGE ${_last})
    string(JSON _m GET "${_json}" models ${i} name)
    foreach(_w ${_tm_WEIGHTS})
      if("${_m}:${_w}" IN_LIST _tm_EXCLUDE)
        continue()
      endif()
      set(_t testmodel.${backend}.${_w}.${_m})
      add_test(NAME ${_t}
        COMMAND touchstone parity --manifest ${_manifest} --model ${_m} --backend ${backend}
                --weights ${_w} --no-consistency --threads 1
                --junit ${TOUCHSTONE_REPORT_DIR}/${_t}.xml)
      set(_labels parity testmodel ${backend} ${_w} ${_tm_LABELS})
      set_tests_properties(${_t} PROPERTIES LABELS "${_labels}" SKIP_RETURN_CODE 77
                                            TIMEOUT ${_tm_TIMEOUT})
      if(_tm_ENVIRONMENT)
        set_tests_properties(${_t} PROPERTIES ENVIRONMENT "${_tm_ENVIRONMENT}")
      endif()
    endforeach()
  endforeach()
endfunction()
