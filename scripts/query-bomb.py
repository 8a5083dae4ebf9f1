#!/usr/bin/env python3
# Usage: scripts/query-bomb.py PORT   (against a `tally serve` holding one event of clicks/k)
# The /v1/query bomb of issue 9: 40 entries of 100k points each, in a 4 KB request,
# sent 64 times by 64 clients at once. Prints each distinct answer and the time taken.
import json, time, urllib.request, concurrent.futures, sys
port = sys.argv[1]
now = int(time.time()) // 3600 * 3600
q = {"kind": "series", "ns": "clicks", "key": "k", "from": now - 99999 * 3600, "to": now, "unit": "hour"}
def post(body):
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/query", data=body, headers={"Content-Type": "application/json"})
    try:
        r = urllib.request.urlopen(req); return (r.status, len(r.read()))
    except urllib.error.HTTPError as err:
        return (err.code, len(err.read()))
bomb = json.dumps({"queries": [q] * 40}).encode()
print("request bytes:", len(bomb))
t = time.time()
with concurrent.futures.ThreadPoolExecutor(64) as ex:
    res = list(ex.map(post, [bomb] * 64))
print("answers (status, bytes):", sorted(set(res)), "in", round(time.time() - t, 2), "s")
