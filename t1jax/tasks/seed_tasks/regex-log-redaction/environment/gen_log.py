"""Deterministically generate /app/raw/app.log (bytes; fixed seed) with secrets and near misses."""
import os
import random

rnd = random.Random(2718)
AL = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789"
UP = "ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"


def s(alpha, n):
    return "".join(rnd.choice(alpha) for _ in range(n))


def digits(n):
    return "".join(rnd.choice("0123456789") for _ in range(n))


def email():
    return rnd.choice(["john.doe", "a_b+tag", "ops", "x-1", "Mary.O'Neil".replace("'", ""), "99bottles"]) + \
        "@" + rnd.choice(["example.com", "mail.example.co.uk", "corp-intra.net", "t.io"])


def ip():
    return ".".join(str(rnd.choice([rnd.randint(0, 9), rnd.randint(10, 99), rnd.randint(100, 255)])) for _ in range(4))


def card():
    d = [digits(4) for _ in range(4)]
    return rnd.choice(["".join(d), " ".join(d), "-".join(d)])


def key():
    return rnd.choice([f"sk_live_{s(AL, 24)}", f"sk_test_{s(AL, 24)}", f"AKIA{s(UP, 16)}"])


templates = [
    lambda: f"user {email()} logged in from {ip()}",
    lambda: f"payment ok card={card()} amount=12.50 client={ip()}:8443",
    lambda: f"config loaded: api_key={key()} region=eu-west-1",
    lambda: f"notify <{email()}>, cc: {email()}.",
    lambda: f"upstream [{ip()}] responded 200 in 1.25ms",
    lambda: f"Authorization: Bearer {key()}",
    lambda: f"card on file: {card()}; backup card {card()}",
    # near misses: must stay untouched
    lambda: f"version 1.2.3.4.5 of lib {digits(3)}.{digits(3)}.{digits(3)}.{digits(3)}9",
    lambda: f"bad ip 999.{rnd.randint(1, 9)}.1.1 and 10.0.0.256 and 1.2.3 and 7.7.7.7.7",
    lambda: f"order id {digits(17)} and short {digits(15)} and mixed {digits(4)} {digits(4)}-{digits(4)} {digits(4)}",
    lambda: f"token sk_live_{s(AL, 23)} too short, sk_test_{s(AL, 30)} too long, AKIA{s(UP, 15)}",
    lambda: f"not an email: user@localhost, @handle, foo@bar, x@y.z",
    lambda: f"plain message {s(AL, 12)} with unicode caf\xe9 bytes",
    lambda: "heartbeat ok",
]
lines = []
for i in range(300):
    t = f"2024-06-{1 + i // 20:02d}T{i % 24:02d}:{i % 60:02d}:00Z"
    text = rnd.choice(templates)()
    raw = f"{t} {text}".encode("latin-1")
    eol = b"\r\n" if rnd.random() < 0.1 else b"\n"
    lines.append(raw + eol)
os.makedirs("/app/raw", exist_ok=True)
with open("/app/raw/app.log", "wb") as f:
    f.write(b"".join(lines) + b"trailing line without newline 192.168.0.1")
