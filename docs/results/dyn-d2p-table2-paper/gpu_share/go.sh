# The lent-GPU share of this sweep (2026-11-26, NVIDIA H200, 16 cores): carried .devdata/ (the four Fashion-MNIST
# IDX .gz files of dataset-fashion-mnist) and .whl2/ (dp-accounting 0.6.0 and dm-tree wheels); run as
# `DEADLINE_AT=<s> bash go.sh` from the repo root; $OUT/share.tar.gz was unpacked into ../runs/.
set -x
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl2/*.whl || exit 1
[ -e flower_dp/clients ] || ln -s ../clients flower_dp/clients; [ -e flower_dp/strategies ] || ln -s ../strategies flower_dp/strategies
export PYTHONPATH=$PWD:/tmp/site FLOWER_DP_DATA=$PWD/.devdata
python3 -c "import flower_dp.clients.builder, flower_dp.reproduce.papers.dyn_d2p" || exit 1
nvidia-smi -L; nproc
(nvidia-smi --query-gpu=timestamp,utilization.gpu,memory.used --format=csv -l 15 > $OUT/smi.csv 2>&1 &)
M=$(command -v nvidia-cuda-mps-control)
[ -n "$M" ] && timeout 10 $M -d
if [ -n "$M" ] && timeout 40 python3 -c "import torch; torch.zeros(1, device='cuda'); print('mps ok')"; then
  echo "MPS on"
else
  [ -n "$M" ] && (echo quit | timeout 10 $M)
  export CUDA_MPS_PIPE_DIRECTORY=/nonexistent-mps; echo "MPS off"
fi
# batch 2 (DEADLINE_AT=400) below; batch 1 (DEADLINE_AT default 560) named the 12 runs of batch1_summary.json
IDS="table2-const-eps0.7-rigorous-s1 table2-dyn-eps0.7-rigorous-s1 table2-const-eps1-rigorous-s1 table2-dyn-eps1-rigorous-s1 table2-const-eps3-rigorous-s1 table2-dyn-eps3-rigorous-s1 table2-dyn_mu-eps1-paper-s0 table2-dyn_c-eps1-paper-s0 table2-dyn_mu-eps3-paper-s0 table2-dyn_c-eps3-paper-s0 table2-dyn_mu-eps0.3-paper-s1 table2-dyn_c-eps0.3-paper-s1 table2-dyn_mu-eps0.7-paper-s1 table2-dyn_c-eps0.7-paper-s1 table2-dyn_mu-eps1-paper-s1 table2-dyn_c-eps1-paper-s1"
LEFT=$((${DEADLINE_AT:-560} - SECONDS))
timeout $((LEFT + 20)) python3 scripts/deadline_share.py dyn-d2p table2 paper /tmp/share2 $OUT/share.tar.gz $IDS --deadline-s $LEFT --device cuda --num-iters 3000 --seeds 2 --warmup-s 100 2>&1 | tee $OUT/driver.log
for f in /tmp/share2/*.log; do echo "== $f"; tail -n 8 $f; done > $OUT/children.log 2>&1
ls -la $OUT
