import sys, os, time, cProfile, pstats
sys.path.insert(0, "benchmarks")
import overhead, tempfile
lvl = sys.argv[1]
net, batches, train_step = overhead._setup()
tmp = tempfile.mkdtemp()
cfg = overhead.write_config(tmp, {"task": "statistics", "level": lvl})
from msprobe.mindspore import PrecisionDebugger
dbg = PrecisionDebugger(config_path=cfg)
p = cProfile.Profile()
ts = {"start":[], "train":[], "stop":[], "step":[]}
for i in range(12):
    x, y = batches[i % len(batches)]
    t0=time.perf_counter()
    if i >= 6: p.enable()
    dbg.start(net)
    if i >= 6: p.disable()
    t1=time.perf_counter()
    loss = train_step(x, y)
    t2=time.perf_counter()
    if i >= 6: p.enable()
    dbg.stop()
    t3=time.perf_counter()
    dbg.step()
    if i >= 6: p.disable()
    t4=time.perf_counter()
    if i >= 2:
        for k, v in zip(ts, (t1-t0, t2-t1, t3-t2, t4-t3)): ts[k].append(v*1e3)
import statistics
print({k: round(statistics.median(v),2) for k, v in ts.items()})
pstats.Stats(p).sort_stats("cumtime").print_stats(40)
