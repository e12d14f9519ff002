--[[ _ack: the successes of claimed jobs recorded, token-fenced: ack.lua records them alone,
claim.lua before it leases more (a worker's steady state). Touches what finish() touches
(_finish.lua) and frees the slots of lane caps (free_slot, _lanes.lua).
]]

-- Record successes of claimed jobs, token-fenced: acks[at] = n, then id, token, result (JSON)
-- per job (`acks`: the script's ARGV). Answers per job: 1 recorded succeeded, 3 recorded
-- cancelled (an operator flagged it), each plus 1 when it forwarded outcomes to dependents on
-- other shards (the worker relays them at once: relay.py), or 0 (stale: the lease was lost and
-- the job may have run again elsewhere); an ack this attempt's own ack recorded already (sent
-- again after its reply was lost) answers as that one did; and how many lanes held at their
-- cap came back on the ring (the caller wakes workers for them). `now`: the caller's clock
-- reading, if it has one. The counters of the batch are written once per field at its end.
-- uses: now_ms, job_key, free_slot, finish, flush_tally, PACKS, close_forwards
local function ack_jobs(base, active, done, meta, ring, retention, acks, at, now)
  local n = tonumber(acks[at])
  if n == 0 then return {}, 0 end  -- (an idle worker's claim brings none)
  now = now or now_ms()
  local out, back, tallies = {}, 0, {}
  PACKS.open = true  -- (the outcomes for other shards go out a pack a shard: close_forwards)
  local ok, err = pcall(function()
    for i = 0, n - 1 do
      local id, token, result = acks[at + 1 + i * 3], acks[at + 2 + i * 3], acks[at + 3 + i * 3]
      local jk = job_key(base, id)
      local row = redis.call('HMGET', jk, 'state', 'attempts', 'cancel', 'slot', 'lane')
      if row[1] == 'active' and row[2] == token then
        redis.call('ZREM', active, id)
        back = back + free_slot(base, ring, row[4], row[5])
        local cancelled = row[3] == '1'
        if cancelled then redis.call('HSET', jk, 'acked', token) end  -- (see below)
        local sent = finish(base, done, meta, jk, id, cancelled and 'cancelled' or 'succeeded', now,
          retention, result, true, tallies)
        out[#out + 1] = (cancelled and 3 or 1) + ((sent > 0) and 1 or 0)
      elseif row[2] == token and (row[1] == 'succeeded' or (row[1] == 'cancelled'
          and redis.call('HGET', jk, 'acked') == token)) then
        -- this very ack, sent again after its reply was lost: answered as it was (plus 1 when it
        -- forwarded to a dependent on another shard)
        local dependents = redis.call('HGET', jk, 'dependents')
        local sent = (dependents and string.find(dependents, '%w+:%d+:%a:%S')) and 1 or 0
        out[#out + 1] = ((row[1] == 'cancelled') and 3 or 1) + sent
      else
        out[#out + 1] = 0
      end
    end
  end)
  close_forwards(base)  -- (also after an error: what was recorded keeps its outcomes)
  if not ok then error(err) end
  flush_tally(tallies)
  return out, back
end
