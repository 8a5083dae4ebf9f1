#!/usr/bin/env python3
"""Schema changes, black-box: random schemas, events, schema changes (tiers added and
removed, retentions grown and shrunk, breakdown tiers, allow-lists and compounds) and restarts,
sent alike to a tally server on the embedded engine and one on Redis; every query answer is
checked against an oracle of the events sent (a `200` must be exact; a refusal must be
`no_tier_for_range`), and the two backends against each other.

    cargo build --release && scripts/schema-changes.py      # NSCEN=30 SEED=7 for more

Environment: TALLY_BIN (default target/release/tally), NSCEN (scenarios, 20), SEED, QPS
(queries per round, 40), EMB_PORT/RED_PORT/REDIS_PORT (17071/17072/16399), MAXF (the
servers' max_future_secs the oracle assumes, 3600; with CONFIG, a TOML that sets it).
Starts its own redis-server (from PATH) and servers, in a temporary directory, and stops
them. Prints its counts and every mismatch; exits 1 if there was one. stdlib only.
"""
import json, random, sys, time, os, math, subprocess, signal, urllib.request, urllib.parse, urllib.error, collections, tempfile

BIN = os.environ.get("TALLY_BIN", "target/release/tally")
EMB_PORT = int(os.environ.get("EMB_PORT", 17071))
RED_PORT = int(os.environ.get("RED_PORT", 17072))
REDIS_PORT = int(os.environ.get("REDIS_PORT", 16399))
WORK = tempfile.mkdtemp(prefix="tally-schema-changes-")
DATA = os.environ.get("DATA", os.path.join(WORK, "data"))
CONFIG = os.environ.get("CONFIG")  # optional toml
MAXF = int(os.environ.get("MAXF", 3600))
SEED = int(os.environ.get("SEED", 1))
NSCEN = int(os.environ.get("NSCEN", 20))
QPS = int(os.environ.get("QPS", 40))  # queries per query round
LOG = open(os.environ.get("LOG", os.path.join(WORK, "driver.log")), "a")

rng = random.Random(SEED)
stats = collections.Counter()
bugs = []

def log(*a):
    s = " ".join(str(x) for x in a)
    print(s, file=LOG, flush=True)

def http(port, method, path, body=None, params=None):
    url = f"http://127.0.0.1:{port}{path}"
    if params:
        url += "?" + urllib.parse.urlencode(params)
    data = None
    headers = {}
    if body is not None:
        data = json.dumps(body).encode()
        headers["Content-Type"] = "application/json"
    req = urllib.request.Request(url, data=data, method=method, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, json.loads(r.read() or b"null"), url
    except urllib.error.HTTPError as e:
        raw = e.read()
        try:
            return e.code, json.loads(raw), url
        except Exception:
            return e.code, raw.decode(errors="replace"), url

# ---------------- servers ----------------
procs = {}

def start_emb():
    args = [BIN, "serve", "--data", DATA, "--listen", f"127.0.0.1:{EMB_PORT}"]
    if CONFIG: args += ["--config", CONFIG]
    procs["emb"] = subprocess.Popen(args, stdout=open(os.path.join(WORK, "emb.log"), "a"), stderr=subprocess.STDOUT)
    wait_health(EMB_PORT)

def start_red():
    args = [BIN, "serve", "--backend", f"redis://127.0.0.1:{REDIS_PORT}/0", "--listen", f"127.0.0.1:{RED_PORT}"]
    if CONFIG: args += ["--config", CONFIG]
    procs["red"] = subprocess.Popen(args, stdout=open(os.path.join(WORK, "red.log"), "a"), stderr=subprocess.STDOUT)
    wait_health(RED_PORT)

def wait_health(port):
    for _ in range(300):
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2) as r:
                if r.status == 200: return
        except Exception:
            pass
        time.sleep(0.1)
    raise SystemExit(f"server on {port} not healthy")

