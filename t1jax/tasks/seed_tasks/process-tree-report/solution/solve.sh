#!/bin/bash
# ptree.sh: build a ppid -> children map from `ps`, walk it depth-first; kill = collect, TERM,
# poll up to 3 s, KILL the rest.
set -euo pipefail
cat > /app/ptree.sh <<'SH'
#!/bin/bash
usage() { echo "usage: ptree.sh report|kill PID" >&2; exit 2; }
[ $# -eq 2 ] || usage
cmd=$1 pid=$2
[[ $pid =~ ^[1-9][0-9]*$ ]] || usage
[ "$cmd" = report ] || [ "$cmd" = kill ] || usage
[ -d "/proc/$pid" ] || { echo "ptree: no such process: $pid" >&2; exit 1; }

declare -A kids parent
while read -r p pp; do kids[$pp]+="$p "; parent[$p]=$pp; done < <(ps -e -o pid=,ppid=)

walk() {  # walk PID DEPTH: prints "DEPTH PID" depth-first, children by pid ascending
  echo "$2 $1"
  local c
  for c in $(printf '%s\n' ${kids[$1]:-} | sort -n); do walk "$c" $(($2 + 1)); done
}

gone() {  # gone PID: no longer exists, or is a zombie
  local line rest
  { read -r line < "/proc/$1/stat"; } 2>/dev/null || return 0
  rest=${line##*) }
  [ "${rest%% *}" = Z ]
}

now_ms() { echo $(( $(date +%s%N) / 1000000 )); }

if [ "$cmd" = report ]; then
  walk "$pid" 0 | while read -r depth p; do
    args=$(tr '\0' ' ' < "/proc/$p/cmdline" 2>/dev/null) || continue
    printf '%*s%s %s %s\n' $((depth * 2)) '' "$p" "${parent[$p]}" "${args% }"
  done
  exit 0
fi

set -- $(walk "$pid" 0 | awk '{ print $2 }')   # the whole set, before any signal
kill -TERM "$@" 2>/dev/null
deadline=$(( $(now_ms) + 3000 ))
while :; do
  alive=()
  for p in "$@"; do gone "$p" || alive+=("$p"); done
  [ ${#alive[@]} -eq 0 ] && exit 0
  [ "$(now_ms)" -ge "$deadline" ] && break
  sleep 0.05
done
kill -KILL "${alive[@]}" 2>/dev/null
while :; do
  left=0
  for p in "${alive[@]}"; do gone "$p" || left=1; done
  [ $left -eq 0 ] && exit 0
  sleep 0.05
done
SH
chmod +x /app/ptree.sh
# demo on a real tree
python3 /app/launcher.py > /tmp/launcher.out &
for _ in $(seq 100); do grep -q READY /tmp/launcher.out 2>/dev/null && break; sleep 0.1; done
root=$(awk '/READY/ { print $2 }' /tmp/launcher.out)
/app/ptree.sh report "$root"
/app/ptree.sh kill "$root"
wait || true
