"""Run hb_mapper's calibrated / quantized models with hmct's own executor (run by the toolchain's
Python 3.10, never imported by tuner: it imports the toolchain's packages).

    python hb_exec_script.py JOB.json

JOB.json: {"inputs": "in.npz", "output": "out.npz", "models": [path, ...], "samples": N,
"names": [input name, ...]}. in.npz holds ``s<i>_<k>`` (sample i, input k); out.npz gets
``m<j>_s<i>_o<k>`` (model j, sample i, output k) and ``names.json`` beside it lists each
model's output names. hmct must be imported as ``horizon_nn`` first (importing ``hmct.executor``
first aborts: "generic_type: type OpSchema is already registered").

A camera input (``input_type_rt`` nv12 / yuv444 / rgb / bgr / gray) is given as the calibrated model
takes it: float32 in the training layout, the runtime colour values minus 128. The quantized model
declares that input int8 and, for some types, NHWC (docs/hb_rules/input.md): :func:`fit` rounds and
transposes the sample to the declared type and shape.
"""

import json
import sys

import numpy as np

INT_TYPES = {2: np.uint8, 3: np.int8, 5: np.int16}   # onnx elem types of integer model inputs


def fit(x, elem_type, dims):
    """``x`` (float32, training layout) as the model input declared (elem_type, dims) takes it."""
    if len(dims) == 4 and x.ndim == 4 and tuple(x.shape) != tuple(dims) and \
            tuple(x.shape[i] for i in (0, 2, 3, 1)) == tuple(dims):
        x = np.ascontiguousarray(x.transpose(0, 2, 3, 1))
    dtype = INT_TYPES.get(elem_type)
    if dtype is not None:
        info = np.iinfo(dtype)
        x = np.clip(np.rint(x), info.min, info.max).astype(dtype)
    return x


def main(job_path):
    with open(job_path) as f:
        job = json.load(f)
    import horizon_nn  # noqa: F401  (registers the Horizon ops)
    from horizon_nn.executor import ORTExecutor
    from horizon_nn.ir import load_model

    data = np.load(job["inputs"])
    names = job["names"]
    out = {}
    out_names = []
    for j, path in enumerate(job["models"]):
        model = load_model(path)
        declared = {}
        for vi in model.proto.graph.input:
            t = vi.type.tensor_type
            declared[vi.name] = (t.elem_type, [d.dim_value for d in t.shape.dim])
        session = ORTExecutor(model).create_session()
        order = None
        for i in range(job["samples"]):
            feed = {name: fit(data[f"s{i}_{k}"], *declared.get(name, (1, []))) for k, name in enumerate(names)}
            res = session.forward(feed)
            if order is None:
                order = list(res.keys())
                out_names.append(order)
            for k, name in enumerate(order):
                out[f"m{j}_s{i}_o{k}"] = np.asarray(res[name])
        print(f"model {j + 1}/{len(job['models'])} done", flush=True)
    np.savez(job["output"], **out)
    with open(job["output"] + ".names.json", "w") as f:
        json.dump(out_names, f)


if __name__ == "__main__":
    main(sys.argv[1])
