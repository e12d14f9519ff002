--[[ _handoff: a ready job handed straight to an idle worker of its shard, leased, with no claim
call: a lone new job (enqueue.lua) or a flow's job its last member released (release_job in
_flows.lua).
  base:idle         HASH  idle workers: name -> '<lease ms>:<1 = it overrides the job's lease>'
                          and ':<offer id>' (a job handed over carries it as `claim`, as a
                          claimed one its claim's id: release.lua hands back the jobs of a
                          wait whose reply was lost by it), each field expiring when the
                          worker's wait ends (handoff.py)
  base:hand:<name>  LIST  the jobs handed to that worker: '<id>|<lease ms>|<payload>', or
                          '<id>|<lease ms>:<run time limit ms>|<payload>'; its BLPOP takes them
  base:active       ZSET  id -> lease deadline ms (a job handed over is leased there)
Each idle entry takes one job. None is taken while other jobs are ready on the shard (a lane,
priority or weight could come first), while the queue is paused, or while a lane cap or a global
cap set live holds (only the claim counts slots and permits); a queue with lane caps or lane
rates in its settings has no idle entries (its workers never offer).
]]

-- An idle worker to hand a lone ready job to, its offer taken: {name, lease ms, overrides,
-- offer id ('' = none)}, or nil. `paused`, `caps`, `gcap`: those fields of the shard's meta.
local function idle_taker(idle, ring, paused, caps, gcap)
  if paused == '1' or caps == '1' or (gcap and gcap ~= '0') then return nil end
  local pick = redis.call('HRANDFIELD', idle, 1, 'WITHVALUES')
  if not pick[1] or redis.call('LLEN', ring) > 0 then return nil end
  redis.call('HDEL', idle, pick[1])
  local lease, force, id = string.match(pick[2], '^(%d+):([01])$')
  if not lease then lease, force, id = string.match(pick[2], '^(%d+):([01]):(%w+)$') end
  if not lease then return nil end
  return {pick[1], tonumber(lease), force == '1', id or ''}
end

-- The lease of a job handed to `taker`, as claim.lua leases one: its own (`lease_ms`, the row's
-- field: '<ms>' or '<ms>:<run time limit ms>') unless the worker's overrides it or it has none,
-- capped by its run time limit. Returns lease ms, limit ms (0: none).
-- uses: lease_field
local function hand_lease(taker, lease_ms)
  local lease, limit = lease_field(lease_ms)
  if taker[3] or lease <= 0 then lease = taker[2] end
  if limit > 0 then lease = math.min(lease, limit + 1000) end
  return lease, limit
end

-- Put a job leased to `taker` (its row written by the caller) on the worker's hand-off list,
-- which expires ten minutes after the lease: a worker that died before it took the job leaves
-- it there for the reaper, which hands it back uncharged (reap.lua).
local function hand_push(base, active, id, taker, lease, limit, payload, now)
  redis.call('ZADD', active, now + lease, id)
  local hand = base .. ':hand:' .. taker[1]
  local leased = limit > 0 and (lease .. ':' .. limit) or lease
  redis.call('RPUSH', hand, id .. '|' .. leased .. '|' .. payload)
  redis.call('PEXPIRE', hand, lease + 600000)
end

-- A job released to run (its row written, its lane not yet pushed) goes to an idle worker of
-- its shard when it is as a new job is: never started, not expiring (else the claim's checks
-- are due: a claim buries a corrupt row and expires one past its time), on a valid lane with a
-- valid priority. Returns true when it was handed over (the caller pushes no wake token).
-- uses: idle_taker, hand_lease, hand_push, valid_lane, valid_priority, lease_field
local function hand_released(base, jk, id, payload, now)
  local row = redis.call('HMGET', jk, 'attempts', 'uncharged', 'lease_ms', 'expires_at', 'lane',
    'priority')
  if (row[1] and row[1] ~= '0') or row[2] or not valid_lane(row[5] or '')
      or (row[6] and not valid_priority(row[6])) then
    return false
  end
  if row[4] and not (tonumber(row[4]) and tonumber(row[4]) > now) then return false end
  if not lease_field(row[3] or '0') then return false end
  local flags = redis.call('HMGET', base .. ':meta', 'paused', 'caps', 'gcap')
  local taker = idle_taker(base .. ':idle', base .. ':ring', flags[1], flags[2], flags[3])
  if not taker then return false end
  local lease, limit = hand_lease(taker, row[3] or '0')
  redis.call('HSET', jk, 'state', 'active', 'attempts', 1, 'run_after', now, 'started_at', now,
    'lease_until', now + lease, 'worker', taker[1])  -- (ready now, as make_ready says it)
  if taker[4] ~= '' then redis.call('HSET', jk, 'claim', taker[4]) end
  hand_push(base, base .. ':active', id, taker, lease, limit, payload, now)
  return true
end
