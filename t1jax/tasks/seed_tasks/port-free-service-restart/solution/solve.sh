#!/bin/bash
# supervise.sh: run the command in the background ($! is its own pid), wait for it, trap TERM to
# forward it; exponential backoff in integer milliseconds.
set -euo pipefail
cat > /app/supervise.sh <<'SH'
#!/bin/bash
usage() { echo "usage: supervise.sh MAX_RESTARTS LOGFILE -- COMMAND [ARGS...]" >&2; exit 2; }
[ $# -ge 4 ] || usage
max=$1 logfile=$2
[[ $max =~ ^[0-9]+$ ]] || usage
[ -n "$logfile" ] && [ "$3" = "--" ] || usage
shift 3
base=${SUPERVISE_BACKOFF_MS:-1000}
log() { echo "$*" >> "$logfile"; }

child="" stop=0
trap 'stop=1; [ -n "$child" ] && kill -TERM "$child" 2>/dev/null' TERM
attempt=1 restarts=0
while :; do
  "$@" &
  child=$!
  log "START attempt=$attempt pid=$child"
  wait "$child"; status=$?
  if [ $stop -eq 1 ]; then
    # wait was interrupted by the trap (or the child already exited): wait for the real exit
    wait "$child" 2>/dev/null
    log "STOP attempt=$attempt"
    exit 0
  fi
  log "EXIT attempt=$attempt status=$status"
  [ $status -eq 0 ] && exit 0
  if [ $restarts -ge "$max" ]; then
    log "GIVEUP attempts=$attempt"
    exit 1
  fi
  delay=$((base * (1 << restarts)))
  restarts=$((restarts + 1)) attempt=$((attempt + 1))
  log "RESTART attempt=$attempt delay_ms=$delay"
  sleep "$(printf '%d.%03d' $((delay / 1000)) $((delay % 1000)))" &
  child=$!
  wait "$child"
  [ $stop -eq 1 ] && { log "STOP attempt=$attempt"; exit 0; }
done
SH
chmod +x /app/supervise.sh
rm -rf /tmp/demo && mkdir /tmp/demo && echo "3 5 0" > /tmp/demo/crash_plan
SUPERVISE_BACKOFF_MS=100 /app/supervise.sh 5 /tmp/demo/supervise.log -- python3 /app/service.py --state /tmp/demo
cat /tmp/demo/supervise.log