def stop(name):
    p = procs.get(name)
    if p and p.poll() is None:
        p.send_signal(signal.SIGTERM)
        try: p.wait(15)
        except subprocess.TimeoutExpired:
            p.kill(); p.wait()

def restart_emb():
    stop("emb"); start_emb(); stats["restarts"] += 1

# ---------------- schema model ----------------
RES = {"1s": 1, "10s": 10, "1m": 60, "5m": 300, "15m": 900, "30m": 1800, "1h": 3600}
RETS = {"2h": 7200, "6h": 21600, "1d": 86400, "2d": 172800, "3d": 259200, "7d": 604800, "forever": None}
SIMPLE = ["country", "device", "status"]
COMPOUNDS = ["country+device", "device+status", "country+status"]
VALS = {"country": ["US", "DE", "FR", "a|b"], "device": ["mobile", "desktop", "x\\y"], "status": ["200", "404", "500"]}

def dur_s(r):
    return RETS[r]

def rand_ret(res):
    opts = [k for k, v in RETS.items() if v is None or v >= RES[res]]
    if res == "1s": opts = ["2h", "6h"]
    if res == "10s": opts = ["2h", "6h", "1d"]
    return rng.choice(opts)

class Model:
    """Our idea of the schema and of coverage (whole_from) per thing."""
    def __init__(self, tiers, bd, dims):
        self.tiers = dict(tiers)  # res -> ret key
        self.bd = set(bd)
        self.dims = dims  # list or None
        self.tot_from = {r: -10**12 for r in self.tiers}
        self.sub_from = {r: -10**12 for r in self.bd}
        self.dim_from = {d: -10**12 for d in (dims or [])}
        self.others_from = -10**12
    def schema(self):
        return {"tiers": [f"{r}:{self.tiers[r]}" for r in sorted(self.tiers, key=lambda r: RES[r])],
                "breakdown_tiers": sorted(self.bd, key=lambda r: RES[r]),
                "dimensions": self.dims}
    def clone(self):
        m = Model({}, [], None)
        m.__dict__ = json.loads(json.dumps(self.__dict__, default=list))
        m.bd = set(m.bd)
        return m

def rand_schema():
    n = rng.randint(1, 3)
    rs = rng.sample(list(RES), n)
    tiers = {r: rand_ret(r) for r in rs}
    bd = rng.sample(rs, rng.randint(1, len(rs)))
    if rng.random() < 0.35:
        dims = None
    else:
        dims = rng.sample(SIMPLE, rng.randint(1, 3))
        if rng.random() < 0.5:
            dims.append(rng.choice(COMPOUNDS))
    return Model(tiers, bd, dims)

