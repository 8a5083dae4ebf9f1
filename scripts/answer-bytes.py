#!/usr/bin/env python3
# The black-box review's long-values dashboard: 21 batches of 480 events, each of 16 values
# of 2 KB, to one key, then a dashboard of each limit given (6000 and 10000 by default); prints
# status, size and the server's RSS / peak RSS.
# Usage: scripts/answer-bytes.py PATH/TO/tally PORT [LIMIT...]
import subprocess, sys, time, json, http.client, os, shutil
binary, port = sys.argv[1], int(sys.argv[2])
limits = [int(a) for a in sys.argv[3:]] or [6000, 10000]
d = f"/tmp/answer-bytes-data{port}"
shutil.rmtree(d, ignore_errors=True)
p = subprocess.Popen([binary, "serve", "--data", d, "--listen", f"127.0.0.1:{port}"], stderr=subprocess.DEVNULL)
time.sleep(1.5)
def req(method, path, body=None):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=300)
    c.request(method, path, body=body, headers={"Content-Type": "application/json"})
    r = c.getresponse(); data = r.read(); c.close(); return r.status, data
def rss():
    s = open(f"/proc/{p.pid}/status").read()
    g = lambda k: int([l for l in s.splitlines() if l.startswith(k)][0].split()[1]) // 1024
    return g("VmRSS:"), g("VmHWM:")
now = int(time.time())
for j in range(21):
    evs = [{"ns": "plain", "key": "hot", "ts": now - 60, "dims": {f"d{q}": f"{j}_{i}_" + "x" * 2030 for q in range(16)}} for i in range(480)]
    st, _ = req("POST", "/v1/events", json.dumps(evs))
    assert st == 200, st
print("after writes: rss/hwm MB", rss())
h = (now // 3600) * 3600
for limit in limits:
    t = time.time()
    st, data = req("GET", f"/v1/ns/plain/keys/hot/dashboard?from={h - 3600}&to={h + 3600}&unit=hour&limit={limit}")
    print(f"limit={limit}: {st} {len(data)} bytes in {time.time() - t:.2f}s; rss/hwm MB", rss(), data[:120] if st != 200 else b"")
p.terminate(); p.wait()
shutil.rmtree(d, ignore_errors=True)
