# Sourced by the study scripts: refuse a report timed on a busy machine.
# idle_or_fail REPORT.json: exit 1 naming the report when other processes took more than 0.1 cores while it was timed.
idle_or_fail() {
  python - "$1" <<'PY'
import json, sys
load = json.load(open(sys.argv[1]))["machine_load"]
if (load.get("others_cores") or 0) > 0.1:
    sys.exit(f"{sys.argv[1]}: other processes took {load['others_cores']:.2f} cores while it was timed: rerun on an idle machine")
PY
}