def mutate(m, now):
    """Return (new model, description). Updates model coverage like the docs say."""
    m = m.clone()
    wf = now + MAXF + 1
    ops = ["add_tier", "add_bd", "grow_ret", "add_dim", "add_dim", "add_tier", "add_bd", "shrink_ret", "rm_tier", "rm_bd", "allow_null", "allow_list"]
    for _ in range(50):
        op = rng.choice(ops)
        if op == "add_tier":
            cand = [r for r in RES if r not in m.tiers]
            if not cand: continue
            r = rng.choice(cand); m.tiers[r] = rand_ret(r); m.tot_from[r] = wf
            if rng.random() < 0.5: m.bd.add(r); m.sub_from[r] = wf
            return m, f"add_tier {r}:{m.tiers[r]}"
        if op == "add_bd":
            cand = [r for r in m.tiers if r not in m.bd]
            if not cand: continue
            r = rng.choice(cand); m.bd.add(r); m.sub_from[r] = wf
            return m, f"add_bd {r}"
        if op == "grow_ret":
            cand = [r for r in m.tiers if m.tiers[r] != "forever"]
            if not cand: continue
            r = rng.choice(cand); old = RETS[m.tiers[r]]
            bigger = [k for k, v in RETS.items() if v is None or v > old]
            m.tiers[r] = rng.choice(bigger)
            m.tot_from[r] = max(m.tot_from[r], now - old)
            if r in m.bd: m.sub_from[r] = max(m.sub_from[r], now - old)
            return m, f"grow_ret {r}:{m.tiers[r]}"
        if op == "shrink_ret":
            cand = [r for r in m.tiers if m.tiers[r] != "2h" and RES[r] >= 10]
            if not cand: continue
            r = rng.choice(cand); old = RETS[m.tiers[r]]
            smaller = [k for k, v in RETS.items() if v is not None and (old is None or v < old) and v >= RES[r]]
            if not smaller: continue
            m.tiers[r] = rng.choice(smaller)
            return m, f"shrink_ret {r}:{m.tiers[r]}"
        if op == "rm_tier":
            if len(m.tiers) < 2: continue
            r = rng.choice(list(m.tiers))
            if m.bd == {r}: continue
            del m.tiers[r]; m.bd.discard(r); m.tot_from.pop(r, None); m.sub_from.pop(r, None)
            return m, f"rm_tier {r}"
        if op == "rm_bd":
            if len(m.bd) < 2: continue
            r = rng.choice(list(m.bd)); m.bd.discard(r); m.sub_from.pop(r, None)
            return m, f"rm_bd {r}"
        if op == "add_dim":
            if m.dims is None: continue
            cand = [d for d in SIMPLE + COMPOUNDS if d not in m.dims]
            if not cand: continue
            d = rng.choice(cand); m.dims = m.dims + [d]; m.dim_from[d] = wf
            return m, f"add_dim {d}"
        if op == "allow_null":
            if m.dims is None: continue
            m.dims = None
            for d in SIMPLE:
                if d not in m.dim_from: pass
            m.others_from = wf
            return m, "allow_null"
        if op == "allow_list":
            if m.dims is not None: continue
            dims = rng.sample(SIMPLE, rng.randint(1, 3))
            if rng.random() < 0.7: dims.append(rng.choice(COMPOUNDS))
            for d in dims:
                if "+" in d: m.dim_from[d] = wf
                else: m.dim_from[d] = max(m.dim_from.get(d, -10**12), m.others_from)
            m.dims = dims
            return m, f"allow_list {dims}"
    return m, "noop"

# ---------------- oracle ----------------
def esc(s):
    return s.replace("\\", "\\\\").replace("|", "\\|")

def dim_value(ev, dim):
    d = ev.get("dims") or {}
    if "+" in dim:
        parts = dim.split("+")
        if all(p in d for p in parts):
            return "|".join(esc(d[p]) for p in parts)
        return None
    return d.get(dim)

def in_range(evs, lo, hi, key=None):
    return [e for e in evs if lo <= e["ts"] < hi and (key is None or e["key"] == key)]

def total(evs):
    return sum(e["n"] for e in evs)

def breakdown_oracle(evs, dim, limit):
    cnt = collections.Counter()
    for e in evs:
        v = dim_value(e, dim)
        if v is not None:
            cnt[v] += e["n"]
    vals = [(v, n) for v, n in cnt.items() if n != 0]
    vals.sort(key=lambda x: (-x[1], x[0].encode()))
    top = vals[:limit]
    other = sum(n for _, n in vals[limit:])
    tot = total(evs)
    unset = tot - sum(cnt.values())
    return {"values": [{"value": v, "n": n} for v, n in top], "other": other, "unset": unset, "total": tot}

# ---------------- scenario ----------------
KEYS = ["k1", "k2", "k/3", "k4"]

def allowed_simple(m):
    if m.dims is None: return SIMPLE
    s = set()
    for d in m.dims:
        for p in d.split("+"): s.add(p)
    return sorted(s)

def max_ret(m):
    rs = [RETS[v] for v in m.tiers.values()]
    return None if None in rs else max(rs)

