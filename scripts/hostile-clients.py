#!/usr/bin/env python3
# Usage: scripts/hostile-clients.py PORT PID MODE   (against a fresh `tally serve`, PID its process)
# The cheap attacks of the 2026-11-27 resource review (docs/reliability.md), each printing
# what it measured:
#   noread    500 clients each ask POST /v1/query for ~5.4 MB (47 h of minutes, 34 times)
#             and read nothing; prints the server's RSS (max_answer_bytes_in_flight bounds it)
#   manyns    one POST /v1/events of 50 000 events, each in a new namespace, then one of
#             another 50 000; prints each answer, its time and the server's RSS (by default
#             `max_namespaces` refuses both; with it at 100 000 in the config both pass:
#             restart the server on the same directory to time the replay, its log line)
#   dashbomb  one key with 20 000 events of 16 new dimension names each, then its dashboard;
#             prints the answer's status and time, and the server's CPU time
import json, random, socket, string, sys, time, urllib.request

port, pid, mode = int(sys.argv[1]), sys.argv[2], sys.argv[3]
base = f"http://127.0.0.1:{port}"


def post(path, body, ctype="application/json"):
    req = urllib.request.Request(base + path, data=body, method="POST", headers={"Content-Type": ctype})
    try:
        with urllib.request.urlopen(req, timeout=120) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def status(*fields):
    out = {}
    for line in open(f"/proc/{pid}/status"):
        k = line.split(":")[0]
        if k in fields:
            out[k] = line.split()[1] + " kB"
    return out


def cpu_seconds():
    f = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(f[11]) + int(f[12])) / 100


if mode == "noread":
    post("/v1/events", json.dumps([{"ns": "clicks", "key": "k"}]).encode())
    now = int(time.time()) // 60 * 60
    q = {"kind": "series", "ns": "clicks", "key": "k", "from": now - 47 * 3600, "to": now, "unit": "minute"}
    body = json.dumps({"queries": [q] * 34}).encode()
    req = b"POST /v1/query HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(body) + body
    socks = []
    for _ in range(500):
        s = socket.socket()
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        s.connect(("127.0.0.1", port))
        s.sendall(req)
        socks.append(s)
    time.sleep(10)
    print("500 clients reading nothing:", status("VmRSS", "VmHWM"))
elif mode == "manyns":
    print("before:", status("VmRSS"))
    for start in (0, 50_000):
        events = [{"ns": f"z{i:07d}", "key": "k"} for i in range(start, start + 50_000)]
        t = time.time()
        code, answer = post("/v1/events", json.dumps(events).encode())
        print(code, answer[:120], f"in {time.time() - t:.2f} s;", status("VmRSS"))
elif mode == "dashbomb":
    def name():
        return "".join(random.choices(string.ascii_lowercase, k=10))
    body = "\n".join(json.dumps({"ns": "bomb", "key": "k", "dims": {name(): "v" for _ in range(16)}}) for _ in range(20_000))
    print(post("/v1/events", body.encode(), "application/x-ndjson")[0])
    day = time.strftime("%Y-%m-%d", time.gmtime())
    cpu, t = cpu_seconds(), time.time()
    try:
        with urllib.request.urlopen(f"{base}/v1/ns/bomb/keys/k/dashboard?from={day}T00:00:00Z&unit=hour&to={day}T23:00:00Z", timeout=120) as r:
            code = r.status
    except urllib.error.HTTPError as e:
        code = e.code
    print(f"dashboard: {code} in {time.time() - t:.2f} s")
    time.sleep(5)
    print(f"server CPU for it, 5 s later: {cpu_seconds() - cpu:.1f} s")
else:
    sys.exit(f"unknown mode {mode}: noread, manyns or dashbomb")
