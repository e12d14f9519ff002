--[[ _keys: the names of a shard's keys that several scripts derive from the braced base key
they received in KEYS (so every key stays in the shard's slot): a row, a lane, a unique key.
  base:job:<id>     HASH  the job row
  base:pending      ZSET  the default lane; base:lane:<name> ZSET a named lane (id -> -priority)
  base:uniq:<key>   STRING unique_key -> id
  base:uniqs        SET   the unique keys whose job is live on this shard (a resize's settle
                          check reads it instead of scanning the keyspace)
The keys the other helper files derive are listed in their headers.
]]

local function job_key(base, id) return base .. ':job:' .. id end

local function uniq_key(base, unique) return base .. ':uniq:' .. unique end

local function uniqs_key(base) return base .. ':uniqs' end

-- The default lane ('') is `pending`; a named lane is `lane:<name>`.
local function lane_key(base, lane)
  if not lane or lane == '' then return base .. ':pending' end
  return base .. ':lane:' .. lane
end