def gen_events(ns, m, now, count):
    mr = max_ret(m)
    span = 3 * 86400 if mr is None else min(mr, 3 * 86400)
    evs = []
    for _ in range(count):
        x = rng.random()
        if x < 0.05:
            ts = now + rng.randint(0, MAXF)  # future
        elif x < 0.08:
            ts = now - rng.randint(0, 4 * 86400)  # maybe beyond retention
        elif x < 0.4:
            ts = now - rng.randint(0, 3 * 3600)  # recent
        else:
            ts = now - rng.randint(0, span - 60)
        dims = {}
        for d in allowed_simple(m):
            if rng.random() < 0.6:
                dims[d] = rng.choice(VALS[d])
        n = rng.choice([1, 1, 1, 2, 3, 5, 10, 0, -1]) if rng.random() < 0.3 else 1
        evs.append({"ns": ns, "key": rng.choice(KEYS), "ts": ts, "n": n, "dims": dims})
    return evs

def post_events(port, evs, oracle, tag):
    # in batches of 10
    for i in range(0, len(evs), 10):
        b = evs[i:i + 10]
        st, body, _ = http(port, "POST", "/v1/events", b)
        stats[f"post_{tag}_{st}"] += 1
        if st == 200:
            oracle.extend(b)
        else:
            log("post rejected", tag, st, body)
        yield st

BACK = {"emb": EMB_PORT, "red": RED_PORT}

def rand_range(now):
    a = now - rng.randint(0, 3 * 86400 + 7200)
    if rng.random() < 0.2:
        a = now - rng.randint(0, 3 * 3600)
    length = rng.choice([60, 300, 3600, 7200, 6 * 3600, 86400, 2 * 86400, rng.randint(1, 3 * 86400)])
    b = a + length
    if rng.random() < 0.1:
        b = now + rng.randint(0, 3600)
        a = min(a, b)
    return a, b

def gen_query(ns, m, now):
    kind = rng.choice(["series", "series", "series_dim", "breakdown", "breakdown", "top", "window", "dashboard"])
    key = rng.choice(KEYS)
    a, b = rand_range(now)
    tz = rng.choice(["UTC", "America/New_York"])
    unit = rng.choice(["minute", "hour", "hour", "day"])
    if unit == "minute" and b - a > 86400 * 2:
        b = a + rng.randint(60, 86400)
    known_dims = (m.dims if m.dims is not None else SIMPLE) + ([rng.choice(COMPOUNDS)] if rng.random() < 0.15 else [])
    dim = rng.choice(known_dims)
    qkey = urllib.parse.quote(key, safe="")
    if kind == "series":
        p = {"from": a, "to": b, "unit": unit, "tz": tz}
        if unit != "day" and rng.random() < 0.2: p["every"] = rng.choice([2, 3, 5] if unit == "minute" else [2, 3, 6])
        return kind, f"/v1/ns/{ns}/keys/{qkey}/series", p, key
    if kind == "series_dim":
        vals = dim_value({"dims": {d: rng.choice(VALS[d]) for d in SIMPLE}}, dim)
        p = {"from": a, "to": b, "unit": unit, "tz": tz, "dim": dim, "value": vals}
        return kind, f"/v1/ns/{ns}/keys/{qkey}/series", p, key
    if kind == "breakdown":
        p = {"dim": dim, "from": a, "to": b, "tz": tz, "limit": rng.randint(1, 5)}
        if rng.random() < 0.6: p["unit"] = unit
        else:
            r = RES[rng.choice(list(m.tiers))] if rng.random() < 0.8 else 3600
            p["from"] = a // r * r; p["to"] = max(b // r * r, p["from"])
            del p["tz"]
        return kind, f"/v1/ns/{ns}/keys/{qkey}/breakdown", p, key
    if kind == "top":
        p = {"from": a, "to": b, "unit": rng.choice(["hour", "day", "minute"]), "tz": tz, "limit": rng.randint(1, 4)}
        if p["unit"] == "minute" and b - a > 86400 * 2: p["unit"] = "hour"
        if rng.random() < 0.3:
            p["dim"] = dim
            p["value"] = dim_value({"dims": {d: rng.choice(VALS[d]) for d in SIMPLE}}, dim)
        return kind, f"/v1/ns/{ns}/top", p, None
    if kind == "window":
        p = {"last": rng.choice(["60s", "5m", "1h", "6h", "24h", "2d", "3d"])}
        return kind, f"/v1/ns/{ns}/keys/{qkey}/window", p, key
    p = {"from": a, "to": b, "unit": unit if unit != "minute" else "hour", "tz": tz, "limit": rng.randint(1, 5)}
    return "dashboard", f"/v1/ns/{ns}/keys/{qkey}/dashboard", p, key

