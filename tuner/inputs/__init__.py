"""Load and validate what the user gives: the float ONNX, the hb_mapper YAML, the data."""
