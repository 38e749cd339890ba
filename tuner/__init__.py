"""tuner: search the hb_mapper makertbin YAML that keeps a float ONNX model accurate on a Horizon BPU."""

__version__ = "0.1.0"