def check_points(points, to, evs, key, filt=None):
    errs = []
    for i, pt in enumerate(points):
        hi = points[i + 1]["ts"] if i + 1 < len(points) else to
        sel = in_range(evs, pt["ts"], hi, key)
        if filt: sel = [e for e in sel if dim_value(e, filt[0]) == filt[1]]
        exp = total(sel)
        if pt["n"] != exp:
            errs.append(f"point {pt['ts']}..{hi}: got {pt['n']} want {exp}")
    return errs

def check(kind, p, key, body, evs, m, now):
    """Return list of error strings for a 200 answer."""
    errs = []
    if kind == "window":
        r = parse_res(body["resolution"])
        last = parse_dur(p["last"])
        k = math.ceil(last / r)
        lo = body["from"]; hi = lo + k * r
        exp = total(in_range(evs, lo, hi, key))
        if body["n"] != exp:
            errs.append(f"window n={body['n']} want {exp} (from {lo} res {body['resolution']})")
        return errs
    lo, hi = body["from"], body["to"]
    if lo > p["from"] or hi < p["to"]:
        errs.append(f"effective range [{lo},{hi}) does not cover requested [{p['from']},{p['to']})")
    sel = in_range(evs, lo, hi, key)
    if kind in ("series", "series_dim"):
        filt = (p["dim"], p["value"]) if "dim" in p else None
        s2 = [e for e in sel if dim_value(e, filt[0]) == filt[1]] if filt else sel
        if body["total"] != total(s2):
            errs.append(f"total {body['total']} want {total(s2)} res={body['resolution']}")
        errs += check_points(body["points"], hi, evs, key, filt)
    elif kind == "breakdown":
        o = breakdown_oracle(sel, p["dim"], p["limit"])
        got = {k: body[k] for k in ("values", "other", "unset", "total")}
        if got != o:
            errs.append(f"breakdown got {got} want {o} res={body['resolution']}")
    elif kind == "top":
        if "dim" in p:
            sel = [e for e in sel if dim_value(e, p["dim"]) == p["value"]]
        c = collections.Counter()
        for e in sel: c[e["key"]] += e["n"]
        ks = [(k, n) for k, n in c.items() if n != 0]
        ks.sort(key=lambda x: (-x[1], x[0].encode()))
        want = {"keys": [{"key": k, "n": n} for k, n in ks[:p["limit"]]], "other": sum(n for _, n in ks[p["limit"]:]), "total": total(sel)}
        got = {k: body[k] for k in ("keys", "other", "total")}
        if got != want:
            errs.append(f"top got {got} want {want} res={body['resolution']}")
    elif kind == "dashboard":
        if body["total"] != total(sel):
            errs.append(f"dashboard total {body['total']} want {total(sel)}")
        errs += check_points(body["timeline"], hi, evs, key)
        dims_seen = set()
        cand = set(SIMPLE) | set(m.dims or []) | set(COMPOUNDS)
        for d in cand:
            o = breakdown_oracle(sel, d, p["limit"])
            nz = o["values"] or o["other"]
            bd = body.get("breakdowns", {}).get(d)
            if bd is not None:
                got = {k: bd[k] for k in ("values", "other", "unset", "total")}
                if got != o:
                    errs.append(f"dashboard breakdown {d} got {got} want {o}")
            elif nz and (m.dims is None and "+" not in d or m.dims is not None and d in m.dims):
                stats["dashboard_omitted_dim"] += 1
                log("dashboard omitted dim", d, "with nonzero values", o)
    return errs

