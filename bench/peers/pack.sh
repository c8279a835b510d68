#!/usr/bin/env bash
# Wheels for the peers bench on the GPU machine, which reaches no registry (Python 3.12,
# torch 2.11 cu130, transformers 5.17; pandas, pyarrow, accelerate, peft, aiohttp there).
# Run here, in the repo root; each part fits one device call's 64 MiB and travels in a
# git-ignored folder (/.gpu*/):
#   .gpu_peers_base/  rollplex's and TRL's wheels (pydantic, hydra, datasets, trl, ...)
#   .gpu_peers_verl{1,2,3}/  verl 0.9.1's own site (transformers 5.10, ray 2.60, tensordict,
#                     ...) as a tar in three pieces: verl pins transformers < 5.11
# vLLM 0.26 (TRL's and verl's rollout) travels as ../shared/gpu/vllm/pack.sh makes it.
# PYVER=3.11 packs for this machine instead, to check the lists import (bench/peers/README.md).
set -euo pipefail
PYVER=${PYVER:-3.12}
PIP=${PIP:-python3 -m pip}
PLAT="--only-binary=:all: --python-version $PYVER --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux1_x86_64"
get() { $PIP download -q --no-deps $PLAT -d "$1" "${@:2}"; }
rm -rf .gpu_peers_base .gpu_peers_verl* /tmp/peers_pack && mkdir -p /tmp/peers_pack
# rollplex (FACTS.md: the GPU machine lacks these) and TRL 1.16 (its METADATA's needs)
# (pydantic as in ../shared/gpu/vllm/pack.sh's part: both unpack into one site)
get .gpu_peers_base pydantic==2.12.5 pydantic-core==2.41.5 annotated-types==0.8.0 \
  typing-inspection==0.4.5 hydra-core==1.3.8 omegaconf==2.3.0 \
  torch-tb-profiler==0.4.3 datasets==5.2.0 multiprocess==0.70.19 dill==0.4.1 easy-vqa==1.0 \
  math-verify==0.9.0 latex2sympy2-extended==1.10.2 trl==1.16.0
# omegaconf 2.3 needs antlr4 4.9.*, which PyPI has as a source archive only: build its
# (pure-Python) wheel here
$PIP wheel -q --no-deps -w .gpu_peers_base antlr4-python3-runtime==4.9.3
# VERL=0: TRL's part only (verl's three calls of carry are the slow part of a device session)
[ "${VERL:-1}" = 0 ] && { du -sh .gpu_peers_base; exit 0; }
# verl 0.9.1's closure as `pip install --dry-run --report` resolved it on 2026-12-05 against
# the dev venv (transformers < 5.11 -> 5.10.4), plus what ray[default] and wandb need that the
# dev venv had and the GPU machine's package list lacks (opentelemetry, jsonschema, gitpython,
# sentry-sdk). Unvalidated on the GPU machine: a missing one shows as an ImportError there.
get /tmp/peers_pack/verl verl==0.9.1 transformers==5.10.4 tokenizers==0.22.2 \
  huggingface-hub==1.33.0 tensordict==0.10.0 pyvers==0.1.0 torchdata==0.11.0 \
  codetiming==1.4.0 pylatexenc==2.11 wandb==0.31.0 orjson==3.13.0 ray==2.60.0 \
  aiohttp-cors==0.8.1 colorful==0.5.8 py-spy==0.4.3 smart-open==9.0.4 virtualenv==21.14.5 \
  distlib==0.4.4 platformdirs==4.14.9 python-discovery==1.9.9 opencensus==0.11.4 \
  opencensus-context==0.1.3 google-api-core==2.44.0 google-auth==2.63.0 proto-plus==1.29.0 \
  pyasn1==0.6.5 pyasn1-modules==0.4.2 rsa==4.9.1 cachetools==8.0.2 googleapis-common-protos==1.76.0 \
  opentelemetry-api==1.45.2 opentelemetry-sdk==1.45.2 opentelemetry-proto==1.45.2 \
  opentelemetry-semantic-conventions==0.66b2 opentelemetry-exporter-prometheus==0.66b2 \
  importlib-metadata==10.2.0 zipp==4.1.0 jsonschema==4.26.0 jsonschema-specifications==2025.9.1 \
  referencing==0.37.0 rpds-py==2026.9.1 gitpython==3.1.45 gitdb==4.0.12 smmap==5.0.2 \
  sentry-sdk==2.76.0 lazy-importer==0.1.0 cwevals==0.0.1b1 distro==1.9.0 wrapt==2.5.2 \
  qwen-vl-utils==0.0.14 av==18.1.0 hydra-core==1.3.8 omegaconf==2.3.0 \
  pydantic==2.14.3 pydantic-core==2.50.4 annotated-types==0.8.0 \
  typing-inspection==0.4.5 datasets==5.2.0 multiprocess==0.70.19 dill==0.4.1
# antlr4's wheel (built above: PyPI has it as a source archive only) for verl's site too
cp .gpu_peers_base/antlr4_python3_runtime-4.9.3-*.whl /tmp/peers_pack/verl/
# The verl site is ~165 MB of wheels (ray's alone ~79 MB; wheels are compressed already):
# a tar split into three calls' worth.
tar -C /tmp/peers_pack/verl -cf - . | split -b 60m -d - /tmp/peers_pack/verl.tar.
for i in 0 1 2; do mkdir -p .gpu_peers_verl$((i + 1)); mv /tmp/peers_pack/verl.tar.0$i .gpu_peers_verl$((i + 1))/; done
du -sh .gpu_peers_*
