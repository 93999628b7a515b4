#!/bin/bash
# Section-aware edits with sed ranges: backup, port, database host, debug keys, new [tls] section.
set -euo pipefail
cd /app/conf
cp -p server.ini server.ini.orig
sed -i \
  -e '/^\[server\]/,/^\[/ s/^port[[:space:]]*=.*/port = 8443/' \
  -e '/^\[database\]/,/^\[/ s/^host[[:space:]]*=.*/host = db.internal/' \
  -e 's/^\([[:space:]]*debug[[:space:]]*=.*\)$/; \1/' \
  server.ini
printf '\n[tls]\ncert = /etc/ssl/server.pem\nkey = /etc/ssl/server.key\n' >> server.ini
diff server.ini.orig server.ini || true
