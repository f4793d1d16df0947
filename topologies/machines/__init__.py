"""Multi-GPU machines as presets, with the figures of their datasheets.

NVIDIA systems (:mod:`.nvidia`), cloud instances (:mod:`.cloud`) and PCIe servers
(:mod:`.pcie`); shared figures and the NVSwitch box builder in :mod:`.parts`. Every preset
builds with no argument, alone or as ``cluster:NAMExN``; GPUs carry ``model`` and, when the
model is known, ``sm`` (compute capability x 10) for the NCCL model.
"""
from .cloud import a3_mega, bm_gpu_h100, nd_h100_v5, p4d, p4de, p5
from .nvidia import DGX1_NVLINKS, dgx1_v100, dgx_a100, dgx_h100, hgx_b200, hgx_h200
from .pcie import p2_16xlarge, pcie_box, rtx4090_box

#: preset name -> builder (no required argument).
PRESETS = {
    "dgx1_v100": dgx1_v100,
    "dgx_a100": dgx_a100,
    "dgx_h100": dgx_h100,
    "hgx_h200": hgx_h200,
    "hgx_b200": hgx_b200,
    "pcie_box": pcie_box,
    "rtx4090_box": rtx4090_box,
    "p2_16xlarge": p2_16xlarge,
    "p4d": p4d,
    "p4de": p4de,
    "p5": p5,
    "a3_mega": a3_mega,
    "bm_gpu_h100": bm_gpu_h100,
    "nd_h100_v5": nd_h100_v5,
}

__all__ = ["PRESETS", "DGX1_NVLINKS", *PRESETS]