def parse_dur(s):
    if s == "forever": return None
    u = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}
    return int(s[:-1]) * u[s[-1]]

def parse_res(s):
    return parse_dur(s)

def norm(st, body):
    if st == 200: return (st, body)
    if isinstance(body, dict) and "error" in body: return (st, body["error"].get("code"))
    return (st, body)

def run_queries(ns, m, now, n, history):
    for _ in range(n):
        kind, path, p, key = gen_query(ns, m, now)
        res = {}
        for b, port in BACK.items():
            st, body, url = http(port, "GET", path, params=p)
            res[b] = (st, body, url)
            stats[f"q_{kind}_{st}"] += 1
            stats["queries"] += 1
            if st == 200:
                errs = check(kind, p, key, body, ORACLE[b], m, time.time())
                if errs:
                    stats["bug_wrong_answer"] += 1
                    bugs.append((b, url, errs[:3]))
                    log("BUG", b, url, errs[:3], "schema", m.schema())
            elif st == 422 and isinstance(body, dict) and body["error"]["code"] == "no_tier_for_range":
                stats[f"refused_{kind}"] += 1
                ok = model_ok(kind, p, m, time.time())
                if ok:
                    stats["suspicious_refusal"] += 1
                    log("SUSPICIOUS_REFUSAL", b, url, body["error"]["message"], "model tiers", ok, "model", json.dumps(m.__dict__, default=list))
                log("REFUSED", b, kind, url, body["error"]["message"], "schema", m.schema())
            elif st >= 500:
                stats["server_5xx"] += 1
                bugs.append((b, url, [f"{st} {body}"]))
                log("5XX", b, url, st, body)
            else:
                log("other", b, url, st, body)
        ne, nr = norm(*res["emb"][:2]), norm(*res["red"][:2])
        if ne != nr:
            stats["emb_red_diff"] += 1
            log("DIFF", kind, res["emb"][2], "\n  emb:", json.dumps(ne)[:600], "\n  red:", json.dumps(nr)[:600], "schema", m.schema())
        if kind != "window":
            history.append((path, p, res["emb"][0], res["emb"][1]))

