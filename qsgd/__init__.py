"""QSGD gradient quantization and encoding in PyTorch (Alistarh et al., NeurIPS 2017)."""
__all__: list[str] = []
