// Python inside a host that has none: a C/C++ program that registers this library with ORT's plugin
// route (RegisterExecutionProviderLibrary) runs the EP's Python core in an interpreter we start.
#pragma once

#include <string>

namespace mgx {

// Called by CreateEpFactories. In a Python process (Py_IsInitialized), nothing. Otherwise, once per
// process: starts the interpreter the package was built for, puts the site-packages folder this library
// sits in on sys.path, imports migraphx_ep's bridge (so a broken environment fails here, by name, not at
// the first session), and releases the GIL for ORT's threads. Later calls re-check the import.
// Throws std::runtime_error naming the problem (Python not found, package or dependency not importable).
// The interpreter is never finalized: see python_host.cpp.
void ensure_python();

// True when ensure_python started the interpreter (the process had no Python of its own).
bool embedded_python() noexcept;

// Where the embedded interpreter comes from (recorded at build time) and where this library is.
struct PythonBuildInfo {
  std::string home;        // PyConfig.home: sys.base_prefix[:sys.base_exec_prefix]
  std::string executable;  // sys._base_executable (a venv's own python is preferred when found)
  std::string library;     // the libpython this library is linked against ("" when not linked)
};
PythonBuildInfo python_build_info();

}  // namespace mgx
