// Starting CPython inside a C/C++ host (see python_host.h).
//
// Linking: a pybind11 extension module normally leaves every Python symbol undefined, to be resolved
// from the interpreter that imports it. ORT dlopens plugins with RTLD_NOW, so in a host without Python
// that load would fail on the first undefined *data* symbol (PyExc_TypeError, _Py_NoneStruct, ...)
// before any code of ours could run: resolving the C API with dlsym after a dlopen of libpython cannot
// help a library that never loads. So CMakeLists.txt links libpython (DT_NEEDED, --no-as-needed, with
// a RUNPATH to its folder) where the interpreter itself runs on that shared library: inside Python the
// dependency names the library already loaded and nothing changes; in a C/C++ host the loader brings it
// in, and ensure_python() starts it. Against a statically linked interpreter nothing is linked by
// default (that would load a second, idle libpython into every Python process), and such builds serve
// Python processes only (MIGRAPHX_EP_EMBED_PYTHON in CMakeLists.txt).
#include "python_host.h"

#include <dlfcn.h>
#include <pybind11/pybind11.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <climits>
#include <cstdlib>
#include <mutex>
#include <stdexcept>

#ifndef MIGRAPHX_EP_PYTHON_HOME  // set by CMake from the interpreter the package is built for
#define MIGRAPHX_EP_PYTHON_HOME ""
#define MIGRAPHX_EP_PYTHON_EXECUTABLE ""
#define MIGRAPHX_EP_PYTHON_LIBRARY ""
#endif

namespace py = pybind11;

