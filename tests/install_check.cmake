# The installed package, as an application sees it (CTest: install_check).
#
#   cmake -DBUILD_DIR=<build> -DWORK=<scratch dir> -DLIBDIR=lib -DLIB_TYPE=STATIC_LIBRARY
#         -DSOURCE=examples/forward.c -DCONSUMER=examples/consumer -DGENERATOR=<gen>
#         -DC_COMPILER=cc -DPKG_CONFIG=pkg-config [-DCONFIG=Release] [-DEXTRA_FLAGS="-fsanitize=..."]
#         -P install_check.cmake
#
# EXTRA_FLAGS: compile and link flags both consumers add (a sanitized build's
# static library needs the sanitizer runtime linked into the program).
#
# 1. cmake --install <build> --prefix <scratch>/prefix
# 2. CMake: configures examples/consumer (find_package(flashcl CONFIG REQUIRED))
#    with CMAKE_PREFIX_PATH=<prefix>, checks that the package came from <prefix>,
#    builds forward.c and runs it;
# 3. pkg-config: cc forward.c $(pkg-config --cflags --libs [--static] flashcl) -lm
#    with PKG_CONFIG_PATH=<prefix>/<libdir>/pkgconfig (--static for libflashcl.a),
#    checks that the flags name <prefix>, and runs the program.
# Everything runs without a terminal; a missing pkg-config is a failure
# (scripts/bootstrap.sh installs it).
cmake_minimum_required(VERSION 3.16)
foreach(var BUILD_DIR WORK LIBDIR LIB_TYPE SOURCE CONSUMER GENERATOR C_COMPILER)
  if(NOT DEFINED ${var} OR "${${var}}" STREQUAL "")
    message(FATAL_ERROR "install_check.cmake: -D${var}=... is required")
  endif()
endforeach()

set(prefix "${WORK}/prefix")
file(REMOVE_RECURSE "${WORK}")
file(MAKE_DIRECTORY "${WORK}")

# run(<what> COMMAND ...): runs a command, stops the check with its output if it fails.
function(run what)
  execute_process(${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "install check: ${what} failed (${rc}):\n${out}")
  endif()
  string(STRIP "${out}" out)
  set(run_output "${out}" PARENT_SCOPE)
endfunction()

# 1. Install.
set(config_args "")
if(CONFIG)
  set(config_args --config "${CONFIG}")
endif()
run("cmake --install" COMMAND "${CMAKE_COMMAND}" --install "${BUILD_DIR}" --prefix "${prefix}" ${config_args})
message(STATUS "installed into ${prefix} (${LIB_TYPE})")

# A shared libflashcl is found at run time through LD_LIBRARY_PATH (the CMake
# build has an rpath; the pkg-config one has none).
set(libpath "${prefix}/${LIBDIR}")
if(DEFINED ENV{LD_LIBRARY_PATH} AND NOT "$ENV{LD_LIBRARY_PATH}" STREQUAL "")
  string(APPEND libpath ":$ENV{LD_LIBRARY_PATH}")
endif()

# 2. CMake package. The package registry is off so that only the prefix can supply it.
set(cbuild "${WORK}/cmake-build")
set(build_type_args "")
if(CONFIG)
  set(build_type_args "-DCMAKE_BUILD_TYPE=${CONFIG}")
endif()
run("configuring examples/consumer"
    COMMAND "${CMAKE_COMMAND}" -S "${CONSUMER}" -B "${cbuild}" -G "${GENERATOR}"
            "-DCMAKE_C_COMPILER=${C_COMPILER}" "-DCMAKE_PREFIX_PATH=${prefix}"
            -DCMAKE_FIND_USE_PACKAGE_REGISTRY=OFF "-DFLASHCL_EXAMPLE_SOURCE=${SOURCE}" ${build_type_args}
            "-DCMAKE_C_FLAGS=${EXTRA_FLAGS}" "-DCMAKE_EXE_LINKER_FLAGS=${EXTRA_FLAGS}")
file(STRINGS "${cbuild}/CMakeCache.txt" dir_line REGEX "^flashcl_DIR:")
string(REGEX REPLACE "^flashcl_DIR:[A-Z]*=" "" flashcl_dir "${dir_line}")
string(FIND "${flashcl_dir}" "${prefix}/" at)
if(NOT at EQUAL 0)
  message(FATAL_ERROR "install check: find_package(flashcl) found ${flashcl_dir}, not the package in ${prefix}")
endif()
run("building examples/consumer" COMMAND "${CMAKE_COMMAND}" --build "${cbuild}" ${config_args})
set(exe "${cbuild}/forward")
if(CONFIG AND NOT EXISTS "${exe}" AND EXISTS "${cbuild}/${CONFIG}/forward")
  set(exe "${cbuild}/${CONFIG}/forward") # multi-config generators
endif()
run("running forward (CMake package)" COMMAND "${CMAKE_COMMAND}" -E env "LD_LIBRARY_PATH=${libpath}" "${exe}")
message(STATUS "CMake package (${flashcl_dir}): ${run_output}")

# 3. pkg-config.
if(NOT PKG_CONFIG OR NOT EXISTS "${PKG_CONFIG}")
  message(FATAL_ERROR "install check: pkg-config not found: install it (scripts/bootstrap.sh does: "
                      "apt-get install pkg-config) and configure again")
endif()
set(pc_path "${prefix}/${LIBDIR}/pkgconfig")
if(DEFINED ENV{PKG_CONFIG_PATH} AND NOT "$ENV{PKG_CONFIG_PATH}" STREQUAL "")
  string(APPEND pc_path ":$ENV{PKG_CONFIG_PATH}")
endif()
set(static_arg "")
if(LIB_TYPE STREQUAL "STATIC_LIBRARY")
  set(static_arg --static)
endif()
run("pkg-config ${static_arg} flashcl"
    COMMAND "${CMAKE_COMMAND}" -E env "PKG_CONFIG_PATH=${pc_path}" "${PKG_CONFIG}" --cflags --libs ${static_arg} flashcl)
string(STRIP "${run_output}" pc_flags)
string(FIND "${pc_flags}" "-I${prefix}/" at)
if(at LESS 0)
  message(FATAL_ERROR "install check: pkg-config's flags do not name the prefix ${prefix}: ${pc_flags}")
endif()
separate_arguments(pc_args UNIX_COMMAND "${pc_flags}")
set(pexe "${WORK}/forward-pkg-config")
separate_arguments(extra_args UNIX_COMMAND "${EXTRA_FLAGS}")
run("cc forward.c $(pkg-config ...)" COMMAND "${C_COMPILER}" ${extra_args} "${SOURCE}" ${pc_args} -lm -o "${pexe}")
run("running forward (pkg-config)" COMMAND "${CMAKE_COMMAND}" -E env "LD_LIBRARY_PATH=${libpath}" "${pexe}")
message(STATUS "pkg-config (${pc_flags}): ${run_output}")
