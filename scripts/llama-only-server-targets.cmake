# Injected via -DCMAKE_PROJECT_llama.cpp_INCLUDE=<this file>.
# After the top-level CMakeLists is fully processed, mark every target
# except the ones we want as EXCLUDE_FROM_ALL, so `cmake --build .` (target
# "all") only builds llama-server / llama-bench / llama-batched-bench and
# whatever they depend on (dependencies are still built).
if(NOT DEFINED SPECTUNE_KEEP_TARGETS)
  set(SPECTUNE_KEEP_TARGETS llama-server llama-bench llama-batched-bench)
endif()
function(_spectune_collect dir out)
  get_property(_t DIRECTORY "${dir}" PROPERTY BUILDSYSTEM_TARGETS)
  get_property(_s DIRECTORY "${dir}" PROPERTY SUBDIRECTORIES)
  foreach(_d IN LISTS _s)
    _spectune_collect("${_d}" _sub)
    list(APPEND _t ${_sub})
  endforeach()
  set(${out} ${_t} PARENT_SCOPE)
endfunction()
function(_spectune_prune)
  _spectune_collect("${CMAKE_SOURCE_DIR}" _all)
  foreach(_t IN LISTS _all)
    get_target_property(_type ${_t} TYPE)
    if(_type MATCHES "^(EXECUTABLE|SHARED_LIBRARY|STATIC_LIBRARY|MODULE_LIBRARY|OBJECT_LIBRARY|UTILITY)$"
       AND NOT _t IN_LIST SPECTUNE_KEEP_TARGETS)
      set_property(TARGET ${_t} PROPERTY EXCLUDE_FROM_ALL TRUE)
      list(APPEND _ex ${_t})
    endif()
  endforeach()
  list(LENGTH _ex _n)
  message(STATUS "spectune: ${_n} targets excluded from ALL; keeping ${SPECTUNE_KEEP_TARGETS}")
endfunction()
cmake_language(DEFER DIRECTORY "${CMAKE_SOURCE_DIR}" CALL _spectune_prune)
