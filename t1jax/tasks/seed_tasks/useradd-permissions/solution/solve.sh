#!/bin/bash
# Groups, users, homes, shared tree with setgid/sticky bits, and the legacy tree fix-up.
set -euo pipefail
groupadd -g 3000 devs
groupadd -g 3001 ops
useradd -u 3101 -g devs -G ops -d /home/alice -m -s /bin/bash -c "Alice Admin" alice
useradd -u 3102 -g devs -d /home/bob -m -s /bin/bash -c "Bob Builder" bob
useradd -u 3200 -g ops -d /srv/deploy -m -s /usr/sbin/nologin -c "Deploy Bot" deploy
usermod -L deploy
for u in alice bob deploy; do
  home=$(getent passwd "$u" | cut -d: -f6)
  chown "$u:$(id -gn "$u")" "$home"
  chmod 0750 "$home"
done

install -d -o root -g devs -m 2775 /srv/project
install -d -o root -g devs -m 2770 /srv/project/shared
install -d -o root -g devs -m 3770 /srv/project/drop
install -d -o deploy -g ops -m 2755 /srv/project/releases
# install -d does not change modes of existing dirs reliably with special bits: set them explicitly
chown root:devs /srv/project /srv/project/shared /srv/project/drop
chmod 2775 /srv/project; chmod 2770 /srv/project/shared; chmod 3770 /srv/project/drop
chown deploy:ops /srv/project/releases; chmod 2755 /srv/project/releases
chown deploy:ops /srv/project/secrets.env
chmod 0640 /srv/project/secrets.env

chown -R bob:devs /srv/legacy
find /srv/legacy -type d -exec chmod 2770 {} +
find /srv/legacy -type f ! -name '*.sh' -exec chmod 0660 {} +
find /srv/legacy -type f -name '*.sh' -exec chmod 0770 {} +

getent passwd alice bob deploy
getent group devs ops
stat -c '%A %U:%G %n' /srv/project /srv/project/* /home/* /srv/deploy
find /srv/legacy -exec stat -c '%A %U:%G %n' {} +
