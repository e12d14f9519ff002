--[[ permits: hold, renew or give back a holder's permits of a queue's global cap
(`global_concurrency`), kept in the cap's own slot (`emq:{q#cap}`: one slot whatever the number
of shards). A holder (one per claiming process and queue: `permits.Permits`) asks to hold `want`
permits from now on; it gets them as far as the cap has room beside the other holders', fewer
when the cap was lowered, but never fewer than the `floor` it runs jobs on (a lowered cap cannot
stop a running job: those end, and their permits go then). Permits are anonymous: the holder
maps them to its jobs itself, and claims on any shard at most as many jobs as it holds free.
A holder's permits lapse together at its deadline (server clock, `lease_ms` from this call), so
a dead worker's come back soon after its leases would end (the holder asks for 1.5 leases, or
its jobs' longest lease left): each call first takes back the lapsed.
KEYS[1] base    prefix  emq:{q#cap} (`keys.cap_keys`: the cap's slot); derives base:permits HASH
                        holder -> permits held, '' -> their total; base:holders ZSET holder ->
                        deadline ms (server clock); base:limit STRING the cap set live
                        (Queue.set_global_concurrency): n, or '0' = lifted live; absent = the
                        settings' cap holds
ARGV[1] holder          who holds ('<pid>:<random tag>': one per permits.Permits)
ARGV[2] want            permits to hold from now on (0 = give every one back)
ARGV[3] floor           permits it runs jobs on now: kept even above a lowered cap
ARGV[4] lease_ms        ms until the holder's permits lapse unless renewed
ARGV[5] given           the settings' cap (0 = none)
Returns: permits held now, the cap in force (0 = none: nothing held), the live setting ('' =
        none: the shards' `gcap` mark the claim compares), 1 when the holders hold more than
        the cap (it was lowered: a holder then keeps no permit a finished job frees), else 0
]]
-- uses: now_ms
local base = KEYS[1]
local permits, holders, limit = base .. ':permits', base .. ':holders', base .. ':limit'
local holder, want, floor = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
local lease_ms, given = tonumber(ARGV[4]), tonumber(ARGV[5])
local now = now_ms()
for _, lapsed in ipairs(redis.call('ZRANGEBYSCORE', holders, '-inf', now, 'LIMIT', 0, 100)) do
  local n = tonumber(redis.call('HGET', permits, lapsed)) or 0
  redis.call('HDEL', permits, lapsed)
  redis.call('ZREM', holders, lapsed)
  if n > 0 then redis.call('HINCRBY', permits, '', -n) end
end
local live = redis.call('GET', limit)
local cap = live and tonumber(live) or given
local mine = tonumber(redis.call('HGET', permits, holder)) or 0
local total = tonumber(redis.call('HGET', permits, '')) or 0
local grant = 0
if cap > 0 then
  -- (the others' permits stay theirs: this holder gets the room they leave, and keeps what it
  -- already runs jobs on)
  grant = math.max(math.min(want, cap - (total - mine)), math.min(floor, mine), 0)
end
if grant ~= mine then redis.call('HINCRBY', permits, '', grant - mine) end
if grant > 0 then
  redis.call('HSET', permits, holder, grant)
  redis.call('ZADD', holders, now + lease_ms, holder)
else
  redis.call('HDEL', permits, holder)
  redis.call('ZREM', holders, holder)
end
total = total - mine + grant
return {grant, cap, live or '', (cap > 0 and total > cap) and 1 or 0}
