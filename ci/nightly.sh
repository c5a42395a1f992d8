#!/usr/bin/env bash
# Nightly run on an Ascend NPU cluster, for any scheduler (Slurm, cron, Jenkins, the GitHub workflow
# .github/workflows/nightly-npu.yml). Runs the tiers in order, cheapest first -- tiny -> layer ->
# reduced -> moonlight -> full -- each with --strict-hardware (a nightly must never go green by
# skipping), and stops at the first failing tier: no 256-card job is booked when one card already fails.
# Every tier's report.json goes to the trend store; the HTML (tonight's reports and the trend across
# nights) is written to the publish directory; each tier's JUnit XML is collected for the CI's test view and
# each tier's Markdown (then each trend's) is appended to the step summary. A trend that fails (a regression, a
# night that lost tests, metrics or suites) fails the night too.
#
# Usage: ci/nightly.sh [--recipe FILE] [--recipe-env NAME=VALUE]... [--model-path DIR] [--golden FILE|DIR]
#                      [-- PYTEST-ARGS...]
# The flags are the variables RECIPE, RECIPE_ENV, MODEL_PATH and GOLDEN_DIR below (a flag wins). --golden takes
# a directory of goldens (<scale>.json per tier), or one file for a night of one scale (SCALES=tiny). The words
# after `--` go to every tier's pytest (e.g. `-- -k reward_alignment`).
#
# Environment:
#   HARDWARE      a2 | a3 | cpu (default a3): picks the scales below and is passed as --hardware (cpu: the night
#                 rehearsed on a CPU host, its tiny and layer tiers)
#   REPORTS_DIR   where each night's reports/nightly-<night>/ goes (default reports/ of this checkout)
#   SCALES        override the scale list (space separated, in tier order)
#   RAY_ADDRESS   the cluster's Ray dashboard (http://HEAD:8265) for the multi-node tiers
#   HARNESS_RUN_ROOT  required with RAY_ADDRESS: an absolute directory on storage every cluster node and this host
#                 mount (the launched jobs write their logs there on a cluster node; harness.launch.jobs)
#   TINY_VERL     here | elsewhere | only (default here): where the tiny tier's verl runs go (`--tiny-verl`; they
#                 need root, unshare and iproute2, which the NPU container lacks: the workflow sets elsewhere and
#                 runs them in its tiny-verl-cpu job on a CPU runner)
#   RECIPE        your own job (a launch script or Hydra YAML, as `plan --recipe` reads it): every tier runs it instead
#                 of the scale's built-in job (tiny: rehearsed on verl's real trainer at tiny scale), and the trend
#                 store keys the night by it
#   RECIPE_ENV    NAME=VALUE words (space separated): the environment RECIPE's launch script is read with
#                 (`run --recipe-env`; a script that stops on an unset ${NAME:?} needs it)
#   MODEL_PATH    the HF model directory on the cluster's shared storage for RECIPE on the launched tiers
#                 (`run --model-path`; default: the recipe's own actor_rollout_ref.model.path)
#   GOLDEN_DIR    your goldens, one per tier, recorded from RECIPE's own runs: GOLDEN_DIR/<scale>.json (`ascend-rl-
#                 harness baseline record RUN... -o GOLDEN_DIR/<scale>.json`); a tier without one is not judged on
#                 curves (a failure under --strict-hardware, never a pass against another job's golden)
#   BASELINE_DIR  golden baselines (default baselines/; without RECIPE)
#   TREND_STORE   where report JSON accumulates night after night (default /data/ascend-rl-harness/trend)
#   PUBLISH_DIR   where the HTML goes (default ./public)
#   GITHUB_STEP_SUMMARY  the Markdown summary file (set by GitHub Actions; default reports/nightly-<night>/summary.md)
#   FABRIC        1 | 0 (default 1 on HARDWARE=cpu with RECIPE): after the tiers, RECIPE's tiny rehearsal through the
#                 multi-node rehearsal too (harness.launch.cluster: a head, a worker and an unprivileged runner in
#                 namespaces of this host; needs root, unshare and iproute2), judged against GOLDEN's tiny golden;
#                 a misaligned or failed run fails the night. ~10 min on 2 cores
#   NIGHTLY_DRY_RUN=1  print the commands instead of running them
#   HARNESS_ABORT_ON_FAIL=0  run a launched job to its end even after its failure is certain (default: the
#                 launcher stops it at the first verdict it can no longer pass; harness/metrics/early_stop.py)
set -euo pipefail

