#!/bin/bash
# Install /app/daemon.sh and give it a quick start/reload/stop round.
set -euo pipefail
cat > /app/daemon.sh <<'SCRIPT'
#!/bin/bash
# Heartbeat service: start|stop|status|reload|run (see the task description).
CONF=${DAEMON_CONF:-/app/daemon.conf}
PIDFILE=${DAEMON_PIDFILE:-/app/run/daemon.pid}
LOG=${DAEMON_LOG:-/app/log/daemon.log}
SELF=$(readlink -f -- "$0")

log() { printf '%s\n' "$1" >> "$LOG"; }

load_conf() {
  INTERVAL=5 MESSAGE=heartbeat
  local key value
  while IFS='=' read -r key value || [ -n "$key" ]; do
    case $key in
      ''|'#'*) ;;
      INTERVAL) [[ $value =~ ^[0-9]+$ ]] && [ "$value" -ge 1 ] && INTERVAL=$value ;;
      MESSAGE) MESSAGE=$value ;;
    esac
  done < "$CONF"
}

# alive PID: the process exists and is not a zombie
alive() {
  local pid=$1 state
  [[ $pid =~ ^[0-9]+$ ]] || return 1
  state=$(awk '{print $3}' "/proc/$pid/stat" 2>/dev/null) || return 1
  [ -n "$state" ] && [ "$state" != Z ]
}

running_pid() {
  local pid
  [ -f "$PIDFILE" ] || return 1
  pid=$(head -n1 "$PIDFILE" 2>/dev/null)
  if alive "$pid"; then echo "$pid"; return 0; fi
  return 1
}

do_run() {
  mkdir -p "$(dirname -- "$PIDFILE")" "$(dirname -- "$LOG")"
  local stop=0 reload=0 sleeper
  trap 'reload=1' HUP
  trap 'stop=1' TERM
  load_conf
  echo $$ > "$PIDFILE"
  log "started pid=$$"
  while :; do
    log "$MESSAGE"
    sleep "$INTERVAL" & sleeper=$!
    while kill -0 "$sleeper" 2>/dev/null && [ $stop -eq 0 ] && [ $reload -eq 0 ]; do
      wait "$sleeper"
    done
    kill "$sleeper" 2>/dev/null; wait "$sleeper" 2>/dev/null
    if [ $stop -eq 1 ]; then
      log "stopping pid=$$"
      rm -f -- "$PIDFILE"
      exit 0
    fi
    if [ $reload -eq 1 ]; then
      reload=0
      load_conf
      log "reloaded"
    fi
  done
}

do_start() {
  local pid
  if pid=$(running_pid); then echo "already running" >&2; exit 1; fi
  rm -f -- "$PIDFILE"
  mkdir -p "$(dirname -- "$PIDFILE")" "$(dirname -- "$LOG")"
  setsid "$SELF" run < /dev/null > /dev/null 2>&1 &
  # a wall-clock deadline, not a count of polls: each poll forks, slow on a loaded machine
  local deadline=$((SECONDS + 5))
  while [ "$SECONDS" -le "$deadline" ]; do
    if running_pid > /dev/null; then exit 0; fi
    sleep 0.05
  done
  echo "daemon did not start" >&2
  exit 1
}

do_stop() {
  local pid
  if ! pid=$(running_pid); then
    rm -f -- "$PIDFILE"
    echo "not running" >&2
    exit 1
  fi
  kill -TERM "$pid"
  for _ in $(seq 200); do
    alive "$pid" || exit 0
    sleep 0.05
  done
  echo "daemon $pid did not stop" >&2
  exit 1
}

case ${1:-} in
  run) [ $# -eq 1 ] || { echo "usage: $0 start|stop|status|reload|run" >&2; exit 2; }; do_run ;;
  start) do_start ;;
  stop) do_stop ;;
  status)
    if pid=$(running_pid); then echo "running $pid"; exit 0; fi
    echo "stopped"; exit 3 ;;
  reload)
    if pid=$(running_pid); then kill -HUP "$pid"; exit 0; fi
    echo "not running" >&2; exit 1 ;;
  *) echo "usage: $0 start|stop|status|reload|run" >&2; exit 2 ;;
esac
SCRIPT
chmod 755 /app/daemon.sh
export DAEMON_PIDFILE=/tmp/demo/d.pid DAEMON_LOG=/tmp/demo/d.log
/app/daemon.sh start
/app/daemon.sh status
/app/daemon.sh reload
sleep 1
/app/daemon.sh stop
/app/daemon.sh status || true
cat /tmp/demo/d.log
rm -rf /tmp/demo
