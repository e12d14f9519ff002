--[[ nack_many: record the failed runs of many claimed jobs (a batch's: worker/batches.py) in
one call, each as nack.lua records one (its own token fences it; its own max_attempts and
backoff, else the queue's), the counters written once per field at the end.
KEYS[1] base      prefix  emq:{q}; the keys nack.lua derives from it: the rows (base:job:<id>),
                          lanes and their caps (base:pending, base:lane:<l>, base:slots,
                          base:capped, base:rated), what a finish writes (base:hist,
                          base:m:<minute>, base:uniq:<key>, base:uniqs, base:notify:<id>,
                          base:flow:<id>, base:done) and tells dependents (base:deps:<id>,
                          base:results:<id>, base:outcomes, base:waiting), base:ring, base:wake
                          (a released dependent handed to an idle
                          worker: base:idle, base:hand:<name>;
                          _handoff.lua)
KEYS[2] active    ZSET    jobs leased: id -> lease deadline ms
KEYS[3] schedule  ZSET    retries waiting: id -> due ms
KEYS[4] dead      ZSET    dead jobs: id -> finished ms
KEYS[5] meta      HASH    the counters
ARGV[1] retention       ms a finished row is kept
ARGV[2] dead_retention  ms a dead row is kept
ARGV[3] max_attempts    the queue's max_attempts (for a row that holds none)
ARGV[4] backoff_ms      the queue's backoff ms (for a row that holds none)
ARGV[5..] jobs          n, then 5 per job: id, token, error, retry_ms (-1 = the job's backoff),
                        fatal ('1' = no retry)
Returns: per job what nack.lua returns for it
]]
-- uses: now_ms, wake_workers, nack_job, flush_tally
local base = KEYS[1]
local q = {base = base, active = KEYS[2], schedule = KEYS[3], dead = KEYS[4],
  done = base .. ':done', ring = base .. ':ring', meta = KEYS[5], retention = tonumber(ARGV[1]),
  dead_retention = tonumber(ARGV[2]), max_attempts = tonumber(ARGV[3]),
  backoff_ms = tonumber(ARGV[4]), now = now_ms(), tallies = {}}
local out, wakes = {}, 0
for i = 0, tonumber(ARGV[5]) - 1 do
  local at = 6 + i * 5
  local state, owed = nack_job(q, ARGV[at], ARGV[at + 1], ARGV[at + 2], tonumber(ARGV[at + 3]),
    ARGV[at + 4] == '1')
  out[#out + 1] = state
  wakes = wakes + owed
end
flush_tally(q.tallies)
wake_workers(base .. ':wake', wakes)
return out
