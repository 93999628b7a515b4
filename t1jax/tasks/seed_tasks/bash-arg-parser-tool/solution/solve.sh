#!/bin/bash
# Write /app/txtool: getopts in silent mode (leading ':'), --help pre-check, validation of all
# inputs before any output, then a read loop applying the transformations in order.
set -euo pipefail
cat > /app/txtool <<'SH'
#!/bin/bash
USAGE='Usage: txtool [-u|-l] [-t] [-s] [-n] [-w WIDTH] [-p PREFIX] [-o OUTFILE] [--] FILE...'

help() {
  cat <<EOT
$USAGE

Transform the lines of FILE... (- means standard input) and print them.

  -u          convert to upper case
  -l          convert to lower case
  -t          trim leading and trailing spaces and tabs
  -s          skip blank lines
  -n          number output lines as "N: "
  -w WIDTH    truncate lines to WIDTH characters
  -p PREFIX   prepend PREFIX to each line
  -o OUTFILE  write to OUTFILE instead of standard output
  -h, --help  show this help and exit
EOT
}

die() { echo "txtool: $1" >&2; exit "${2:-2}"; }

if [ "${1-}" = "--help" ]; then help; exit 0; fi

upper=0 lower=0 trim=0 skip=0 number=0 width="" prefix="" outfile=""
while getopts ":ultsnw:p:o:h" opt; do
  case $opt in
    u) upper=1 ;;
    l) lower=1 ;;
    t) trim=1 ;;
    s) skip=1 ;;
    n) number=1 ;;
    w) [[ $OPTARG =~ ^[1-9][0-9]*$ ]] || die "invalid width: $OPTARG"; width=$OPTARG ;;
    p) prefix=$OPTARG ;;
    o) outfile=$OPTARG ;;
    h) help; exit 0 ;;
    :) die "option requires an argument: -$OPTARG" ;;
    \?) die "unknown option: -$OPTARG" ;;
  esac
done
shift $((OPTIND - 1))
[ $upper -eq 1 ] && [ $lower -eq 1 ] && die "-u and -l are mutually exclusive"
[ $# -gt 0 ] || die "no input files"
for f in "$@"; do
  [ "$f" = "-" ] && continue
  [ -f "$f" ] && [ -r "$f" ] || die "cannot read: $f" 3
done

process() {
  local n=0 line
  for f in "$@"; do
    [ "$f" = "-" ] && f=/dev/stdin
    while IFS= read -r line || [ -n "$line" ]; do
      if [ $trim -eq 1 ]; then
        line="${line#"${line%%[!$' \t']*}"}"
        line="${line%"${line##*[!$' \t']}"}"
      fi
      if [ $skip -eq 1 ] && [[ $line =~ ^[$' \t']*$ ]]; then continue; fi
      [ $upper -eq 1 ] && line=${line^^}
      [ $lower -eq 1 ] && line=${line,,}
      [ -n "$width" ] && line=${line:0:$width}
      line="$prefix$line"
      if [ $number -eq 1 ]; then n=$((n + 1)); line="$n: $line"; fi
      printf '%s\n' "$line"
    done < "$f"
  done
}

if [ -n "$outfile" ]; then
  process "$@" > "$outfile"
else
  process "$@"
fi
SH
chmod +x /app/txtool
/app/txtool -tsn -p '> ' /app/samples/notes.txt /app/samples/no-newline.txt
