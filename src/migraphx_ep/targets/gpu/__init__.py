"""The gpu target: IR -> fused steps -> NVRTC kernels, cuBLASLt GEMMs and cuDNN convolutions, replayed as
one CUDA graph per compiled program (MIGraphX's ``gpu`` target, on NVIDIA through ``cuda.bindings``).

``gpu_available()`` says whether it can run here; ``GpuTarget(device_id, allow_tf32)`` compiles.
"""

from __future__ import annotations

import logging
import os
from typing import TYPE_CHECKING

import msgpack

from ...ir.program import CompileOptions, Program
from ...passes import Pass, run_passes
from ...timing import stage

if TYPE_CHECKING:
    from .cuda import Device
    from .weights import DeviceWeights

log = logging.getLogger("migraphx_ep.gpu")


class GpuUnavailable(RuntimeError):
    """No usable GPU target here (no driver, no GPU, no NVRTC, or a device_id that does not exist)."""


def gpu_available(device_id: int = 0) -> str | None:
    """None when the gpu target can compile and run on ``device_id``; else the reason it cannot."""
    if os.environ.get("MIGRAPHX_EP_DISABLE_GPU", "0") not in ("", "0"):
        return "disabled by MIGRAPHX_EP_DISABLE_GPU"
    from .backend import BINDINGS

    if not BINDINGS:
        return "the CUDA Python bindings (package cuda-bindings) are not installed"
    from .cuda import gpu_available as device_ok
    from .nvrtc import nvrtc_available

    return device_ok(device_id) or nvrtc_available()


def _libraries() -> tuple[bool, bool]:
    """Whether cuBLASLt and cuDNN load; without them GEMM and convolution use generated kernels."""
    from .libs import LibraryUnavailable, cublaslt, cudnn

    use = []
    for name, load in (("cuBLASLt", cublaslt), ("cuDNN", cudnn)):
        if os.environ.get(f"MIGRAPHX_EP_DISABLE_{name.upper()}", "0") not in ("", "0"):
            use.append(False)
            continue
        try:
            load()
            use.append(True)
        except LibraryUnavailable as e:
            log.info("gpu target: %s not found (%s); using generated kernels instead", name, e)
            use.append(False)
    return use[0], use[1]


class GpuTarget:
    name = "gpu"

    def __init__(self, device_id: int = 0, allow_tf32: bool = True) -> None:
        reason = gpu_available(device_id)
        if reason is not None:
            raise GpuUnavailable(reason)
        self.device_id = device_id
        self.allow_tf32 = allow_tf32

    def get_passes(self, options: CompileOptions) -> list[Pass]:
        from .decompose import gpu_pipeline

        with stage("device setup"):  # loads the libraries: their epilogues are fused only where they load
            use_blas, use_dnn = _libraries()
        return gpu_pipeline(options.weights, use_blas, use_dnn)

    def _device(self):
        from .cuda import Device

        return Device.get(self.device_id)

    def compile(self, prog: Program, options: CompileOptions, artifacts: dict | None = None):
        from .executable import GpuExecutable
        from .lowering import lower
        from .runtime_dims import padded_inputs

        if artifacts is None and not options.optimised:
            from .fuse import adopt_submodules

            for m in list(prog.modules.values()):
                run_passes(m, self.get_passes(options))
            adopt_submodules(prog)  # fused ops' bodies join the program (saving, cloning find them)
        with stage("device setup"):  # the first compile in a process creates the context, loads libraries
            device = self._device()
            use_blas, use_dnn = _libraries()
        main = prog.get_main_module()
        with stage("lowering"):
            lowered = lower(main, use_blas, use_dnn, weights=options.weights)
        return GpuExecutable(
            lowered,
            device,
            allow_tf32=self.allow_tf32,
            artifacts=artifacts,
            param_shapes=main.get_parameter_shapes(),
            weights=self._device_weights(options, device),
            padded=padded_inputs(main),
        )

    @staticmethod
    def _device_weights(options: CompileOptions, device: Device) -> DeviceWeights | None:
        """The device copies of weights the programs of one subgraph share (``weights.py``), if any."""
        from .weights import DeviceWeights

        if options.weights is None:
            return None
        return options.weights.shared(("gpu weights", device.id), lambda: DeviceWeights(device_id=device.id))

    def load_executable(self, prog: Program, blob: bytes | None):
        """Rebuild the executable of a stored (already optimised) program from its kernel images and
        library plans: nothing is compiled or searched again when the GPU's architecture matches."""
        art: dict = {}
        if blob:
            try:
                art = msgpack.unpackb(blob, raw=False)
            except (ValueError, msgpack.ExtraData) as e:
                raise GpuUnavailable(f"corrupt gpu section in compiled program: {e}") from None
        self.allow_tf32 = bool(art.get("allow_tf32", self.allow_tf32))
        if art.get("arch") != self._device().arch:
            art = {"plans": {}}  # another GPU generation: recompile kernels and re-plan
        return self.compile(prog, CompileOptions(), artifacts=art)

    def __repr__(self) -> str:
        return f"target('gpu', device_id={self.device_id})"


__all__ = ["GpuTarget", "GpuUnavailable", "gpu_available"]
