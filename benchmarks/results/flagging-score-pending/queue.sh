#!/usr/bin/env bash
# Issue 61's live measurement (benchmarks/results/flagging-score-pending/README.md), from the frozen checkout
# $M, after issue 59's queue. Resumable: every step resumes from its rows and journal; seeds are drawn once and
# kept in $P/seeds.tsv (a scoring seed only after its calibration's calibration.json exists).
set -uo pipefail
FROZEN=${FROZEN:-4ba8cfd}
M=/work/measure-flagging  # a worktree of $FROZEN (checked below)
R=/work/main/benchmarks/results
P=$R/flagging-score-pending
LOG=/work/notes/queue-flagging.log
cd $M && . .venv/bin/activate
[ "$(git rev-parse --short=7 HEAD)" = "$FROZEN" ] && [ -z "$(git status --porcelain --untracked-files=no)" ] \
  || { echo "$M is not a clean checkout of $FROZEN" >&2; exit 2; }
export REFLECT_LOCAL_THREADS=2
say() { echo "$(date -u +%FT%TZ) $*" >> $LOG; }

# one model on 2 cores: after issue 59's runs have ended (its last, BIG-Bench-Mistake, logged as ended)
until grep -q "end bbm seed 7078 rc" /work/notes/queue-skeptic.log 2>/dev/null && ! pgrep -f queue-skeptic.sh > /dev/null
do sleep 60; done

seed() {  # seed NAME: the seed kept under NAME, or a fresh one never used by any results folder, kept
  local kept
  kept=$(awk -v n="$1" '$1 == n {print $2}' $P/seeds.tsv 2>/dev/null)
  if [ -n "$kept" ]; then echo $kept; return; fi
  local used s
  used=$(grep -rhoE '"seed": *[0-9]+' $R/*/run_config.json $R/*/*/run_config.json 2>/dev/null | grep -oE '[0-9]+$'
         cut -f2 $P/seeds.tsv 2>/dev/null)
  while :; do
    s=$(python3 -c "import secrets; print(secrets.randbelow(10000))")
    grep -qx "$s" <<< "$used" || break
  done
  printf '%s\t%s\t%s\t%s\n' "$1" "$s" "$(date -u +%FT%TZ)" "frozen $FROZEN" >> $P/seeds.tsv
  say "drew $1=$s"
  echo $s
}
exclude() {  # exclude FOLDER OTHER_AGENT
  [ -s $R/$1/exclude.txt ] || { mkdir -p $R/$1 && python -m benchmarks._used_questions --results $R \
    --skip "$1" $(cd $R && ls -d wtq-live-flagging-$2-* 2>/dev/null) > $R/$1/exclude.tmp \
    && [ -s $R/$1/exclude.tmp ] && mv $R/$1/exclude.tmp $R/$1/exclude.txt; }
  [ -s $R/$1/exclude.txt ] || { say "$1: no exclude.txt (listing the used questions failed)"; return 1; }
  say "$1: $(tr ',' '\n' < $R/$1/exclude.txt | grep -c .) of 600 questions excluded"
}
threshold() {  # threshold CALIBRATION_FOLDER: fails (and says so) when the calibration has no combined threshold
  python -c "import json; print(json.load(open('$R/$1/flagging/calibration.json'))['recall_thresholds']['combined'])" \
    || { say "$1: its calibration.json has no combined recall threshold"; return 1; }
}
smoke() {  # smoke NAME EARLIER_FOLDER: every verifier, live, on 2 labelled runs of an earlier folder, into /tmp
  local out=/tmp/flagging-smoke-$1
  rm -rf $out && mkdir -p $out
  nice -n -15 python -m benchmarks.flagging --live $R/$2/results.jsonl --data /work/shared/data --limit 2 \
    --verifiers evidence,proxy,consistency,combined --samples 5 --stop-lead 2 --temperature 0.7 --out $out \
    > $out/flagging.txt 2> $out/flagging.log
  local rc=$?
  # the resampling must work (a proxy audit failing its schema on a run is a verdict counted apart, as in the runs)
  if [ $rc -ne 0 ] || grep -qE "^\[consistency [0-9]+/2\] .*the verifier failed" $out/flagging.log \
     || ! grep -qE "^\[consistency [0-9]+/2\] .* [1-9][0-9]* agent runs" $out/flagging.log; then
    say "smoke $1 failed (rc $rc): see $out/flagging.log"; return 1
  fi
  say "smoke $1 passed ($out)"
}
runs() {  # runs AGENT SEED FOLDER
  say "start runs $1 seed $2"
  nice -n -15 reflect-otel eval --benchmark wtq-live --agent $1 --data /work/shared/data --method none --runs 90 \
    --seed $2 --exclude "$(cat $R/$3/exclude.txt)" --out $R/$3 >> $R/$3/eval.log 2>&1
  local rc=$?; say "end runs $1 seed $2 rc $rc"; return $rc
}
flag() {  # flag FOLDER [--calibration FILE]
  say "start flag $1"
  nice -n -15 python -m benchmarks.flagging --live $R/$1/results.jsonl --verifiers evidence,proxy,consistency,combined \
    --samples 5 --stop-lead 2 --temperature 0.7 "${@:2}" > $R/$1/flagging.txt 2>> $R/$1/flagging.log
  local rc=$?; say "end flag $1 rc $rc"; return $rc
}
agent() {  # agent AGENT OTHER
  local tc c ts s
  local th
  tc=$(seed "$1-calibration"); c=wtq-live-flagging-$1-calibration-seed$tc
  exclude $c $2 && runs $1 $tc $c || return 1
  [ -s $R/$c/flagging/calibration.json ] || flag $c || return 1
  th=$(threshold $c) && [ -n "$th" ] || return 1
  ts=$(seed "$1-scoring"); s=wtq-live-flagging-$1-scoring-seed$ts  # drawn now: its calibration is written
  exclude $s $2 && runs $1 $ts $s || return 1
  REFLECT_FLAG_THRESHOLD=$th flag $s --calibration $R/$c/flagging/calibration.json
}
say "queue started (frozen $FROZEN)"
# minutes before hours: the frozen code's resampling and audit, live, on both agents' earlier runs
smoke table wtq-live-runs-seed2475 && smoke sql wtq-live-sql-seed4917 || { say "queue stopped: a smoke failed"; exit 1; }
agent table sql && agent sql table
say "queue ended rc $?"
