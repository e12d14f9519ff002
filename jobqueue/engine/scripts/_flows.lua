--[[ _flows: a flow's edges member -> dependent, walked as a member finishes (member_done, from
finish in _finish.lua), delivered from another shard (deliver.lua), or released by an operator's
retry (retry.lua).
  base:waiting      SET   jobs waiting for their dependencies (state 'waiting')
  base:deps:<id>    SET   a waiting job's members not yet done
  base:results:<id> HASH  a waiting job's members' outcomes by slot (JSON: a result, or an
                          error object for a member that failed under 'ignore' / 'continue')
  base:outcomes     STREAM "member done" for dependents on other shards of the queue or on
                          another queue's shards, until a relay delivers them (deliver.lua,
                          relay.py): each entry a `shard` and a `pack`, the outcomes one script
                          call sent to that shard (JSON: a list of [dep, slot, policy, member,
                          state, value, token]); `shard` is the index of the queue's other
                          shard, or '<queue>#<index>' for a shard of another queue (no queue
                          name holds '#', so neither is taken for the other)
  base:forward      STREAM the same, one outcome an entry in fields of its own (dep, shard,
                          slot, policy, member, state, value, token): written by workers of an
                          earlier version only (during a rolling upgrade), still relayed
A released job goes on its lane and base:ring, and wakes a worker through base:wake
(_lanes.lua), or straight to an idle worker (base:idle, base:hand:<name>, base:active:
_handoff.lua); a job that comes back waiting writes its event in base:done (STREAM) and keeps
its flow's index base:flow:<id> (ZSET a flow's jobs on this shard -> their position in it: the
console's flow page merges every shard's) for good again.
]]

-- A payload with `arg` (JSON text) as its first argument: spliced into its own (top-level) args,
-- or given args of its own when it has none (a step of kwargs only). The scan for its args jumps
-- from one string or bracket to the next (string.find skips the rest), so a key named "args"
-- inside a kwarg, or the text of a string, is never taken for them. A payload that is no JSON
-- object stays as it is (the worker that claims it says what is wrong with it). (One function:
-- the acks and claims that carry it define it at every call, and only a release runs it.)
local function with_first_arg(payload, arg)
  local depth, at, b = 0, 1, nil
  while not b do
    local s, _, c = string.find(payload, '(["{}%[%]])', at)
    if not s then break end
    if c == '"' then
      local e = s + 1
      while true do  -- to the string's closing quote, over its escapes
        local q = string.find(payload, '["\\]', e)
        if not q then return payload end
        if string.byte(payload, q) == 92 then e = q + 2 else e = q; break end
      end
      at = e + 1
      if depth == 1 and e - s == 5 and string.sub(payload, s + 1, e - 1) == 'args' then
        b = select(2, string.find(payload, '^%s*:%s*%[', at))
      end
    else
      depth = depth + ((c == '{' or c == '[') and 1 or -1)
      at = s + 1
    end
  end
  if not b then
    local rest = string.match(payload, '^%s*{(.*)$')
    if not rest then return payload end
    return '{"args":[' .. arg .. ']' .. (string.find(rest, '^%s*}') and '' or ',') .. rest
  end
  local rest = string.sub(payload, b + 1)
  if string.find(rest, '^%s*]') then return string.sub(payload, 1, b) .. arg .. rest end
  return string.sub(payload, 1, b) .. arg .. ',' .. rest
end

