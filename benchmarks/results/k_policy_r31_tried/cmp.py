"""Per-cell difference of two k_policy_replay.py tables: python cmp.py OLD.md NEW.md"""
import re, sys
def cells(path):
    out = {}
    for line in open(path):
        parts = [p.strip() for p in line.strip().strip("|").split("|")]
        if len(parts) == 5 and parts[0] not in ("workload", "---"):
            for b, text in zip((1, 2, 4, 8), parts[1:]):
                m = re.match(r"([+-]?[\d.]+) %", text)
                if m:
                    out[(parts[0], b)] = float(m.group(1))
    return out
old, new = cells(sys.argv[1]), cells(sys.argv[2])
worst = min((new[c] - old[c], c) for c in old)
print("mean %+.2f -> %+.2f; below -3: %d -> %d; worst change %+.1f at %s b%d" % (
    sum(old.values()) / len(old), sum(new.values()) / len(new), sum(v < -3 for v in old.values()),
    sum(v < -3 for v in new.values()), worst[0], *worst[1]))
for c in sorted(old):
    if abs(new[c] - old[c]) >= 0.5:
        print("  %s b%d %+.1f -> %+.1f" % (c[0], c[1], old[c], new[c]))