from zoneinfo import ZoneInfo
import datetime
def eff_from(p):
    f = p["from"]
    if "unit" not in p: return f
    tz = ZoneInfo(p.get("tz", "UTC"))
    d = datetime.datetime.fromtimestamp(f, tz)
    e = int(p.get("every", 1))
    if p["unit"] == "minute": d = d.replace(second=0, minute=d.minute // e * e)
    elif p["unit"] == "hour": d = d.replace(second=0, minute=0, hour=d.hour // e * e)
    else: d = d.replace(second=0, minute=0, hour=0)
    return int(d.timestamp())

def model_ok(kind, p, m, now):
    if kind == "window": return None
    ef = eff_from(p)
    if "unit" in p:
        e = int(p.get("every", 1))
        need = 60 * e if p["unit"] == "minute" else 3600
        aligned = lambda r: need % r == 0
    else:
        aligned = lambda r: p["from"] % r == 0 and p["to"] % r == 0
    dim = p.get("dim")
    sub = kind in ("breakdown", "series_dim", "dashboard") or (kind == "top" and dim)
    out = []
    for res, ret in m.tiers.items():
        r = RES[res]
        if not aligned(r): continue
        if RETS[ret] is not None and ef < now - RETS[ret] + 5: continue
        if ef < m.tot_from[res]: continue
        if sub:
            if res not in m.bd or ef < m.sub_from[res]: continue
            if dim and kind != "dashboard":
                if m.dims is not None:
                    if dim not in m.dims: return None
                    if ef < m.dim_from[dim]: continue
                else:
                    if "+" in dim: return None
                    if ef < max(m.others_from, m.dim_from.get(dim, -10**12)): continue
        out.append(res)
    return out

def put_schema(ns, m):
    out = {}
    for b, port in BACK.items():
        st, body, _ = http(port, "PUT", f"/v1/ns/{ns}", m.schema())
        out[b] = (st, body)
    return out

ORACLE = {}

def scenario(i):
    global ORACLE
    ns = f"s{SEED}x{i}x{int(time.time())}"
    ORACLE = {"emb": [], "red": []}
    for _ in range(20):
        m = rand_schema()
        r = put_schema(ns, m)
        if r["emb"][0] == 200 and r["red"][0] == 200: break
        if r["emb"][0] != r["red"][0]:
            log("schema PUT differs", r)
        log("schema rejected", m.schema(), r["emb"])
        stats["schema_rejected"] += 1
    else:
        return
    log(f"=== scenario {ns} schema", json.dumps(m.schema()))
    history = []
    now = int(time.time())
    evs = gen_events(ns, m, now, rng.randint(40, 150))
    for b, port in BACK.items():
        list(post_events(port, evs, ORACLE[b], b))
    run_queries(ns, m, now, QPS // 3, history)
    nchanges = rng.randint(1, 4)
    for c in range(nchanges):
        now = int(time.time())
        m2, desc = mutate(m, now)
        r = put_schema(ns, m2)
        log("change", desc, "->", r["emb"][0], r["red"][0], json.dumps(m2.schema()))
        if r["emb"][0] != r["red"][0]:
            stats["put_diff"] += 1
            log("DIFF put", r)
        if r["emb"][0] == 200:
            m = m2
            stats["changes"] += 1
            stats["change_" + desc.split()[0]] += 1
        else:
            stats["change_rejected"] += 1
            log("change rejected", r["emb"])
        evs = gen_events(ns, m, now, rng.randint(20, 80))
        for b, port in BACK.items():
            list(post_events(port, evs, ORACLE[b], b))
        history.clear()
        run_queries(ns, m, now, QPS // 2, history)
        if rng.random() < 0.35:
            restart_emb()
            recheck(history[-25:])
    run_queries(ns, m, int(time.time()), QPS, history)
    stats["scenarios"] += 1

def recheck(hist):
    for path, p, st, body in hist:
        st2, body2, url = http(EMB_PORT, "GET", path, params=p)
        stats["restart_rechecks"] += 1
        if norm(st, body) != norm(st2, body2):
            stats["restart_diff"] += 1
            bugs.append(("emb-restart", url, [f"before {norm(st, body)}"[:300], f"after {norm(st2, body2)}"[:300]]))
            log("RESTART DIFF", url, "\n before", json.dumps(norm(st, body))[:500], "\n after", json.dumps(norm(st2, body2))[:500])

def port_taken(port):
    import socket
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
        return True
    except OSError:
        return False

def start_redis():
    for port in (REDIS_PORT, EMB_PORT, RED_PORT):
        if port_taken(port):
            raise SystemExit(f"port {port} is in use: set REDIS_PORT, EMB_PORT, RED_PORT")
    procs["redis"] = subprocess.Popen(
        ["redis-server", "--port", str(REDIS_PORT), "--save", "", "--appendonly", "no",
         "--dir", WORK],
        stdout=open(os.path.join(WORK, "redis.log"), "a"), stderr=subprocess.STDOUT)
    for _ in range(100):
        try:
            import socket
            socket.create_connection(("127.0.0.1", REDIS_PORT), timeout=1).close()
            return
        except OSError:
            time.sleep(0.1)
    raise SystemExit(f"redis-server on {REDIS_PORT} did not start")

def main():
    try:
        start_redis()
        start_emb(); start_red()
        for i in range(NSCEN):
            scenario(i)
            print(i, dict(stats), flush=True)
    finally:
        stop("emb"); stop("red"); stop("redis")
    print("STATS", json.dumps(dict(sorted(stats.items())), indent=0))
    print("BUGS", len(bugs), "(logs in", WORK + ")")
    for b in bugs[:40]:
        print(b)
    sys.exit(1 if bugs else 0)

if __name__ == "__main__":
    main()
