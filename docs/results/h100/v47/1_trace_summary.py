import json, sys, statistics as st
res = json.load(open(sys.argv[1]))
for key, runs in res.items():
    print(key)
    for r in runs[1:]:
        tr = r["trace"]
        t0 = min(p[125] for p in tr)
        ends = [(p[127] - t0) / 1e3 for p in tr]
        # per-program mean whole-unit time over works that are full units (the first nw-4)
        rates = []
        for p in tr:
            ws = [(p[2 * w], p[2 * w + 1]) for w in range(62) if p[2 * w + 1] > 0]
            full = ws[:27]
            rates.append(st.mean((b - a) / 1e3 for a, b in full))
        print(f"  end mean {st.mean(ends):7.1f} max {max(ends):7.1f}  unit mean {st.mean(rates):.2f} "
              f"min {min(rates):.2f} max {max(rates):.2f} (spread {100*(max(rates)/min(rates)-1):.1f} %)")
