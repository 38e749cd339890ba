"""onnxruntime as every part of tuner runs it: sessions configured for simulation
(``session``) and the fused fake-quantization kernel (``fakequant``, built from ``fakequant.c``)."""
