"""Run hb_mapper's calibrated / quantized models with hmct's own executor (run by the toolchain's
Python 3.10, never imported by tuner: it imports the toolchain's packages).

    python hb_exec_script.py JOB.json

JOB.json: {"inputs": "in.npz", "output": "out.npz", "models": [path, ...], "samples": N,
"names": [input name, ...]}. in.npz holds ``s<i>_<k>`` (sample i, input k); out.npz gets
``m<j>_s<i>_o<k>`` (model j, sample i, output k) and ``names.json`` beside it lists each
model's output names. hmct must be imported as ``horizon_nn`` first (importing ``hmct.executor``
first aborts: "generic_type: type OpSchema is already registered").
"""

import json
import sys

import numpy as np


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
        session = ORTExecutor(load_model(path)).create_session()
        order = None
        for i in range(job["samples"]):
            feed = {name: data[f"s{i}_{k}"] for k, name in enumerate(names)}
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
