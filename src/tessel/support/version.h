// This build's version: the release number and the build it came from (git describe), as
// `tessel --version` and Python's `tessel.__version__` both print them.
#pragma once

#include <string>

namespace tessel {

// The release number, e.g. "0.1.0" (CMakeLists.txt's project VERSION).
const char* version_number();
// Where the build came from: "git 54a83eb1f2-dirty", or $TESSEL_BUILD_ID at build time.
const char* build_name();
// "0.1.0+git.54a83eb1f2.dirty": the release and the build as a PEP 440 local version (Python tools
// parse it), the text of `tessel --version` and of `tessel.__version__`.
std::string version_text();

}  // namespace tessel
