// The Touchstone build: project version and source revision, fixed when CMake
// configured the build (parity/run/CMakeLists.txt). Never a git call at run time.
#pragma once

namespace touchstone {

const char* touchstone_version();  // "0.1.0" (project(VERSION))
const char*
touchstone_revision();  // `git describe --always --dirty` of the source tree, or "unknown"

}  // namespace touchstone
