--[[ _lanes: ready work and the ring of lanes that have it, wake tokens, and the tenant controls
that hold a lane off the ring. claim.lua takes lanes off the ring; whatever frees a slot or a
token puts them back, so the ring holds the lanes with ready work that are not held back, and
lanes that reached their cap since a claim last met them.
  base:pending      ZSET  the default lane; base:lane:<name> ZSET a named lane (id -> -priority)
  base:turns        HASH  turns a weighted lane has had in the ring's current round
  base:slots        HASH  lane -> its jobs active now that hold a slot of its cap (the claim marks
                          such a job's row `slot` = 1; the transition that ends the attempt frees
                          the slot once: the row's state and token fence it)
  base:capped       SET   lanes taken off the ring at their cap, with ready work
  base:rated        ZSET  lanes taken off the ring by their rate: lane -> ms their next token is due
The ring (LIST) and the wake tokens (LIST) come from the caller. Only claim.lua reads the limits
themselves: base:caps (HASH lane ('*': every named lane) -> its cap, set live by
set_lane_concurrency.lua), base:bucket and base:lbucket:<l> (a rate's token buckets).
]]

-- Whether a lane is held off the ring: at its cap (base:capped) or out of tokens (base:rated).
local function held(base, lane)
  return redis.call('SISMEMBER', base .. ':capped', lane) == 1
    or redis.call('ZSCORE', base .. ':rated', lane) ~= false
end

-- Put a job on its lane (score -priority: ZPOPMIN serves the highest priority, then the lowest
-- id, i.e. mint order) and keep the ring = exactly the lanes that have ready work and are not
-- held back by their cap or rate (a held lane always has ready work: `unready` lets go of one
-- it empties, so a lane that gets its first job here is never held).
-- uses: lane_key
local function lane_push(base, ring, id, lane, priority)
  local lk = lane_key(base, lane)
  if redis.call('ZADD', lk, -priority, id) == 1 and redis.call('ZCARD', lk) == 1 then
    redis.call('RPUSH', ring, lane)
  end
end

-- A lane no longer held back goes back on the ring if it has ready work (and is not held for
-- the other reason). Returns 1 when it did: the caller wakes a worker for it.
-- uses: lane_key, held
local function lane_back(base, ring, lane)
  if redis.call('ZCARD', lane_key(base, lane)) == 0 or held(base, lane) then return 0 end
  redis.call('RPUSH', ring, lane)
  return 1
end

-- Wake up to `n` blocked workers; the list is capped so idle queues do not accumulate tokens.
local function wake_workers(wake, n)
  if n <= 0 then return end
  local tokens = {}
  for i = 1, math.min(n, 16) do tokens[i] = '1' end
  if redis.call('RPUSH', wake, unpack(tokens)) > 16 then redis.call('LTRIM', wake, -16, -1) end
end

-- An attempt ends: if the claim counted it against its lane's cap (`slot` on the row), its slot
-- is freed, once: every caller acts only for the attempt's own token while the row is active,
-- and moves the row out of `active` in the same call. (The field stays on the row: the claim
-- that leases the job again rewrites or drops it.) A lane held at its cap comes back on the
-- ring without `lane_back`'s checks, which its hold answers: it has ready work (`unready` lets
-- go of a held lane it empties), and it is held for its cap alone (a claim holds a lane for one
-- reason, and only a lane on the ring meets a claim). Returns 1 when it came back, so the
-- caller wakes a worker for it, once per call for all the slots it freed (one push, not one
-- per lane).
local function free_slot(base, ring, slot, lane)
  if slot ~= '1' then return 0 end
  lane = lane or ''
  local slots = base .. ':slots'
  if redis.call('HINCRBY', slots, lane, -1) <= 0 then redis.call('HDEL', slots, lane) end
  if redis.call('SREM', base .. ':capped', lane) == 0 then return 0 end
  redis.call('RPUSH', ring, lane)
  return 1
end

-- A job whose row already exists becomes pending, on its lane (lane_push). A corrupt lane or
-- priority puts it on the default lane, where the claim that pops it buries it with the reason.
-- uses: valid_lane, valid_priority, lane_push
local function make_ready(base, ring, jk, id, now)
  local row = redis.call('HMGET', jk, 'lane', 'priority')
  local lane, priority = row[1] or '', 0
  if not valid_lane(lane) then lane = '' end
  if valid_priority(row[2]) then priority = tonumber(row[2]) end
  redis.call('HSET', jk, 'state', 'pending', 'run_after', now)
  lane_push(base, ring, id, lane, priority)
end

-- Take a waiting job off its lane; an emptied lane leaves the ring, or stops being held back.
-- Returns the lane.
-- uses: lane_key
local function unready(base, ring, jk, id)
  local lane = redis.call('HGET', jk, 'lane') or ''
  local lk = lane_key(base, lane)
  if redis.call('ZREM', lk, id) == 1 and redis.call('ZCARD', lk) == 0 then
    redis.call('LREM', ring, 0, lane)
    redis.call('HDEL', base .. ':turns', lane)
    redis.call('SREM', base .. ':capped', lane)
    redis.call('ZREM', base .. ':rated', lane)
  end
  return lane
end
