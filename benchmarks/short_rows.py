"""N short rows (2-8 words from a small vocabulary), seeded, as CSV: python benchmarks/short_rows.py N OUT.csv"""
import random, sys
words = "password settings card app profile email crash refund invoice login reset charge bill account error slow page update".split()
rng = random.Random(0)
n = int(sys.argv[1])
with open(sys.argv[2], "w") as f:
    f.write("id,text\n")
    for i in range(n):
        f.write(f"{i:07d},{' '.join(rng.choice(words) for _ in range(rng.randint(2, 8)))}\n")
