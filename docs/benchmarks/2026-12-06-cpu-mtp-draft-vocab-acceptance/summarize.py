import glob, re, sys, collections, os
R = sys.argv[1]
tot = collections.defaultdict(lambda: [0, 0, 0, 0.0])
texts = collections.defaultdict(dict)
for f in glob.glob(f"{R}/gen_k*_*.txt"):
    k, dv, i = re.match(r"gen_k(\d+)_(\w+)_(\d+)\.txt", os.path.basename(f)).groups()
    s = open(f).read()
    m = re.search(r"drafts accepted (\d+)/(\d+) \(([\d.]+) tokens a step\)", s)
    a, d = int(m.group(1)), int(m.group(2))
    t = tot[(int(k), dv)]
    t[0] += a; t[1] += d; t[2] += 1
    texts[(int(k), i)][dv] = s.split("\n[")[0]
order = ["none", "2048", "1024", "512", "256"]
print("k  draft vocab  accepted/drafted  acceptance  same text as full vocab")
for k in (1, 3):
    for dv in order:
        a, d, n, _ = tot[(k, dv)]
        same = sum(texts[(k, str(i))][dv] == texts[(k, str(i))]["none"] for i in range(n))
        print(f"{k}  {dv:>10}  {a:5d}/{d:<5d}       {a/d:.3f}       {same}/{n}")