namespace mgx {
namespace {

std::mutex g_mutex;
std::atomic<bool> g_embedded{false};
std::string g_start_error;  // a failed start is not retried: CPython cannot start twice in a process

bool exists(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0;
}

std::string parent(const std::string& path) {
  const auto i = path.find_last_of('/');
  return i == std::string::npos ? "." : i == 0 ? "/" : path.substr(0, i);
}

// site-packages/migraphx_ep/_C.so -> site-packages: the folder whose packages (ours, numpy, onnx,
// msgpack, ml_dtypes) the interpreter must import. realpath: a host may load us through a symlink.
std::string own_site_dir() {
  Dl_info info{};
  if (::dladdr(reinterpret_cast<const void*>(&own_site_dir), &info) == 0 || info.dli_fname == nullptr) {
    throw std::runtime_error("cannot find the path of the migraphx_ep library (dladdr failed)");
  }
  char resolved[PATH_MAX];
  if (::realpath(info.dli_fname, resolved) == nullptr) {
    throw std::runtime_error(std::string("cannot resolve the library path ") + info.dli_fname);
  }
  return parent(parent(resolved));
}

// A venv's site-packages is <venv>/lib/pythonX.Y/site-packages, with <venv>/pyvenv.cfg: start as that
// venv's python, so `site` sets sys.prefix and its site-packages (and include-system-site-packages) as
// for `<venv>/bin/python -I`. Otherwise the base interpreter recorded at build time.
std::string interpreter_for(const std::string& site_dir) {
  const std::string venv = parent(parent(parent(site_dir)));
  if (exists(venv + "/pyvenv.cfg")) {
    for (const char* name : {"/bin/python", "/bin/python3"}) {
      if (exists(venv + name)) return venv + name;
    }
  }
  return MIGRAPHX_EP_PYTHON_EXECUTABLE;
}

void check(PyStatus status, const std::string& what) {
  if (PyStatus_Exception(status)) {
    throw std::runtime_error(what + " failed: " + (status.err_msg != nullptr ? status.err_msg : "error") +
                             (status.func != nullptr ? std::string(" (in ") + status.func + ")" : ""));
  }
}

struct ConfigGuard {
  PyConfig* config;
  ~ConfigGuard() { PyConfig_Clear(config); }
};

// ORT dlopens us RTLD_LOCAL, so the libpython we brought in is visible to us alone; extension modules
// (numpy, ml_dtypes, ...) resolve Python symbols from the global scope, as from a python executable.
// dlopen with RTLD_NOLOAD only promotes the copy already loaded: it never loads another.
void make_libpython_global() {
  Dl_info info{};
  if (::dladdr(reinterpret_cast<const void*>(&Py_IsInitialized), &info) == 0 || info.dli_fname == nullptr) {
    throw std::runtime_error("cannot find the loaded libpython (dladdr of Py_IsInitialized failed)");
  }
  if (::dlopen(info.dli_fname, RTLD_NOW | RTLD_NOLOAD | RTLD_GLOBAL) == nullptr) {
    const char* err = ::dlerror();
    throw std::runtime_error(std::string("cannot make ") + info.dli_fname + " global: " + (err ? err : "?"));
  }
  // The handle is kept on purpose: the library must stay loaded (and global) for the process.
}

// Py_InitializeFromConfig; on return this thread holds the GIL.
void start_interpreter(const std::string& site_dir) {
  const std::string home = MIGRAPHX_EP_PYTHON_HOME;
  const std::string prefix = home.substr(0, home.find(':'));
  if (home.empty() || !exists(prefix)) {
    throw std::runtime_error("Python not found: the interpreter migraphx_ep was built with (home '" + home +
                             "', libpython '" MIGRAPHX_EP_PYTHON_LIBRARY "') is no longer there; rebuild "
                             "migraphx_ep against an installed Python");
  }
  make_libpython_global();
  PyConfig config;
  // Isolated: the host's environment (PYTHONPATH, PYTHONHOME, ...) and user site cannot change what
  // runs; no signal handlers (SIGINT stays the host's); no locale changes in the host process.
  PyConfig_InitIsolatedConfig(&config);
  ConfigGuard guard{&config};
  config.install_signal_handlers = 0;
  check(PyConfig_SetBytesString(&config, &config.home, home.c_str()), "PyConfig.home = " + home);
  const std::string executable = interpreter_for(site_dir);
  check(PyConfig_SetBytesString(&config, &config.executable, executable.c_str()),
        "PyConfig.executable = " + executable);
  check(Py_InitializeFromConfig(&config), "starting Python (home " + home + ", executable " + executable + ")");
}

// With the GIL held. Adds site_dir (and runs its .pth files: an editable install's finder lives there)
// unless `site` already did, then imports what Compute will need.
void import_package(const std::string& site_dir) {
  try {
    py::list path = py::module_::import("sys").attr("path");
    if (!path.contains(site_dir)) py::module_::import("site").attr("addsitedir")(site_dir);
    py::module_::import("migraphx_ep.ep.bridge");
  } catch (py::error_already_set& e) {
    throw std::runtime_error("the embedded Python cannot import migraphx_ep (site-packages " + site_dir +
                             "): " + e.what());
  }
}

}  // namespace

void ensure_python() {
  std::lock_guard<std::mutex> lock(g_mutex);
  if (!g_start_error.empty()) throw std::runtime_error(g_start_error);
  if (!g_embedded && Py_IsInitialized()) return;  // a Python process: it imports us, not the reverse
  const std::string site_dir = own_site_dir();
  if (g_embedded) {  // registered again: the interpreter is ours and running
    py::gil_scoped_acquire gil;
    import_package(site_dir);
    return;
  }
  try {
    start_interpreter(site_dir);
  } catch (const std::exception& e) {
    g_start_error = e.what();
    throw;
  }
  g_embedded = true;
  // The interpreter is never finalized, not even at the last ReleaseEpFactory: ORT may still release
  // sessions (and so Python objects) after that, at its own exit, and extension modules such as numpy
  // cannot be initialized again if the host registers the library anew. It lives until process exit.
  struct ReleaseGil {
    ~ReleaseGil() { PyEval_SaveThread(); }  // let ORT's threads take it (PyGILState_Ensure)
  } release;
  import_package(site_dir);
}

bool embedded_python() noexcept { return g_embedded; }

PythonBuildInfo python_build_info() {
  return {MIGRAPHX_EP_PYTHON_HOME, MIGRAPHX_EP_PYTHON_EXECUTABLE, MIGRAPHX_EP_PYTHON_LIBRARY};
}

}  // namespace mgx