die() { echo "ci/nightly.sh: error: $*" >&2; exit 2; }
recipe_env=()  # --recipe-env, one item each (a value may hold spaces, unlike RECIPE_ENV's words)
pytest_args=()
while [ $# -gt 0 ]; do
  case "$1" in
    --recipe|--recipe-env|--model-path|--golden)
      [ $# -ge 2 ] && [ -n "$2" ] || die "$1 needs a value"
      case "$1" in
        --recipe) RECIPE="$2" ;;
        --recipe-env) recipe_env+=("$2") ;;
        --model-path) MODEL_PATH="$2" ;;
        --golden) GOLDEN="$2" ;;
      esac
      shift 2 ;;
    --) shift; pytest_args=("$@"); break ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) die "unknown argument $1 (flags: --recipe, --recipe-env, --model-path, --golden; pytest's after --)" ;;
  esac
done
# paths as given, before the cd below (a recipe or golden named relative to where the night was started)
for name in RECIPE GOLDEN; do
  value="${!name:-}"
  case "$value" in ""|/*) ;; *) printf -v "$name" '%s' "$PWD/$value" ;; esac
done
cd "$(dirname "$0")/.."

HARDWARE="${HARDWARE:-a3}"
case "$HARDWARE" in
  # Only A2 has reduced and moonlight scales registered (harness/config/scales.py); A3 runs tiny, layer, full.
  a2) DEFAULT_SCALES="tiny layer reduced-a2 moonlight-a2 full-a2-gbs128" ;;
  a3) DEFAULT_SCALES="tiny layer full-a3" ;;
  # the night rehearsed on a CPU host (the tiers a CPU runs: doctor's RUN lines), e.g. a recipe's first night
  cpu) DEFAULT_SCALES="tiny layer" ;;
  *) echo "ci/nightly.sh: error: HARDWARE=$HARDWARE: use a2, a3 or cpu" >&2; exit 2 ;;
esac
SCALES="${SCALES:-$DEFAULT_SCALES}"
GOLDEN_FILE=""
if [ -n "${GOLDEN:-}" ]; then
  if [ -d "$GOLDEN" ]; then
    GOLDEN_DIR="$GOLDEN"
  elif [ -f "$GOLDEN" ]; then
    # one golden judges one job at one scale: the layer tier's curves are not the tiny tier's
    [ "$(wc -w <<<"$SCALES")" -eq 1 ] || die "--golden $GOLDEN is one file for the scales $SCALES: give a directory" \
      "with <scale>.json per tier, or set SCALES to one scale"
    GOLDEN_FILE="$GOLDEN"
  else
    die "--golden $GOLDEN is neither a file nor a directory"
  fi
fi
BASELINE_DIR="${BASELINE_DIR:-baselines}"
if [ -n "${RECIPE:-}" ]; then
  # one recipe's nights are one trend: another job's nights beside them would read as a regression or a fix
  [ -f "$RECIPE" ] || { echo "ci/nightly.sh: error: RECIPE=$RECIPE is not a file" >&2; exit 2; }
  TREND_KEY="-$(basename "$RECIPE" | tr -c 'A-Za-z0-9._\n-' '_')"
fi
TREND_KEY="${TREND_KEY:-}"
TREND_STORE="${TREND_STORE:-/data/ascend-rl-harness/trend}"
PUBLISH_DIR="${PUBLISH_DIR:-public}"
NIGHT="$(date -u +%Y%m%dT%H%M%SZ)"
REPORTS="${REPORTS_DIR:-reports}/nightly-$NIGHT"
HARNESS="${HARNESS:-ascend-rl-harness}"
PYTHON="${PYTHON:-python3}"
# JUnit XML per tier (<scale>.xml): Jenkins `junit 'reports/nightly-*/junit/*.xml'`, GitLab `artifacts:reports:junit`,
# the GitHub workflow's JUnit step. The summary: GitHub shows $GITHUB_STEP_SUMMARY on the run's page.
JUNIT_DIR="$REPORTS/junit"
SUMMARY="${GITHUB_STEP_SUMMARY:-$REPORTS/summary.md}"

run() {  # run a command, or print it under NIGHTLY_DRY_RUN=1
  if [ "${NIGHTLY_DRY_RUN:-0}" = 1 ]; then printf '%q ' "$@"; echo; else "$@"; fi
}

if [ -n "${RAY_ADDRESS:-}" ]; then
  # fail the night before the first tier, not after the tiny and layer tiers ran (the plugin refuses it too)
  case "${HARNESS_RUN_ROOT:-}" in
    /*) run mkdir -p "$HARNESS_RUN_ROOT" ;;
    *) echo "ci/nightly.sh: error: RAY_ADDRESS is set but HARNESS_RUN_ROOT=${HARNESS_RUN_ROOT:-} is not an absolute" \
            "path: set it to a directory every cluster node and this host mount" >&2; exit 2 ;;
  esac
fi

env_flags=()  # RECIPE_ENV's words, then each --recipe-env (a value may hold spaces), for every command reading RECIPE
for item in ${RECIPE_ENV:-}; do env_flags+=(--recipe-env "$item"); done
for item in ${recipe_env[@]+"${recipe_env[@]}"}; do env_flags+=(--recipe-env "$item"); done

status=0
for scale in $SCALES; do
  out="$REPORTS/$scale"
  run mkdir -p "$out"
  extra=(--strict-hardware --hardware "$HARDWARE")
  [ -n "${RAY_ADDRESS:-}" ] && extra+=(--ray-address "$RAY_ADDRESS")
  [ -n "${TINY_VERL:-}" ] && extra+=(--tiny-verl "$TINY_VERL")
  job=()  # the job and its golden: `run`'s own flags, checked by `run` before the tier starts (exit 2, one line)
  if [ -n "${RECIPE:-}" ]; then
    job+=(--recipe "$RECIPE" ${env_flags[@]+"${env_flags[@]}"})
    [ -n "${MODEL_PATH:-}" ] && job+=(--model-path "$MODEL_PATH")
  fi
  if [ -n "$GOLDEN_FILE" ]; then
    job+=(--golden "$GOLDEN_FILE")
  elif [ -n "${GOLDEN:-}${RECIPE:-}" ]; then
    [ -f "${GOLDEN_DIR:-}/$scale.json" ] && job+=(--golden "$GOLDEN_DIR/$scale.json")
  elif [ -d "$BASELINE_DIR/$HARDWARE" ]; then
    job+=(--golden "$BASELINE_DIR/$HARDWARE")
  fi
  tier_status=0
  # ${job[@]+...}: an empty array is an unset variable to bash < 4.4 under set -u
  run "$HARNESS" run --scale "$scale" --report-dir "$out" ${job[@]+"${job[@]}"} -- "${extra[@]}" \
    ${pytest_args[@]+"${pytest_args[@]}"} || tier_status=$?
  # Keep the report whatever happened: the trend store is how a regression is seen the next morning.
  if [ -f "$out/report.json" ] || [ "${NIGHTLY_DRY_RUN:-0}" = 1 ]; then
    run mkdir -p "$TREND_STORE/$scale$TREND_KEY"
    # copy, then rename: a copy cut short (node lost, disk full) never sits in the store as a half-written night
    run cp "$out/report.json" "$TREND_STORE/$scale$TREND_KEY/.$NIGHT.json.tmp"
    run mv "$TREND_STORE/$scale$TREND_KEY/.$NIGHT.json.tmp" "$TREND_STORE/$scale$TREND_KEY/$NIGHT.json"
    # FAIL <scale> <suite>::<test> metric .. step .. lines, and the tier's Markdown into the summary (redacted)
    run "$PYTHON" -m harness.report.nightly --summary "$SUMMARY" "$out/report.json" || true
    run mkdir -p "$JUNIT_DIR"
    run cp -L "$out/junit.xml" "$JUNIT_DIR/$scale.xml"  # -L: junit.xml is a link into the report's generation
  fi
  if [ "$tier_status" -ne 0 ]; then
    echo "ci/nightly.sh: tier of scale $scale failed (exit $tier_status); later tiers not run" >&2
    status=$tier_status
    break
  fi
done

# Publish: tonight's per-scale HTML and the trend of every scale across the stored nights.
run mkdir -p "$PUBLISH_DIR/$NIGHT"
for scale in $SCALES; do
  if [ -d "$REPORTS/$scale" ] || [ "${NIGHTLY_DRY_RUN:-0}" = 1 ]; then
    # -L: the report set is a generation directory behind links (harness/report/publish.py); publish plain files
    run cp -rL "$REPORTS/$scale" "$PUBLISH_DIR/$NIGHT/$scale"
  fi
  if compgen -G "$TREND_STORE/$scale$TREND_KEY/*.json" >/dev/null || [ "${NIGHTLY_DRY_RUN:-0}" = 1 ]; then
    # the directory, not a glob: a corrupt entry is then quarantined and the trend goes on. Its verdict counts:
    # a regression, or a night that lost tests, metrics or suites against the night before, fails the night.
    trend_status=0
    run "$HARNESS" report -o "$PUBLISH_DIR/trend/$scale$TREND_KEY" "$TREND_STORE/$scale$TREND_KEY" || trend_status=$?
    if [ "$trend_status" -ne 0 ]; then
      echo "ci/nightly.sh: trend of scale $scale: FAIL (exit $trend_status; $PUBLISH_DIR/trend/$scale$TREND_KEY/trend.html)" >&2
      [ "$status" -eq 0 ] && status=$trend_status
    fi
    if [ -f "$PUBLISH_DIR/trend/$scale$TREND_KEY/trend.md" ] || [ "${NIGHTLY_DRY_RUN:-0}" = 1 ]; then
      run "$PYTHON" -m harness.report.nightly --summary "$SUMMARY" "$PUBLISH_DIR/trend/$scale$TREND_KEY/trend.md"
    fi
  fi
done
# The recipe through the multi-node rehearsal (a CPU night): the runner launches it onto the fabric's worker as this
# script launches a tier onto a cluster, and judges it against the tiny tier's golden.
tiny_golden="${GOLDEN_FILE:-${GOLDEN_DIR:-}/tiny.json}"
if [ "$HARDWARE" = cpu ] && [ -n "${RECIPE:-}" ] && [ "${FABRIC:-1}" != 0 ] && [ "$status" -eq 0 ] \
   && [[ " $SCALES " == *" tiny "* ]]; then
  if [ ! -f "$tiny_golden" ] && [ "${NIGHTLY_DRY_RUN:-0}" != 1 ]; then
    echo "ci/nightly.sh: the multi-node rehearsal needs the tiny golden of $RECIPE ($tiny_golden); FABRIC=0 skips it" >&2
    status=1
  else
    fabric_status=0
    run "$PYTHON" -m harness.launch.cluster --out "$REPORTS/fabric" --recipe "$RECIPE" --golden "$tiny_golden" \
      ${env_flags[@]+"${env_flags[@]}"} || fabric_status=$?
    if [ "${NIGHTLY_DRY_RUN:-0}" != 1 ]; then
      printf '\n**multi-node rehearsal** of %s against %s: %s (%s/fabric/cluster.json)\n' "$RECIPE" "$tiny_golden" \
        "$([ "$fabric_status" -eq 0 ] && echo PASS || echo "FAIL, exit $fabric_status")" "$REPORTS" >> "$SUMMARY"
    fi
    if [ "$fabric_status" -ne 0 ]; then
      echo "ci/nightly.sh: the multi-node rehearsal of $RECIPE failed (exit $fabric_status; $REPORTS/fabric)" >&2
      status=$fabric_status
    fi
  fi
fi
echo "ci/nightly.sh: night $NIGHT on $HARDWARE: exit $status; HTML in $PUBLISH_DIR, JUnit in $JUNIT_DIR, summary in" \
     "$SUMMARY" >&2
exit "$status"