-- A chord's callback reads its members' outcomes in HMGETs of so many fields (unpack's bound).
local SLOTS_AT_ONCE = 1000

-- A waiting job whose dependencies are done becomes pending: its members' outcomes go in as its
-- first argument ('first': the one slot, a chain's step; 'list': every slot in order, a
-- chord's callback), and its flow keys go; it goes straight to an idle worker of its shard when
-- one waits (hand_released in _handoff.lua: no wake token, no claim call). (Also an operator's
-- retry of a job cancelled while it waited, once its members are done.)
-- uses: job_key, count_field, with_first_arg, make_ready, wake_workers, SLOTS_AT_ONCE
-- uses: hand_released
local function release_job(base, dep, now)
  local dk = job_key(base, dep)
  local row = redis.call('HMGET', dk, 'payload', 'takes', 'slots')
  local rk = base .. ':results:' .. dep
  local payload = row[1] or '{}'
  if row[2] == 'first' or row[2] == 'list' then
    local arg = redis.call('HGET', rk, '0') or 'null'
    if row[2] == 'list' then  -- (a HGET per slot cost twice as much)
      local parts, total = {}, count_field(row[3]) or 0
      for first = 0, total - 1, SLOTS_AT_ONCE do
        local names, last = {}, math.min(first + SLOTS_AT_ONCE, total) - 1
        for i = first, last do names[i - first + 1] = i end  -- (not #names: a third the cost)
        local values = redis.call('HMGET', rk, unpack(names))
        local whole, text = pcall(table.concat, values, ',')  -- (no loop over the values...)
        if not whole then  -- (...unless a slot is empty: false, which concat refuses)
          for i = 1, #names do values[i] = values[i] or 'null' end
          text = table.concat(values, ',')
        end
        parts[#parts + 1] = text
      end
      arg = '[' .. table.concat(parts, ',') .. ']'
    end
    payload = with_first_arg(payload, arg)
    redis.call('HSET', dk, 'payload', payload)
  end
  redis.call('HDEL', dk, 'takes', 'slots', 'blocked_by', 'waited', 'finished_at')
  redis.call('PERSIST', dk)
  redis.call('DEL', rk, base .. ':deps:' .. dep)
  redis.call('SREM', base .. ':waiting', dep)
  if not hand_released(base, dk, dep, payload, now) then
    make_ready(base, base .. ':ring', dk, dep, now)
    wake_workers(base .. ':wake', 1)
  end
end

-- A finished member's outcome as it goes in a dependent's slot: its result (JSON), or for a
-- member that failed an error object naming it (`err`: its last error when Valkey lacks its row).
-- uses: job_key
local function outcome_slot(base, id, state, result, err)
  if state == 'succeeded' then return result or 'null' end
  err = err or redis.call('HGET', job_key(base, id), 'last_error') or ''
  return cjson.encode({error = string.sub(err, -1000), state = state, job = id})
end


-- Outcomes being gathered for other shards: while `open` (a batch of acks: ack_jobs), forward
-- adds each to its target shard's pack, written as one entry a shard when the batch ends
-- (close_forwards); else each is written at once, a pack of one.
local PACKS = {open = false, by_shard = {}, order = {}}

-- A member finished and a job waiting on it lives on another shard (`shard`) of the queue, or on
-- a shard of another queue (`shard` '<queue>#<index>'): the outcome waits in this shard's
-- base:outcomes STREAM (written in the member's own script call, so it is as durable as the
-- outcome) until a relay delivers it there (deliver.lua) and deletes it. `token`: the member's
-- attempts when it ended (see fenced).
-- uses: PACKS
local function forward(base, dep, shard, index, policy, id, state, slot, token)
  local outcome = {dep, index, policy, id, state, slot, token or ''}
  if not PACKS.open then
    redis.call('XADD', base .. ':outcomes', '*', 'shard', shard, 'pack', cjson.encode({outcome}))
    return
  end
  local pack = PACKS.by_shard[shard]
  if not pack then
    pack = {}
    PACKS.by_shard[shard] = pack
    PACKS.order[#PACKS.order + 1] = shard
  end
  pack[#pack + 1] = outcome
end

-- Write the packs gathered since the batch opened (one entry a target shard, in the order the
-- shards were first met; each pack in the order its outcomes came), and write at once again.
-- uses: PACKS
local function close_forwards(base)
  for _, shard in ipairs(PACKS.order) do
    redis.call('XADD', base .. ':outcomes', '*', 'shard', shard, 'pack',
      cjson.encode(PACKS.by_shard[shard]))
  end
  PACKS.open, PACKS.by_shard, PACKS.order = false, {}, {}
end

-- Whether an outcome for slot `index` of a dependent (its results hash `rk`) is older than the
-- one applied last: `token` is the member's attempts when it ended (a fencing token that never
-- goes back: an operator's retry runs it as the next attempt), kept as field 't<slot>'. So a
-- relay that read an entry before another relay delivered it, and a retry's newer outcome after,
-- cannot deliver the old one over it. An outcome without one (a durable row's) is applied.
local function fenced(rk, index, token)
  local t = tonumber(token)
  if not t then return false end
  local seen = tonumber(redis.call('HGET', rk, 't' .. index))
  if seen and seen > t then return true end
  redis.call('HSET', rk, 't' .. index, t)
  return false
end


-- One edge member -> dependent, the dependent on this shard: it takes the member's outcome into
-- its slot and drops the member from its set of pending members (a set: a replayed finish or a
-- replayed delivery removes nothing twice, so it releases nothing twice); a job whose set
-- empties is released here. A member that failed (dead, cancelled, expired) cancels the job
-- under policy 'f' (fail), leaves an error object in the slot under 'i' (ignore), and releases
-- it at once under 'c' (continue); under 'f' it stays in the set, its slot marked failed
-- ('f<slot>' in the results hash, counted in 'failed'), until a retry of it succeeds. A job
-- cancelled while it waited (by an operator or by a member's failure: `waited`, or `blocked_by`
-- on a row written before it) keeps its sets, with its row's retention, and takes every outcome
-- still, so that a retry of it waits only for what is not done (retry.lua; a failure under 'c'
-- that reached it marks it 'go': it runs at once then). One a member's failure cancelled
-- (`blocked_by`) comes back once no failed member holds it (the member an operator retried has
-- succeeded): waiting again, its `done` event saying so (a durable row reopens with it, and a
-- restore brings it back waiting for what its members have not done: its payload is still the
-- one their outcomes have not been put into); an operator's cancel stays.
-- An outcome older than the slot's last (`token`: fenced) changes nothing. Returns 'cancel' when
-- the job is to be cancelled (the caller's finish() does, and so on down the flow), 'revived'
-- when it waits again (deliver.lua answers it per entry, so the relay claims from the job's
-- shard again if a resize retired it meanwhile), else false.
-- uses: job_key, fenced, release_job
local function edge_done(base, id, state, slot, dep, index, policy, now, retention_ms, token)
  local ok = state == 'succeeded'
  local dk, pending, rk = job_key(base, dep), base .. ':deps:' .. dep, base .. ':results:' .. dep
  local row = redis.call('HMGET', dk, 'state', 'blocked_by', 'waited', 'flow')
  local blocked = (row[2] or '') ~= ''
  local kept = row[1] == 'cancelled' and (row[3] == '1' or blocked)
  if (row[1] ~= 'waiting' and not kept) or fenced(rk, index, token) then return false end
  if not ok and policy == 'f' then
    if redis.call('HSETNX', rk, 'f' .. index, 1) == 1 then
      redis.call('HINCRBY', rk, 'failed', 1)
    end
    if not kept then
      redis.call('HSET', dk, 'last_error', 'dependency ' .. id .. ' ended ' .. state,
        'blocked_by', id, 'waited', '1')
      redis.call('SREM', base .. ':waiting', dep)
      if retention_ms and retention_ms > 0 then
        redis.call('PEXPIRE', pending, retention_ms)
        redis.call('PEXPIRE', rk, retention_ms)
      end
      return 'cancel'
    end
  else
    if redis.call('HDEL', rk, 'f' .. index) == 1 then redis.call('HINCRBY', rk, 'failed', -1) end
    redis.call('HSET', rk, index, slot)
    local removed = redis.call('SREM', pending, id) == 1
    local ready = (not ok and policy == 'c') or redis.call('SCARD', pending) == 0
    if not kept then
      if removed and ready then release_job(base, dep, now) end
      return false
    end
    if not ok and policy == 'c' then  -- (it runs at once when it comes back, or is retried)
      redis.call('HSET', rk, 'go', '1')
    end
    ready = ready or redis.call('HEXISTS', rk, 'go') == 1
    if blocked and (tonumber(redis.call('HGET', rk, 'failed')) or 0) <= 0 then  -- it comes back
      redis.call('HSET', dk, 'state', 'waiting')
      redis.call('HDEL', dk, 'blocked_by', 'waited', 'finished_at')
      redis.call('PERSIST', dk)
      redis.call('PERSIST', pending)
      redis.call('PERSIST', rk)
      if row[4] then redis.call('PERSIST', base .. ':flow:' .. row[4]) end
      redis.call('SADD', base .. ':waiting', dep)
      redis.call('XADD', base .. ':done', '*', 'id', dep, 'revived_at', now,
        unpack(redis.call('HGETALL', dk)))
      if ready then release_job(base, dep, now) end
      return 'revived'
    end
  end
  local ttl = redis.call('PTTL', dk)  -- (its sets go with its row)
  if ttl > 0 then
    redis.call('PEXPIRE', rk, ttl)
    redis.call('PEXPIRE', pending, ttl)
  end
  return false
end

-- Successes delivered for one job `dep` waiting on this shard (state 'waiting': not one kept
-- while cancelled), `run` = {member, slot, value, token} in the stream's order, applied as
-- edge_done applies each in turn but with a few calls for the whole run: the slots' tokens and
-- failure marks and the members' presence in its set read at once, the writes made at once. A
-- run whose slots hold a failure mark goes the one-by-one way (false: nothing done). Once an
-- entry empties its set, the job is released and the rest of the run finds it so (no-ops).
-- uses: release_job
local function successes_done(base, dep, run, now)
  local rk, pending = base .. ':results:' .. dep, base .. ':deps:' .. dep
  local tfields, ffields, ids = {}, {}, {}
  for i, e in ipairs(run) do
    tfields[i], ffields[i], ids[i] = 't' .. e[2], 'f' .. e[2], e[1]
  end
  local marks = redis.call('HMGET', rk, unpack(ffields))
  for i = 1, #run do
    if marks[i] then return false end
  end
  local seen = redis.call('HMGET', rk, unpack(tfields))
  local present = redis.call('SMISMEMBER', pending, unpack(ids))
  local left = redis.call('SCARD', pending)
  local tokens, writes, gone, drop = {}, {}, {}, {}
  local released = false
  for i, e in ipairs(run) do
    local slot, t = e[2], tonumber(e[4])
    local last = tokens[slot]
    if last == nil then last = tonumber(seen[i]) or false end
    if not (t and last and last > t) then  -- (else fenced: older than the slot's last)
      if t then tokens[slot] = t end
      writes[#writes + 1] = slot; writes[#writes + 1] = e[3]
      if present[i] == 1 and not gone[e[1]] then
        gone[e[1]] = true
        drop[#drop + 1] = e[1]
        left = left - 1
        if left == 0 then released = true; break end
      end
    end
  end
  for slot, t in pairs(tokens) do writes[#writes + 1] = 't' .. slot; writes[#writes + 1] = t end
  if #writes > 0 then redis.call('HSET', rk, unpack(writes)) end
  if #drop > 0 then redis.call('SREM', pending, unpack(drop)) end
  if released then release_job(base, dep, now) end
  return true
end

-- A member of a flow finished: each job waiting on it (`dependents`: '<id>:<slot>:<policy>' for
-- one on this shard, '<id>:<slot>:<policy>:<shard>' for one on another shard of the queue, or
-- of another queue: '<shard>' is then '<queue>#<index>', as in base:outcomes) has
-- the outcome applied here, in the member's own script call (edge_done), or forwarded to its
-- shard (forward). Returns the jobs of this shard to cancel, and how many outcomes it forwarded
-- (an ack's answer flags them, so the worker relays at once: relay.py). `err`: a failed
-- member's last error when its row is not in Valkey (a durable queue's restore); `token`: its
-- attempts, which a forwarded outcome carries to be fenced there (one applied here, in the
-- member's own call, cannot be stale: it needs no fence).
-- uses: outcome_slot, forward, edge_done
local function member_done(base, id, state, result, dependents, now, retention_ms, err, token)
  local doomed, sent = {}, 0
  local slot = outcome_slot(base, id, state, result, err)
  local edge = '(%w+):(%d+):(%a):?([%w%._%-#]*)'
  for dep, index, policy, shard in string.gmatch(dependents, edge) do
    if shard ~= '' then
      forward(base, dep, shard, index, policy, id, state, slot, token)
      sent = sent + 1
    elseif edge_done(base, id, state, slot, dep, index, policy, now, retention_ms) == 'cancel' then
      doomed[#doomed + 1] = dep
    end
  end
  return doomed, sent
end
