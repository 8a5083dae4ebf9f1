//! The Lua scripts tally runs in Redis. Each runs atomically on one node; in a cluster every
//! key a call names lies in one slot (the caller groups them so). They are sent with
//! `EVALSHA`, and loaded (`SCRIPT LOAD`) on the first `NOSCRIPT`, e.g. after a restart.

use std::sync::LazyLock;

use redis::Script;

/// Applies one slot's share of a batch (or, on a single server, the whole batch), once.
///
/// `ARGV[1]`: the marker's lifetime in seconds, or `0` for no marker. With a marker,
/// `KEYS[1]` is the batch's marker key, `ARGV[2]` the request's token (`-`: any), `ARGV[3]`
/// when the marker ends and `ARGV[4]` now, both by the store's clock. A marker holds
/// `<token>@<end>`, and one whose end has passed by the store's clock is taken as absent
/// (as an idempotency record is hidden then, even if Redis' clock differs). If the marker
/// exists the call changes nothing and answers `done` (this batch was applied here already:
/// by this request, or by anyone when the token is `-`) or `claimed` (another request set
/// it: a different request under the same idempotency key); otherwise it is set with the
/// rest, atomically.
///
/// `ARGV[5]`, `ARGV[6]`: a fence, or `0` and anything for none: the index in `KEYS` of a
/// lock and the token it must hold. If it holds another (or none), the call changes nothing
/// and answers `fenced` — or what the marker says, if it is there.
///
/// `ARGV[7]`: how many key index epochs to check, then for each the index of its token key
/// in `KEYS` (`tally:ke:{ns}`, set to the given fresh token if absent), the fresh token, and
/// the epoch the caller expects or `-`. A namespace's epoch is the node's `run_id` and
/// `master_replid` and its token: it changes when Redis restarts (and may have lost
/// writes), a replica is promoted (a failover, or a failback), or the token is lost
/// (Redis emptied). If one is not what the caller expects, the call changes nothing but
/// the tokens and answers `stale` (the caller had left out of the index keys it believed
/// listed). Answers `{status, epoch…}`: `applied`, `done`, `claimed`, `fenced` or `stale`,
/// then each epoch checked, in order.
///
/// Then a list of operations, each naming its keys by their index in `KEYS`:
///
/// - `h <key> <expireat|0> <count> (<field> <n>)*`: `HINCRBY` each field (a sum past 64
///   bits wraps, as the engine's counters do, rather than failing half-way), then `EXPIREAT`
///   (`0`: the hash is kept forever) if the hash is new or its expiry is earlier: an expiry
///   only grows, and a hash without one keeps none (a batch prepared under a shorter
///   retention than the tier's now cannot shorten what a longer one set).
/// - `i <directory key> <expiry key> <page prefix> <page size> <now> <prune> <count>
///   (<member> <expireat|inf>)*`: add keys to a namespace's paged index ([`INDEX_LUA`];
///   pages past the size split), then take out of it at most `prune` keys whose expiry is
///   at or before `now` (as [`PRUNE`] does), and set their expiries: an expiry only ever grows
///   (`ZADD GT`), and `inf` (a `forever` tier holds the key) takes the key out of the
///   expiry set, since it never expires. A key listed but not in the expiry set never gets
///   a finite expiry again.
///   Variadic calls of at most 256 members.
/// - `r <key> <record> <expireat>`: `SET NX` an idempotency record until `expireat`.
/// - `x <key> <count> (<resolution> <lo> <hi>)*`: widens a namespace's extent
///   (`layout::extent_key`) to take the bucket starts `lo` to `hi` at each resolution.
pub static APPLY: LazyLock<Script> =
    LazyLock::new(|| with_index(&format!("{WRAPPING_ADD_LUA}{APPLY_LUA}")));

