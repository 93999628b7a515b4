#!/bin/bash
# Build /app/srv with a fixed set of modes (some deliberately unsafe).
set -euo pipefail
S=/app/srv
mkdir -p $S/www/cache $S/shared $S/bin $S/logs $S/projects/alpha $S/etc
f() { printf '%s\n' "$3" > "$1"; chmod "$2" "$1"; }
b() { cp /bin/true "$1"; chmod "$2" "$1"; }
f $S/www/index.html 0644 '<h1>hi</h1>'
f $S/www/upload.php 0666 '<?php // upload ?>'
f $S/www/cache/page1.html 0646 'cached'
f $S/www/cache/page2.html 0644 'cached'
f $S/shared/notes.txt 0664 'notes'
f $S/shared/drop.sh 0777 'echo drop'
f $S/logs/app.log 0622 'log'
f $S/logs/error.log 0640 'log'
f $S/projects/alpha/plan.md 0664 'plan'
f $S/etc/app.conf 0600 'secret=1'
b $S/bin/backup 4755
b $S/bin/ping-helper 4755
b $S/bin/report 2755
b $S/bin/both 6777
b $S/bin/mailer 2711
b $S/bin/tool 0755
b $S/bin/sticky-tool 1755
ln -s /etc/passwd $S/etc/passwd-link
ln -s ../shared/drop.sh $S/bin/drop
printf '%s\n' /app/srv/bin/ping-helper /app/srv/bin/mailer > $S/etc/allowed_setuid.txt
chmod 0644 $S/etc/allowed_setuid.txt
chmod 0777 $S/www/cache
chmod 1777 $S/shared
chmod 0757 $S/logs
chmod 2775 $S/projects
chmod 0755 $S $S/www $S/bin $S/projects/alpha $S/etc
