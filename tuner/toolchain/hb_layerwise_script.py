"""Run ``hb_mapper makertbin`` with hmct's layerwise search switched on (run by the toolchain's
Python 3.10, never imported by tuner: it imports the toolchain's packages).

    python hb_layerwise_script.py '{"mix_topk": 5, "use_int16": true}' makertbin --config X.yaml --model-type onnx

hmct 1.1.0 has its own sensitivity-ranked int16 promotion (``layerwise_search``: the top-K
calibration nodes by single-node cosine become int16, each node taking the best of max,
max-percentile 0.99995 and kl; ``hmct/quantizer/calibrater/activation/mix_calibrater.py``), which
its Python API takes as calibration parameters (``mix_topk``, ``use_int16``, ``mix_metric``:
``hmct/common/quant/update_quant_config.py``) but hb_mapper's YAML cannot express: hb_mapper builds
the calibration parameters from the YAML alone (``MakertbinRunner._get_build_calibration_params``
in ``horizon_tc_ui/hb_mapper_makertbin.py``). This script adds the JSON's keys to what that method
returns and then runs hb_mapper's own command line unchanged, so everything else (the YAML's
parsing, the calibration data, the compile, the files written) is hb_mapper's.
"""

import json
import sys


def main():
    extra = json.loads(sys.argv.pop(1))
    import horizon_nn  # noqa: F401  (hmct must be imported under this name first)
    from horizon_tc_ui import hb_mapper_makertbin as makertbin
    from horizon_tc_ui.hb_mapper import main as hb_mapper_main

    plain = makertbin.MakertbinRunner._get_build_calibration_params

    def with_extra(self):
        params = plain(self)
        params.update(extra)
        return params

    makertbin.MakertbinRunner._get_build_calibration_params = with_extra
    sys.argv[0] = "hb_mapper"
    return hb_mapper_main()


if __name__ == "__main__":
    sys.exit(main())
