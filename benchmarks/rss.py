"""Run a command; print wall seconds and the child's peak RSS (MB) as JSON."""
import json, resource, subprocess, sys, time
start = time.perf_counter()
proc = subprocess.run(sys.argv[1:], capture_output=True, text=True)
wall = time.perf_counter() - start
rss = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
print(proc.stderr[-1500:], file=sys.stderr)
print(json.dumps({"rc": proc.returncode, "wall_s": round(wall, 1), "peak_rss_mb": round(rss)}))
