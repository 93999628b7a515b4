"""Deterministically generate /app/access.log (Apache combined log format, fixed seed)."""
import random

rnd = random.Random(7370)
# weights give a clear head and several tied counts
ips = [f"10.0.{rnd.randint(0, 3)}.{rnd.randint(1, 254)}" for _ in range(25)]
ips += ["192.168.1.20", "192.168.1.3", "172.16.0.100", "172.16.0.99", "8.8.4.4"]
ips = sorted(set(ips))
weights = [rnd.choice([1, 2, 3, 5, 8, 13]) for _ in ips]
paths = ["/", "/index.html", "/api/v1/items", "/api/v1/items/42", "/login", "/static/app.js",
         "/static/style.css", "/favicon.ico", "/admin", "/search?q=shoes"]
methods = ["GET"] * 8 + ["POST", "PUT", "DELETE"]
statuses = [200] * 12 + [201, 204, 301, 302, 304, 400, 401, 403, 404, 404, 500, 502, 503]
agents = ["Mozilla/5.0 (X11; Linux x86_64)", "curl/8.4.0", "python-requests/2.31",
          "Mozilla/5.0 (Windows NT 10.0; Win64; x64) AppleWebKit/537.36"]
lines = []
for i in range(1500):
    ip = rnd.choices(ips, weights)[0]
    day = 10 + i * 5 // 1500
    t = f"{day:02d}/Mar/2024:{rnd.randint(0, 23):02d}:{rnd.randint(0, 59):02d}:{rnd.randint(0, 59):02d} +0000"
    status = rnd.choice(statuses)
    size = "-" if status in (204, 304) else str(rnd.randint(120, 90000))
    ref = rnd.choice(["-", "https://example.com/", "https://example.com/search?q=a b"])
    lines.append(f'{ip} - - [{t}] "{rnd.choice(methods)} {rnd.choice(paths)} HTTP/1.1" '
                 f'{status} {size} "{ref}" "{rnd.choice(agents)}"')
    if rnd.random() < 0.01:
        lines.append("")
    if rnd.random() < 0.01:
        lines.append(f"# logrotate marker {i} 10.9.9.9 200")
with open("/app/access.log", "w") as f:
    f.write("\n".join(lines) + "\n")
