import sys, os, time, statistics
sys.path.insert(0, "benchmarks")
import overhead, tempfile
lvl = sys.argv[1]
net, batches, train_step = overhead._setup()
tmp = tempfile.mkdtemp()
cfg = overhead.write_config(tmp, {"task": "statistics", "level": lvl})
from msprobe.mindspore import PrecisionDebugger
dbg = PrecisionDebugger(config_path=cfg)
ts = {"start":[], "train":[], "stop":[], "step":[], "off":[]}
for i in range(40):
    x, y = batches[i % len(batches)]
    if i % 2:
        t0=time.perf_counter(); train_step(x, y).asnumpy(); t1=time.perf_counter()
        if i > 4: ts["off"].append((t1-t0)*1e3)
        continue
    t0=time.perf_counter()
    dbg.start(net)
    t1=time.perf_counter()
    loss = train_step(x, y); loss.asnumpy()
    t2=time.perf_counter()
    dbg.stop()
    t3=time.perf_counter()
    dbg.step()
    t4=time.perf_counter()
    if i > 4:
        for k, v in zip(ts, (t1-t0, t2-t1, t3-t2, t4-t3)): ts[k].append(v*1e3)
print(lvl, {k: round(statistics.median(v),2) for k, v in ts.items()})
