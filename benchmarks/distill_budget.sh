#!/usr/bin/env bash
# Distillation at a wall-clock budget (docs/lab/distillation.md): a teacher trained by kontrast's 30-minute SimCLR
# recipe on CIFAR-10, then for each student (ResNet-18 at width 0.25, vit_tiny) a 10-minute run that distils the
# teacher and a 10-minute run of SimCLR's fast recipe, two seeds each, interleaved (arm order alternates by seed).
# Every run is benchmarks/time_to_accuracy.py's kontrast side: the training clock alone, a snapshot every
# MARK_MIN minutes and at the budget, each scored afterwards by kNN (k=200) of the full test split against the
# full training split. Rows go to OUT; the summary and the curves (PLOT) end the script.
# Each arm's schedule (train.epochs) is 1.3x the epochs its pilot's pace fits in the budget, the fast recipe's
# rule (its 34 epochs for 30 minutes), so the budget cuts every schedule at about the same share.
#   DATA (default ../shared/data/cifar10-jpeg.tar.gz), WORK (default runs/distill_budget), OUT (default
#   benchmarks/results/distill_budget.jsonl), PLOT (default docs/figures/distill_budget.png), SEEDS (default
#   "0 1"), ARMS (default all four: r18-distill r18-simclr vit-distill vit-simclr; a subset re-runs those alone),
#   BUDGET_MIN (10), TEACHER_MIN (30), MARK_MIN (2.5; MARK_MIN_VIT 5), EPOCHS_R18_DISTILL,
#   EPOCHS_R18_SIMCLR, EPOCHS_VIT_DISTILL, EPOCHS_VIT_SIMCLR (the pilots' fits on a 2-core AVX-512 CPU), PYTHON
#   (default .venv/bin/python). Run it on a quiet machine: about 2.5 hours there (the vit_tiny arms' kNN scoring,
#   about 2 minutes a snapshot, included).
set -euo pipefail
cd "$(dirname "$0")/.."
DATA=${DATA:-../shared/data/cifar10-jpeg.tar.gz}
WORK=${WORK:-runs/distill_budget}
OUT=${OUT:-benchmarks/results/distill_budget.jsonl}
SEEDS=${SEEDS:-0 1}
ARMS=${ARMS:-r18-distill r18-simclr vit-distill vit-simclr}
BUDGET_MIN=${BUDGET_MIN:-10}
TEACHER_MIN=${TEACHER_MIN:-30}
MARK_MIN=${MARK_MIN:-2.5}
MARK_MIN_VIT=${MARK_MIN_VIT:-5}  # a vit_tiny snapshot takes minutes to score
EPOCHS_R18_DISTILL=${EPOCHS_R18_DISTILL:-21}
EPOCHS_R18_SIMCLR=${EPOCHS_R18_SIMCLR:-18}
EPOCHS_VIT_DISTILL=${EPOCHS_VIT_DISTILL:-3}
EPOCHS_VIT_SIMCLR=${EPOCHS_VIT_SIMCLR:-2}
PYTHON=${PYTHON:-.venv/bin/python}
PLOT=${PLOT:-docs/figures/distill_budget.png}
tta=("$PYTHON" benchmarks/time_to_accuracy.py --data "$DATA" --sides ours --work "$WORK" --out "$OUT")
teacher="$WORK/ours-teacher-s0/marks"  # the teacher's snapshot at its budget (marks/ reads as a run folder)
if [ ! -f "$teacher/config.yaml" ]; then
  "${tta[@]}" --seeds 0 --budget-min "$TEACHER_MIN" --mark-min 7.5 --label teacher
fi
distill=(--recipe configs/distill_cifar.yaml --set "method.teacher=$teacher")
simclr=(--recipe configs/simclr_cifar_fast.yaml)
r18=(--set encoder.name=resnet18 --set encoder.width=0.25)
# vit_tiny (12 blocks, 4-px patches); SimCLR's ViT takes the distill recipe's AdamW, not the ResNet recipe's SGD,
# so that the two vit_tiny arms differ in their loss alone
vit=(--set encoder.name=vit_tiny --set encoder.width=1.0 --set encoder.stem=auto)
adamw=(--set optim.name=adamw --set optim.lr=1.0e-3 --set optim.weight_decay=0.05)
warmup() {  # the AdamW arms warm up for a tenth of their schedule (the distill recipe's 2 epochs are for 200)
  echo "--set optim.warmup_epochs=$(awk "BEGIN {print $1 / 10}")"
}
arm() {  # label, seed, arguments
  local label=$1 seed=$2 mark=$MARK_MIN
  shift 2
  [[ $label == vit-* ]] && mark=$MARK_MIN_VIT
  "${tta[@]}" --seeds "$seed" --budget-min "$BUDGET_MIN" --mark-min "$mark" --label "$label" "$@"
}
for seed in $SEEDS; do
  arms=(r18-distill r18-simclr vit-distill vit-simclr)
  [ $((seed % 2)) = 1 ] && arms=(r18-simclr r18-distill vit-simclr vit-distill)
  for a in "${arms[@]}"; do
    [[ " $ARMS " == *" $a "* ]] || continue
    case $a in
      r18-distill) arm "$a" "$seed" "${distill[@]}" "${r18[@]}" --set "train.epochs=$EPOCHS_R18_DISTILL" \
                     $(warmup "$EPOCHS_R18_DISTILL") ;;
      r18-simclr) arm "$a" "$seed" "${simclr[@]}" "${r18[@]}" --set "train.epochs=$EPOCHS_R18_SIMCLR" ;;
      vit-distill) arm "$a" "$seed" "${distill[@]}" "${vit[@]}" --set "train.epochs=$EPOCHS_VIT_DISTILL" \
                     $(warmup "$EPOCHS_VIT_DISTILL") ;;
      vit-simclr) arm "$a" "$seed" "${simclr[@]}" "${vit[@]}" "${adamw[@]}" --set "train.epochs=$EPOCHS_VIT_SIMCLR" \
                    $(warmup "$EPOCHS_VIT_SIMCLR") ;;
    esac
  done
done
"$PYTHON" benchmarks/time_to_accuracy.py --report --out "$OUT" --budget-min "$BUDGET_MIN" --targets 0.6 \
  --plot "$PLOT" --reference-labels teacher
