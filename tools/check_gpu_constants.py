"""Check the enum values and struct layouts that blas.py / dnn.py hard-code against the real headers.

Run on a machine with a C++ compiler (nvcc or g++) and the CUDA, cuBLAS and cuDNN headers::

    python tools/check_gpu_constants.py [--include DIR ...] [--keep]

Every module-level int of ``migraphx_ep.targets.gpu.blas`` and ``.dnn`` whose name is a C name
(``CUDA_R_*``, ``CUBLAS*``, ``CUDNN_*``) is printed by a generated C++ program compiled against the
headers, next to ctypes' size and field offsets of the structures ``libs.py`` declares. The script prints
every comparison and exits 1 listing each mismatch (2 when headers or a compiler are missing).

Headers are looked for in ``--include`` folders, ``$CUDA_HOME/include``, ``/usr/local/cuda/include`` and
the ``include`` folders of the ``nvidia`` pip packages (cuDNN's wheel ships its headers there).
"""

from __future__ import annotations

import argparse
import ctypes
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from migraphx_ep.targets.gpu import blas, dnn, libs  # noqa: E402

PREFIXES = ("CUDA_R_", "CUBLAS_", "CUBLASLT_", "CUDNN_")
HEADERS = ("cublasLt.h", "cudnn.h", "library_types.h", "cuda_runtime_api.h")
# (ctypes structure, C type name): sizes and the offset of every field are compared
STRUCTS = (
    (libs.MatmulAlgo, "cublasLtMatmulAlgo_t"),
    (libs.HeuristicResult, "cublasLtMatmulHeuristicResult_t"),
    (libs.FwdAlgoPerf, "cudnnConvolutionFwdAlgoPerf_t"),
)


def constants() -> dict[str, int]:
    """Every hard-coded C constant of blas.py and dnn.py (one value per name: they must agree)."""
    found: dict[str, int] = {}
    for mod in (blas, dnn):
        for name, value in vars(mod).items():
            if name.startswith(PREFIXES) and type(value) is int:
                if found.setdefault(name, value) != value:
                    raise SystemExit(f"{name} differs between blas.py and dnn.py")
    return found


def include_dirs(extra: list[str]) -> list[Path]:
    cands = [Path(p) for p in extra]
    for var in ("CUDA_HOME", "CUDA_PATH"):
        if os.environ.get(var):
            cands.append(Path(os.environ[var]) / "include")
    cands.append(Path("/usr/local/cuda/include"))
    for folder in libs.pip_folders():  # .../nvidia/<pkg>/lib -> .../nvidia/<pkg>/include
        cands.append(folder.parent / "include")
    try:
        import importlib.util

        spec = importlib.util.find_spec("nvidia")
        for root in spec.submodule_search_locations if spec else []:
            cands += sorted(Path(root).glob("*/include"))
    except (ImportError, ValueError):
        pass
    out: list[Path] = []
    for c in cands:
        if c.is_dir() and c.resolve() not in [o.resolve() for o in out]:
            out.append(c)
    return out


def source(names: list[str]) -> str:
    lines = [
        "#include <cstdio>",
        "#include <cstddef>",
        "#include <cublasLt.h>",
        "#include <cudnn.h>",
        "int main() {",
        '  std::printf("HEADER_CUBLAS %d.%d.%d\\n", CUBLAS_VER_MAJOR, CUBLAS_VER_MINOR, CUBLAS_VER_PATCH);',
        '  std::printf("HEADER_CUDNN %d.%d.%d\\n", CUDNN_MAJOR, CUDNN_MINOR, CUDNN_PATCHLEVEL);',
    ]
    lines += [f'  std::printf("{n} %lld\\n", (long long)({n}));' for n in names]
    for struct, cname in STRUCTS:
        lines.append(f'  std::printf("sizeof({cname}) %zu\\n", sizeof({cname}));')
        for field, _ in struct._fields_:
            lines.append(f'  std::printf("offsetof({cname}.{field}) %zu\\n", offsetof({cname}, {field}));')
    lines += ["  return 0;", "}"]
    return "\n".join(lines) + "\n"


def expected(names: dict[str, int]) -> dict[str, int]:
    want = dict(names)
    for struct, cname in STRUCTS:
        want[f"sizeof({cname})"] = ctypes.sizeof(struct)
        for field, _ in struct._fields_:
            want[f"offsetof({cname}.{field})"] = getattr(struct, field).offset
    return want


def compiler() -> list[str] | None:
    home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH") or "/usr/local/cuda"
    nvcc = shutil.which("nvcc") or (
        str(Path(home) / "bin/nvcc") if (Path(home) / "bin/nvcc").is_file() else None
    )
    if nvcc:
        return [nvcc, "-x", "c++"]
    cxx = shutil.which("g++") or shutil.which("c++") or shutil.which("clang++")
    return [cxx, "-x", "c++"] if cxx else None


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--include", action="append", default=[], help="extra header folder (repeatable)")
    ap.add_argument("--keep", action="store_true", help="keep the generated program's folder")
    args = ap.parse_args()
    names = constants()
    dirs = include_dirs(args.include)
    missing = [h for h in HEADERS if not any((d / h).is_file() for d in dirs)]
    if missing:
        print(f"headers not found: {missing}; searched {[str(d) for d in dirs]} (use --include DIR)")
        return 2
    cc = compiler()
    if cc is None:
        print("no C++ compiler (nvcc, g++, c++, clang++) found")
        return 2
    work = Path(tempfile.mkdtemp(prefix="migraphx_ep_constants_"))
    try:
        (work / "constants.cpp").write_text(source(sorted(names)))
        cmd = [*cc, str(work / "constants.cpp"), "-o", str(work / "constants"), *(f"-I{d}" for d in dirs)]
        built = subprocess.run(cmd, capture_output=True, text=True)
        if built.returncode != 0:
            print(f"compile failed: {' '.join(cmd)}\n{built.stdout}{built.stderr}")
            return 2
        ran = subprocess.run([str(work / "constants")], capture_output=True, text=True, check=True)
    finally:
        if args.keep:
            print(f"kept {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)
    got = dict(line.rsplit(" ", 1) for line in ran.stdout.splitlines())
    versions = f"cuBLAS {got.pop('HEADER_CUBLAS')}, cuDNN {got.pop('HEADER_CUDNN')}"
    print(f"headers: {versions} from {[str(d) for d in dirs]}")
    bad = []
    for key, value in expected(names).items():
        ok = int(got[key]) == value
        print(f"{'ok ' if ok else 'BAD'} {key}: python {value}, header {got[key]}")
        if not ok:
            bad.append(f"{key}: python {value} != header {got[key]}")
    print(f"{len(bad)} mismatches" + "".join(f"\n  {b}" for b in bad))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
