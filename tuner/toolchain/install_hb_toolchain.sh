#!/usr/bin/env bash
# Build the Python 3.10 venv with the REAL RDK X5 toolchain from PyPI
# (hb_mapper 1.24.3 / hmct = horizon_nn 1.1.0 / hbdk 3.49.15); 'tuner toolchain install' runs it.
# The vendor wheels are proprietary ("confidential" headers): install them into their own venv;
# nothing of them goes into the project (no copy, no vendoring, no excerpt).
#
#   bash install_hb_toolchain.sh [VENV_DIR]   (default $TUNER_HB_TOOLCHAIN, else
#                                              ${TUNER_CACHE_DIR:-~/.cache/tuner}/hb-toolchain-1.24.3)
#
# Needs CPython 3.10 (the toolchain does not import on 3.11).  This workplace's image has
# ~/.pyenv/versions/3.10.13; elsewhere set PY310=/path/to/python3.10.  About 3 GB download
# (torch 2.2.2 is the CUDA build from PyPI with its nvidia-* wheels; it runs on the CPU) and
# ~5 minutes.  Check: $VENV/bin/hb_mapper --version  ->  hb_mapper, version 1.24.3
set -euo pipefail
VENV=${1:-${TUNER_HB_TOOLCHAIN:-${TUNER_CACHE_DIR:-$HOME/.cache/tuner}/hb-toolchain-1.24.3}}
PY310=${PY310:-}
if [ -z "$PY310" ]; then
  for c in "$HOME/.pyenv/versions/3.10.13/bin/python3" "$(command -v python3.10 || true)"; do
    if [ -n "$c" ] && [ -x "$c" ]; then PY310=$c; break; fi
  done
fi
if [ -z "$PY310" ] || ! "$PY310" -c 'import sys; assert sys.version_info[:2] == (3, 10)' 2>/dev/null; then
  echo "no CPython 3.10 found: set PY310=/path/to/python3.10" >&2
  exit 2
fi
if [ -x "$VENV/bin/hb_mapper" ] && "$VENV/bin/hb_mapper" --version >/dev/null 2>&1; then
  "$VENV/bin/hb_mapper" --version; exit 0      # already there
fi
"$PY310" -m venv "$VENV"
PIP="$VENV/bin/pip"
"$PIP" install -q --upgrade pip
# 1. the three toolchain wheels, without their (loose) dependency metadata
"$PIP" install --no-deps dgdk==1.0.0 dg-nn-toolkit==1.0.0 rdkx5-yolo-mapper==1.0.0
# 2. the dependency set that worked here (pip freeze of a venv in which makertbin,
#    the calibrated/quantized models and hbdk ran), installed as pinned, no resolution
cat > "$VENV/toolchain-requirements.txt" <<'EOF'
absl-py==2.5.1
bcrypt==5.0.0
cffi==2.1.1
click==8.5.1
coloredlogs==15.0.1
contourpy==1.3.2
cryptography==50.0.2
cycler==0.12.1
dill==0.4.1
easydict==1.14
filelock==4.1.0
flatbuffers==25.12.19
fonttools==4.65.0
fsspec==2026.9.0
graphviz==0.21
humanfriendly==10.0
ImageIO==2.38.0
invoke==3.0.3
Jinja2==3.1.6
kiwisolver==1.5.1
MarkupSafe==3.0.4
matplotlib==3.10.9
mpmath==1.3.0
msgpack==1.2.4
msgpack-numpy==0.4.8
multiprocess==0.70.19
networkx==3.4.2
numpy==1.23.0
nvidia-cublas-cu12==12.1.3.1
nvidia-cuda-cupti-cu12==12.1.105
nvidia-cuda-nvrtc-cu12==12.1.105
nvidia-cuda-runtime-cu12==12.1.105
nvidia-cudnn-cu12==8.9.2.26
nvidia-cufft-cu12==11.0.2.54
nvidia-curand-cu12==10.3.2.106
nvidia-cusolver-cu12==11.4.5.107
nvidia-cusparse-cu12==12.1.0.106
nvidia-nccl-cu12==2.19.3
nvidia-nvjitlink-cu12==12.9.86
nvidia-nvtx-cu12==12.1.105
onnx==1.15.0
onnxruntime==1.16.2
opencv-python-headless==4.6.0.66
packaging==26.4
paramiko==5.1.0
pathos==0.3.5
pillow==12.3.0
pox==0.3.7
ppft==1.7.8
protobuf==3.20.3
psutil==7.2.2
pycocotools==2.0.11
pycparser==3.11
pydot==4.0.1
PyNaCl==1.6.2
pyparsing==3.3.3
python-dateutil==3.0.0
PyWavelets==1.8.0
PyYAML==6.0.4
schema==0.7.8
scikit-image==0.19.0
scipy==1.13.1
six==1.17.0
sympy==1.14.0
tabulate==0.10.0
tifffile==2025.5.10
torch==2.2.2
tqdm==4.70.1
triton==2.2.0
typing_extensions==4.16.0
tzdata==2026.6
EOF
"$PIP" install --no-deps -r "$VENV/toolchain-requirements.txt"
# 3. graphviz's `dot` is used by hb_perf (not by makertbin); Debian: apt-get install -y graphviz
command -v dot >/dev/null || echo "note: 'dot' (graphviz) missing; only hb_perf needs it" >&2
"$VENV/bin/hb_mapper" --version
