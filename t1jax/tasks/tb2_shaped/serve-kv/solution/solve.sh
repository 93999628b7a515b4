#!/bin/bash
cat > /app/kv.py <<'PY'
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

STORE = {}


class Handler(BaseHTTPRequestHandler):
    def do_GET(self):
        value = STORE.get(self.path)
        self.send_response(404 if value is None else 200)
        self.end_headers()
        self.wfile.write(value or b"")

    def do_PUT(self):
        STORE[self.path] = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        self.send_response(200)
        self.end_headers()


ThreadingHTTPServer(("127.0.0.1", 8765), Handler).serve_forever()
PY
nohup python3 /app/kv.py > /app/kv.log 2>&1 &
for _ in $(seq 50); do
  python3 -c "import socket; socket.create_connection(('127.0.0.1', 8765))" 2>/dev/null && exit 0
  sleep 0.1
done
echo "the service did not start" >&2
exit 1