/// `wrapping_add(x, y)`: the sum of two decimal 64-bit integers, modulo 2^64, in decimal.
const WRAPPING_ADD_LUA: &str = r#"
-- Counters are 64-bit and wrap on overflow, as the engine's do: `HINCRBY` refuses an
-- increment past 2^63 - 1 (or below -2^63), and failing there would leave the batch half
-- applied. Then the sum is worked out here, modulo 2^64, in two 32-bit halves (Lua's
-- numbers are doubles, exact below 2^53).
local W = 4294967296
local function negate(hi, lo)
  lo, hi = W - 1 - lo + 1, W - 1 - hi
  if lo == W then
    lo, hi = 0, (hi + 1) % W
  end
  return hi, lo
end
local function to64(s)
  local neg = string.sub(s, 1, 1) == '-'
  local hi, lo = 0, 0
  for d in string.gmatch(s, '%d') do
    lo = lo * 10 + tonumber(d)
    local carry = math.floor(lo / W)
    lo = lo - carry * W
    hi = (hi * 10 + carry) % W
  end
  if neg then
    return negate(hi, lo)
  end
  return hi, lo
end
local function wrapping_add(x, y)
  local h1, l1 = to64(x)
  local h2, l2 = to64(y)
  local lo, hi = l1 + l2, h1 + h2
  if lo >= W then
    lo, hi = lo - W, hi + 1
  end
  hi = hi % W
  local neg = hi >= W / 2
  if neg then
    hi, lo = negate(hi, lo)
  end
  local digits = {}
  repeat
    local r = hi % 10
    hi = (hi - r) / 10
    local v = r * W + lo
    local d = v % 10
    lo = (v - d) / 10
    table.insert(digits, 1, string.format('%d', d))
  until hi == 0 and lo == 0
  return (neg and '-' or '') .. table.concat(digits)
end
"#;

/// A script with the key index's functions ([`INDEX_LUA`]) before it.
fn with_index(body: &str) -> Script {
    Script::new(&format!("{INDEX_LUA}{body}"))
}

/// The paged key index of a namespace (`docs/redis.md`, "Key index"): `dir` the sorted set
/// of its page fences, `pfx` the name of a page less its fence. A page holds the keys from
/// its fence (the first page's is empty, and in the directory too while any key is listed,
/// so that the directory exists whenever pages do: a script naming a key that does not
/// exist fails while a cluster migrates its slot) to the next fence; every score is 0, so
/// pages and directory are read by lex range. A page holds at most `max` keys (Redis'
/// `zset-max-listpack-entries`), so it stays in the compact listpack encoding. Lua compares
/// strings with the locale's `strcoll`, not byte by byte, so these functions never compare
/// keys themselves: Redis does (lex ranges).
pub(crate) const INDEX_LUA: &str = r#"
local function page_of(dir, m)
  return redis.call('ZREVRANGEBYLEX', dir, '[' .. m, '-', 'LIMIT', 0, 1)[1] or ''
end
local function list(dir, pfx, m)
  local f = page_of(dir, m)
  return redis.call('ZADD', pfx .. f, 'NX', 0, m) == 1, f
end
local function unlist(dir, pfx, m)
  local f = page_of(dir, m)
  local k = pfx .. f
  if redis.call('ZREM', k, m) == 0 then
    return false
  end
  if redis.call('EXISTS', k) == 0 then
    if f ~= '' then
      redis.call('ZREM', dir, f)
    end
    if redis.call('ZCARD', dir) <= 1 and redis.call('EXISTS', pfx) == 0 then
      -- The index is empty: no directory either.
      redis.call('DEL', dir)
    end
  end
  return true
end
-- Before listing keys: the directory holds the first page's fence (empty) whenever a key
-- is listed, so that it exists whenever pages do.
local function open_dir(dir)
  redis.call('ZADD', dir, 'NX', 0, '')
end
local function next_fence(dir, f, max)
  return redis.call('ZRANGEBYLEX', dir, '(' .. f, max or '+', 'LIMIT', 0, 1)[1]
