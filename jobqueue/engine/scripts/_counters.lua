--[[ _counters: what the metrics read, counted as transitions happen: outcome totals (meta's
n_<state>, a HASH the caller passes), per-minute counts and the run-duration histogram.
  base:m:<minute>   HASH  outcomes per minute (succeeded, dead, cancelled, expired, failed), kept
                          2 hours
  base:hist         HASH  run durations for the metrics: count per bucket (ms upper bound or
                          +Inf), sum_ms
Each counts at once (HINCRBY), or into `tallies`, a table the caller gives while it records a
batch (ack_jobs, _ack.lua), written once per field when the batch ends (flush_tally).
]]

-- Add `n` to a counter (a hash field; `ttl` s: the key's expiry, set as it is made), or to its
-- sum in `tallies`.
local function tally(key, field, n, ttl, tallies)
  if tallies then
    local slot = key .. '\n' .. field
    local t = tallies[slot]
    if t then t[3] = t[3] + n else tallies[slot] = {key, field, n, ttl} end
    return
  end
  if redis.call('HINCRBY', key, field, n) == n and ttl then redis.call('EXPIRE', key, ttl) end
end

-- Write the sums a batch gathered in `tallies`, once per field.
-- uses: tally
local function flush_tally(tallies)
  for _, t in pairs(tallies) do tally(t[1], t[2], t[3], t[4]) end
end

-- Count an outcome in this minute's bucket (the dashboard's charts, kept two hours).
-- uses: tally
local function count_minute(base, now, what, tallies)
  tally(base .. ':m:' .. math.floor(now / 60000), what, 1, 7200, tallies)
end

-- A run's duration into the shard's histogram (Prometheus' jobqueue_job_duration_seconds).
local DURATION_BUCKETS = {5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000, 10000, 30000, 60000,
  300000}
-- uses: count_field, DURATION_BUCKETS, tally
local function observe(base, started, now, tallies)
  local ms = count_field(started)
  if not ms then return end
  ms = math.max(now - ms, 0)
  local le = '+Inf'
  for _, bound in ipairs(DURATION_BUCKETS) do
    if ms <= bound then le = tostring(bound); break end
  end
  tally(base .. ':hist', le, 1, nil, tallies)
  tally(base .. ':hist', 'sum_ms', ms, nil, tallies)
end
