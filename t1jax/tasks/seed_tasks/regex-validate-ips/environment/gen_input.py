"""Deterministic list of candidate addresses (fixed seed), with many edge cases."""
import random

rng = random.Random(99)
edge = ["0.0.0.0", "255.255.255.255", "256.1.1.1", "1.2.3", "1.2.3.4.5", "01.2.3.4", "1..2.3",
        "10.0.0.1 ", " 10.0.0.1", "192.168.001.1", "192.168.1.1", "1.2.3.-4", "+1.2.3.4",
        "::", "::1", "fe80::", "FE80::1", "fe80::1%eth0", "::ffff:192.0.2.1", "2001:db8::8a2e:370:7334",
        "2001:0db8:0000:0000:0000:ff00:0042:8329", "1:2:3:4:5:6:7:8", "1:2:3:4:5:6:7::",
        "::2:3:4:5:6:7:8", "1:2:3:4:5:6:7::8", "1::2:3:4:5:6:7:8", ":::", "1:::2", "12345::",
        "::1::", ":1:2:3:4:5:6:7", "1:2:3:4:5:6:7:8:", "g::1", "1:2:3:4:5:6:7", "abcd:EF01::",
        "localhost", "", "999.999.999.999", "1.2.3.4/24", "2001:db8::/32", "1.2.3.4\r", "0.0.0.00",
        "100.200.250.255", "8.8.8.8", "8.8.8.8"]
lines = list(edge)
for _ in range(120):
    kind = rng.random()
    if kind < 0.35:
        lines.append(".".join(str(rng.choice([0, 1, 9, 10, 99, 100, 199, 200, 249, 250, 255, 256, 300, rng.randint(0, 255)]))
                              for _ in range(4)))
    elif kind < 0.7:
        groups = [format(rng.randint(0, 0xffff), rng.choice(["x", "X", "04x"])) for _ in range(8)]
        if rng.random() < 0.5:
            i = rng.randint(0, 7)
            j = rng.randint(i, min(7, i + rng.randint(0, 4)))
            text = ":".join(groups[:i]) + "::" + ":".join(groups[j + 1:])
        else:
            text = ":".join(groups[:rng.choice([6, 7, 8, 8, 8, 9])])
        lines.append(text)
    else:
        lines.append(rng.choice(["", "n/a", "1.2.3.4.", "::g", "fe80:::1", "1.2.3.4:80", "[::1]", "0x7f.0.0.1"]))
rng.shuffle(lines)
with open("/app/input/addresses.txt", "w", newline="") as f:
    f.write("\n".join(lines) + "\n")