end
local function split(dir, pfx, f, max)
  local k = pfx .. f
  if redis.call('ZCARD', k) <= max then
    return
  end
  -- Only the page's own range: a split stopped part-way may have left keys past the next
  -- fence here (they are in the next page too, and reads never look past it).
  local nf = next_fence(dir, f)
  local all = redis.call('ZRANGEBYLEX', k, '-', nf and ('(' .. nf) or '+')
  local n = #all
  if n <= max then
    if nf then
      redis.call('ZREMRANGEBYLEX', k, '[' .. nf, '+')
    end
    return
  end
  -- Near-equal pages of at most 3/4 of the size each, so that they take new keys.
  local size = math.max(1, math.floor(max * 3 / 4))
  size = math.ceil(n / math.ceil(n / size))
  local function fill(name, first)
    redis.call('DEL', name)
    local add = {}
    for j = first, math.min(n, first + size - 1) do
      add[#add + 1] = 0
      add[#add + 1] = all[j]
    end
    redis.call('ZADD', name, unpack(add))
  end
  -- Every step that can fail (a key of a slot being migrated) comes before any that
  -- changes what reads see: the new pages and the first one's fresh copy (fresh keys, so
  -- listpacks again), then the fences, then the copy replaces the page at once.
  for first = size + 1, n, size do
    fill(pfx .. all[first], first)
  end
  local copy = k .. '\0'
  fill(copy, 1)
  for first = size + 1, n, size do
    redis.call('ZADD', dir, 0, all[first])
  end
  redis.call('RENAME', copy, k)
end
-- Lists keys one by one (`add(m)` answers whether `m` was not listed), then splits every
-- page that took a key and grew past `max` (`done()`).
local function adder(dir, pfx, max)
  local touched, seen = {}, {}
  local function add(m)
    local new, f = list(dir, pfx, m)
    if new and not seen[f] then
      seen[f] = true
      touched[#touched + 1] = f
    end
    return new
  end
  local function done()
    for _, f in ipairs(touched) do
      split(dir, pfx, f, max)
    end
  end
  return add, done
end
"#;

const APPLY_LUA: &str = r#"
local a = ARGV
local function incr(k, f, n)
  local r = redis.pcall('HINCRBY', k, f, n)
  if type(r) == 'table' and r.err then
    if not string.find(r.err, 'overflow', 1, true) then
      error(r)
    end
    redis.call('HSET', k, f, wrapping_add(redis.call('HGET', k, f), n))
  end
end
local e = tonumber(a[7])
local i = 8 + 3 * e
local eps = {}
if e > 0 then
  -- The process (a restart) and its replication history (a promotion, failback included).
  local info = redis.call('INFO', 'server', 'replication')
  local id = (string.match(info, 'run_id:(%x+)') or '') .. '.'
    .. (string.match(info, 'master_replid:(%x+)') or '')
  local stale = false
  for j = 0, e - 1 do
    local tk = KEYS[tonumber(a[8 + 3 * j])]
    redis.call('SET', tk, a[9 + 3 * j], 'NX')
    eps[#eps + 1] = id .. ':' .. redis.call('GET', tk)
    local want = a[10 + 3 * j]
    if want ~= '-' and want ~= eps[#eps] then
      stale = true
    end
  end
  if stale then
    return {'stale', unpack(eps)}
  end
end
-- What an existing marker says: nil if there is none (or it ended by the store's clock).
local function marked()
  if a[1] == '0' then
    return nil
  end
  local v = redis.call('GET', KEYS[1])
  if not v then
    return nil
  end
  local token, ends = string.match(v, '^(.*)@(%d+)$')
  if ends and tonumber(ends) <= tonumber(a[4]) then
    return nil
  elseif a[2] == '-' or (token or v) == a[2] then
    return 'done'
  end
  return 'claimed'
end
if a[5] ~= '0' and redis.call('GET', KEYS[tonumber(a[5])]) ~= a[6] then
  return {marked() or 'fenced', unpack(eps)}
end
if a[1] ~= '0' then
  local m = marked()
  if m then
    return {m, unpack(eps)}
  end
  redis.call('SET', KEYS[1], a[2] .. '@' .. a[3], 'EX', a[1])
end
local n = #a
while i <= n do
  local op = a[i]
  if op == 'h' then
    local k = KEYS[tonumber(a[i + 1])]
    local exp = a[i + 2]
    local c = tonumber(a[i + 3])
    i = i + 4
    local before = -1
    if exp ~= '0' then
      before = redis.call('EXPIRETIME', k)
    end
    for _ = 1, c do
      incr(k, a[i], a[i + 1])
      i = i + 2
    end
    if exp ~= '0' and (before == -2 or (before >= 0 and tonumber(exp) > before)) then
      redis.call('EXPIREAT', k, exp)
    end
  elseif op == 'i' then
    local dir = KEYS[tonumber(a[i + 1])]
    local ex = KEYS[tonumber(a[i + 2])]
    local pfx = a[i + 3]
    local max = tonumber(a[i + 4])
    local now, prune = a[i + 5], a[i + 6]
    local c = tonumber(a[i + 7])
    i = i + 8
    open_dir(dir)
    local add, done = adder(dir, pfx, max)
    local grow, gone = {}, {}
    local function flush(force)
      if #grow >= 512 or (force and #grow > 0) then
        redis.call('ZADD', ex, 'GT', unpack(grow))
        grow = {}
      end
      if #gone >= 256 or (force and #gone > 0) then
        redis.call('ZREM', ex, unpack(gone))
        gone = {}
      end
    end
    for _ = 1, c do
      local m, e = a[i], a[i + 1]
      local new = add(m)
      if e == 'inf' then
        gone[#gone + 1] = m
      elseif new or redis.call('ZSCORE', ex, m) then
        -- Listed without an expiry: a `forever` tier held it, and data of that time may
        -- still show (the tier made finite, or removed with a finer tier still keeping
        -- older buckets); it stays unexpiring, as the `+inf` score of layout 1 did.
        grow[#grow + 1] = e
        grow[#grow + 1] = m
      end
      i = i + 2
      flush(false)
    end
    flush(true)
    done()
    for _, m in ipairs(redis.call('ZRANGEBYSCORE', ex, '-inf', now, 'LIMIT', 0, prune)) do
      unlist(dir, pfx, m)
      redis.call('ZREM', ex, m)
    end
  elseif op == 'x' then
    local k = KEYS[tonumber(a[i + 1])]
    local c = tonumber(a[i + 2])
    i = i + 3
    for _ = 1, c do
      local f, lo, hi = a[i], tonumber(a[i + 1]), tonumber(a[i + 2])
      local cur = redis.call('HGET', k, f)
      if not cur then
        redis.call('HSET', k, f, string.format('%d:%d', lo, hi))
      else
        -- A value not in this form is left as it is (a read refuses it), never narrowed.
        local l, h = string.match(cur, '^(%-?%d+):(%-?%d+)$')
        if l then
          l, h = tonumber(l), tonumber(h)
          if lo < l or hi > h then
            redis.call('HSET', k, f, string.format('%d:%d', math.min(lo, l), math.max(hi, h)))
          end
        end
      end
      i = i + 3
    end
  elseif op == 'r' then
    redis.call('SET', KEYS[tonumber(a[i + 1])], a[i + 2], 'NX', 'EXAT', a[i + 3])
    i = i + 4
  else
    return redis.error_reply('tally apply: unknown operation ' .. tostring(op))
  end
end
return {'applied', unpack(eps)}
"#;

/// Extends key index expiries after a tier's retention grew: `KEYS[1]` the index's
/// directory, `KEYS[2]` the expiry index, `ARGV[1]` the page prefix, `ARGV[2]` the page size, then pairs of member and its new
/// expiry, or `inf` (a `forever` tier holds it now). A member no longer listed (pruned under
/// the shorter retention while its data was still there) is listed again, with that expiry
/// (none for `inf`); a listed member without an expiry is left alone (it is unexpiring
/// already); otherwise an expiry only grows (`ZADD GT`) and `inf` takes the member out.
pub static EXTEND_INDEX: LazyLock<Script> = LazyLock::new(|| with_index(EXTEND_INDEX_LUA));

const EXTEND_INDEX_LUA: &str = r#"
local dir, ex = KEYS[1], KEYS[2]
local pfx, max = ARGV[1], tonumber(ARGV[2])
open_dir(dir)
local add, done = adder(dir, pfx, max)
for i = 3, #ARGV, 2 do
  local m, e = ARGV[i], ARGV[i + 1]
  if add(m) then
    if e ~= 'inf' then
      redis.call('ZADD', ex, e, m)
    end
  elseif redis.call('ZSCORE', ex, m) then
    if e == 'inf' then
      redis.call('ZREM', ex, m)
    else
      redis.call('ZADD', ex, 'GT', e, m)
    end
  end
end
done()
return 1
"#;

/// Counts a new idempotency answer against a bound: `KEYS[1]` the hash of answers stored per
/// hour ([`crate::layout::answers_key`]), `KEYS[2]` (optional) the key's mark that it is
/// counted; `ARGV` the hour now, the bound, when the hash expires, when the mark expires.
/// Hours before the last 25 are dropped (an answer lives 24 h, so they hold none).
/// Answers `-2` for a key counted already, `-1` once counted, else the count that fills the
/// bound (nothing counted).
pub static COUNT_ANSWER: LazyLock<Script> = LazyLock::new(|| Script::new(COUNT_ANSWER_LUA));

const COUNT_ANSWER_LUA: &str = r#"
if KEYS[2] and redis.call('EXISTS', KEYS[2]) == 1 then
  return -2
end
local h = tonumber(ARGV[1])
local all = redis.call('HGETALL', KEYS[1])
local sum = 0
for i = 1, #all, 2 do
  local at = tonumber(all[i])
  if at == nil or at < h - 24 then
    redis.call('HDEL', KEYS[1], all[i])
  else
    sum = sum + (tonumber(all[i + 1]) or 0)
  end
end
if sum >= tonumber(ARGV[2]) then
  return sum
end
redis.call('HINCRBY', KEYS[1], ARGV[1], 1)
redis.call('EXPIREAT', KEYS[1], ARGV[3])
if KEYS[2] then
  redis.call('SET', KEYS[2], '1', 'EXAT', ARGV[4])
end
return -1
"#;

/// The last bucket offset a window hash holds a field for, `-1` if none: `KEYS[1]` the
/// hash, `ARGV[1]` the highest offset. A small hash's fields are read whole; a large one
/// (a busy series' subtotals) is probed for totals from the top down first.
pub static LAST_OFFSET: LazyLock<Script> = LazyLock::new(|| Script::new(LAST_OFFSET_LUA));

const LAST_OFFSET_LUA: &str = r#"
local n = redis.call('HLEN', KEYS[1])
if n == 0 then
  return -1
end
if n > 256 then
  for o = tonumber(ARGV[1]), 0, -1 do
    if redis.call('HEXISTS', KEYS[1], tostring(o)) == 1 then
      return o
    end
  end
end
local best = -1
for _, f in ipairs(redis.call('HKEYS', KEYS[1])) do
  local o = tonumber(string.match(f, '^%d+'))
  if o and o > best then
    best = o
  end
end
return best
"#;

/// Removes keys whose every bucket has expired from a namespace's index: `KEYS[1]` the
/// index's directory, `KEYS[2]` the expiry index, `ARGV[1]` now, `ARGV[2]` at most how
/// many, `ARGV[3]` the page prefix. Answers how many it removed.
/// Atomic, so a key written meanwhile (its expiry raised) is never lost. A page left empty
/// is gone (Redis deletes an empty key), and so is its fence.
pub static PRUNE: LazyLock<Script> = LazyLock::new(|| with_index(PRUNE_LUA));

const PRUNE_LUA: &str = r#"
local dir, ex = KEYS[1], KEYS[2]
local gone = redis.call('ZRANGEBYSCORE', ex, '-inf', ARGV[1], 'LIMIT', 0, ARGV[2])
for _, m in ipairs(gone) do
  unlist(dir, ARGV[3], m)
  redis.call('ZREM', ex, m)
end
return #gone
"#;

/// One page of a namespace's keys in byte order: `KEYS[1]` the index's directory, `ARGV[1]`
/// the page prefix, `ARGV[2]` and `ARGV[3]` the `ZRANGEBYLEX` bounds, `ARGV[4]` at most how
/// many. Each page is read only up to the next fence.
pub static KEY_PAGE: LazyLock<Script> = LazyLock::new(|| with_index(KEY_PAGE_LUA));

const KEY_PAGE_LUA: &str = r#"
local dir = KEYS[1]
local pfx, min, max, limit = ARGV[1], ARGV[2], ARGV[3], tonumber(ARGV[4])
local f = ''
if min ~= '-' then
  f = page_of(dir, string.sub(min, 2))
end
local out = {}
while true do
  local nf = next_fence(dir, f, max)
  local got = redis.call('ZRANGEBYLEX', pfx .. f, min, nf and ('(' .. nf) or max, 'LIMIT', 0,
    limit - #out)
  for _, m in ipairs(got) do
    out[#out + 1] = m
  end
  if #out >= limit or not nf then
    break
  end
  f = nf
end
return out
"#;

/// Moves up to `ARGV[3]` keys from a namespace's index of layout 4 (`KEYS[2]`, a sorted set
/// of every key) into its paged index (`KEYS[1]` the directory, `ARGV[1]` the page prefix,
/// `ARGV[2]` the page size), removing them from the old one; answers how many it moved. The
/// old set is gone (empty) once every key has moved.
pub static MIGRATE_INDEX: LazyLock<Script> = LazyLock::new(|| with_index(MIGRATE_INDEX_LUA));

const MIGRATE_INDEX_LUA: &str = r#"
local dir, old = KEYS[1], KEYS[2]
local pfx, max = ARGV[1], tonumber(ARGV[2])
local ms = redis.call('ZRANGE', old, 0, tonumber(ARGV[3]) - 1)
if #ms > 0 then
  open_dir(dir)
end
local add, done = adder(dir, pfx, max)
for _, m in ipairs(ms) do
  add(m)
  redis.call('ZREM', old, m)
end
done()
return #ms
"#;

/// The counts of one or more series over a range, for `scan`: `ARGV[1]` the number `s` of
/// suffixes, then the `s` suffixes that make a bucket's offset its fields (`""`: the total;
/// `:<sgen>:<dim>:<value>` and `.<code>:<value>`: one subtotal's two forms), then the number
/// `w` of windows a series' range touches, then per window its first and last bucket offset
/// (the same for every series of a scan); `KEYS` the window hashes, `w` per series, series
/// after series (all in one slot in a cluster). One `HMGET` per window hash.
/// Answers, per series, the counts found (the caller sums them exactly, in 64 bits: Lua's
/// numbers are doubles).
pub static COUNTS: LazyLock<Script> = LazyLock::new(|| Script::new(COUNTS_LUA));

const COUNTS_LUA: &str = r#"
local ns = tonumber(ARGV[1])
local w = tonumber(ARGV[2 + ns])
-- The fields of each window, the same for every series: named once per call.
local fields = {}
for j = 1, w do
  local lo = tonumber(ARGV[1 + ns + 2 * j])
  local hi = tonumber(ARGV[2 + ns + 2 * j])
  local f = {}
  for o = lo, hi do
    for x = 2, 1 + ns do
      f[#f + 1] = o .. ARGV[x]
    end
  end
  fields[j] = f
end
local out = {}
for s = 0, #KEYS / w - 1 do
  local got = {}
  for j = 1, w do
    local xs = redis.call('HMGET', KEYS[s * w + j], unpack(fields[j]))
    for _, x in ipairs(xs) do
      if x then
        got[#got + 1] = x
      end
    end
  end
  out[#out + 1] = got
end
return out
"#;

/// One series' windows, read at one moment (a script is atomic): `KEYS` the window hashes
/// (one slot), `ARGV[1]` what to read — `all` (every field), `totals`, or `value` — then
/// `ARGV[2]` and `ARGV[3]` a value's field suffixes (`:<sgen>:<dim>:<value>` and
/// `.<code>:<value>`; empty: none), then per window its first and last bucket offset. Answers per window a flat list of fields and counts: every
/// field for `all`; for `totals` and `value`, every field of a small hash (at most 128, the
/// listpack limit, where `HGETALL` is cheaper than naming fields) and otherwise only the
/// wanted ones (`HMGET`): a busy series' hour hash holds thousands of subtotals a series
/// read does not want. The caller keeps what it asked for.
pub static READ: LazyLock<Script> = LazyLock::new(|| Script::new(READ_LUA));

const READ_LUA: &str = r#"
local mode = ARGV[1]
local suffixes = {}
for x = 2, 3 do
  if ARGV[x] ~= '' then
    suffixes[#suffixes + 1] = ARGV[x]
  end
end
local out = {}
for j = 1, #KEYS do
  local k = KEYS[j]
  if mode == 'all' or redis.call('HLEN', k) <= 128 then
    out[j] = redis.call('HGETALL', k)
  else
    local lo = tonumber(ARGV[2 + 2 * j])
    local hi = tonumber(ARGV[3 + 2 * j])
    local fields = {}
    for o = lo, hi do
      fields[#fields + 1] = tostring(o)
      if mode == 'value' then
        for _, sfx in ipairs(suffixes) do
          fields[#fields + 1] = o .. sfx
        end
      end
    end
    local xs = redis.call('HMGET', k, unpack(fields))
    local got = {}
    for i, x in ipairs(xs) do
      if x then
        got[#got + 1] = fields[i]
        got[#got + 1] = x
      end
    end
    out[j] = got
  end
end
return out
"#;

/// Replaces a namespace's schema record if it is still what the caller read: `KEYS[1]` the
/// schemas hash, `ARGV` the namespace, the record read (empty: none) and the new one.
/// Answers 1, or 0 if another writer changed it first (the caller reads again and retries).
pub static PUT_SCHEMA: LazyLock<Script> = LazyLock::new(|| Script::new(PUT_SCHEMA_LUA));

pub(crate) const PUT_SCHEMA_LUA: &str = r#"
local cur = redis.call('HGET', KEYS[1], ARGV[1])
if (cur or '') ~= ARGV[2] then
  return 0
end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[3])
return 1
"#;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::RedisServer;

    /// The script's 64-bit sum against Rust's `wrapping_add`, at the edges and on random
    /// pairs.
    #[test]
    fn lua_wrapping_add_is_rust_s() {
        let server = RedisServer::start();
        let client = redis::Client::open(server.url()).unwrap();
        let mut c = client.get_connection().unwrap();
        let script = Script::new(&format!(
            "{WRAPPING_ADD_LUA}return wrapping_add(ARGV[1], ARGV[2])"
        ));
        let edges = [
            0,
            1,
            -1,
            2,
            (1 << 32) - 1,
            1 << 32,
            -(1 << 32),
            (1 << 53) - 1,
            -((1 << 53) - 1),
            i64::MAX,
            i64::MAX - 1,
            i64::MIN,
            i64::MIN + 1,
            1_000_000_007,
        ];
        let mut pairs: Vec<(i64, i64)> = edges
            .iter()
            .flat_map(|&x| edges.iter().map(move |&y| (x, y)))
            .collect();
        let mut seed = 0x9e37_79b9_7f4a_7c15_u64;
        for _ in 0..500 {
            let mut next = || {
                seed ^= seed << 13;
                seed ^= seed >> 7;
                seed ^= seed << 17;
                seed as i64
            };
            pairs.push((next(), next()));
        }
        for (x, y) in pairs {
            let got: String = script.arg(x).arg(y).invoke(&mut c).unwrap();
            assert_eq!(got, x.wrapping_add(y).to_string(), "{x} + {y}");
        }
    }
}
